"""A 4-stage job over 4 worker processes gives per-step losses (and eval
losses) bitwise equal to `trainyard train` of the same spec."""
import json
import os
import subprocess
import tempfile

from cluster import CLI_BIN, PLUGIN_DIR, Cluster, pb, small_spec, spec_from_json, steps_of

spec = small_spec(stages=4, steps=16, name="bitwise")
work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
spec_path = os.path.join(work, "job.json")
with open(spec_path, "w") as f:
    json.dump(spec, f)
metrics = os.path.join(work, "local.jsonl")
subprocess.run([CLI_BIN, "train", "--spec", spec_path, "--metrics_out", metrics,
                "--threads", "1", f"--plugin_dir={PLUGIN_DIR}"], check=True)
lines = [json.loads(l) for l in open(metrics)]
local_losses = [l["loss"] for l in lines if "loss" in l]
local_evals = [(l["step"], l["eval_loss"]) for l in lines if "eval_loss" in l]
assert len(local_losses) == 16, local_losses

cluster = Cluster(workers=4)
job = cluster.submit(spec_from_json(spec))
events = cluster.watch(job.job_id, timeout=180)
final = [e.state for e in events if e.WhichOneof("event") == "state"][-1]
assert final.state == pb.SUCCEEDED, (final, cluster.log("controller"))
steps = steps_of(events)
dist_losses = [s.loss for s in steps]
dist_evals = [(e.eval.step, e.eval.loss) for e in events if e.WhichOneof("event") == "eval"]
print("local      :", local_losses[:4], "...")
print("distributed:", dist_losses[:4], "...")
assert [s.step for s in steps] == list(range(1, 17)), [s.step for s in steps]
assert dist_losses == local_losses, "per-step losses differ"
assert dist_evals == local_evals, (dist_evals, local_evals)
# Every rank chose the transport from the placements in its assignment;
# the choice and its reason are in the job's history, once.
notes = [e.note.text for e in events if e.WhichOneof("event") == "note"]
assert notes == ["transport: every stage is on cpu: using TCP"], notes
stages_seen = {t.stage for s in steps for t in s.stages}
assert stages_seen == {0, 1, 2, 3}, stages_seen
job = cluster.get(job.job_id)
assert len(job.workers) == 4 and len(set(job.workers)) == 4, job.workers
# Per-stage times over the job's history, the measured bubble and the
# schedule's own.
out = subprocess.run([CLI_BIN, "get", job.job_id, "--stages",
                      *cluster.cli_flags()],
                     check=True, capture_output=True, text=True).stdout
print(out)
lines = out.splitlines()
assert lines[0] == (f"job {job.job_id}: 16 step(s); 4 stage(s), schedule 1f1b, "
                    "4 microbatch(es)"), lines[0]
rows = [l.split() for l in lines[2:6]]
assert [r[0] for r in rows] == ["0", "1", "2", "3"], rows
for r in rows:
    # stage data_wait_ms forward_ms ... optimizer_ms step_ms bubble syncs
    # copied_kib; only the first stage reads rows.
    assert float(r[1]) >= 0 and (r[0] == "0" or float(r[1]) == 0), r
    assert float(r[2]) > 0 and float(r[8]) > 0 and 0 <= float(r[9]) <= 1, r
    assert float(r[10]) == 0 and float(r[11]) == 0, r  # the CPU: no device
assert lines[6].startswith("measured bubble (mean over stages): "), lines[6]
# 1F1B, 4 stages, 4 microbatches, equal F/BI/BW costs.
assert lines[7].startswith("the schedule's own bubble: 0.333"), lines[7]
print(f"PASS: 16 steps bitwise equal across 4 worker processes; workers {list(job.workers)}")
