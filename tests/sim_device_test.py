"""Four worker processes on the simulated device (--device sim:0): the
controller places a "sim" job on them, the stages talk TCP with host
staging, the losses are bitwise those of the same job on the CPU in one
process, and each stage's host<->device traffic reaches the job's step
reports."""
import json
import os
import re
import subprocess
import tempfile
import urllib.request

from cluster import CLI_BIN, PLUGIN_DIR, Cluster, pb, small_spec, spec_from_json, steps_of

spec = small_spec(stages=4, steps=8, name="sim")
work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
spec_path = os.path.join(work, "job.json")
with open(spec_path, "w") as f:
    json.dump(spec, f)
metrics = os.path.join(work, "cpu.jsonl")
subprocess.run([CLI_BIN, "train", "--spec", spec_path, "--metrics_out", metrics,
                "--threads", "1", f"--plugin_dir={PLUGIN_DIR}"], check=True)
cpu_losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
assert len(cpu_losses) == 8, cpu_losses

cluster = Cluster(workers=4, device="sim:0", metrics=True)
sim_spec = dict(spec, device="sim")
job = cluster.submit(spec_from_json(sim_spec))
events = cluster.watch(job.job_id, timeout=180)
final = [e.state for e in events if e.WhichOneof("event") == "state"][-1]
assert final.state == pb.SUCCEEDED, (final, cluster.log("controller"))
steps = steps_of(events)
assert [s.loss for s in steps] == cpu_losses, ([s.loss for s in steps], cpu_losses)
notes = [e.note.text for e in events if e.WhichOneof("event") == "note"]
assert notes == ["transport: stages 0, 1, 2, 3 are on a simulated device: "
                 "using TCP with host staging"], notes
# Each worker counts its stage's host<->device traffic (Prometheus): one
# read of the step's numbers per step, and TCP stages every message
# through the host, each copy counted and waited for.
syncs = {}
for name in ("w0", "w1", "w2", "w3"):
    text = urllib.request.urlopen(cluster.metrics_url(name), timeout=10).read().decode()
    for line in text.splitlines():
        m = re.match(r'trainyard_worker_device_(syncs|copies)_total\{(.*)\} (\S+)', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = (m.group(1), int(labels["stage"]), labels.get("direction", ""))
            syncs[key] = float(m.group(3))
for stage in range(4):
    # 8 steps, each read once, plus the copies of its messages.
    assert syncs[("syncs", stage, "")] >= 8, (stage, syncs)
    assert syncs[("copies", stage, "to_host")] >= 8, (stage, syncs)
# 4 microbatches' activations leave stage 0 and reach stage 3 each step.
assert syncs[("copies", 0, "to_host")] >= 8 + 8 * 4, syncs
assert syncs[("copies", 3, "to_device")] >= 8 * 4, syncs
print(f"PASS: {len(steps)} steps on 4 sim workers bitwise equal to the CPU; "
      f"device traffic per worker: {sorted(syncs.items())}")
