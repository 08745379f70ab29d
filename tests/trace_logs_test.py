"""A 2-stage job on real worker processes: `trainyard trace` writes a step's
pipeline timeline as Chrome trace-event JSON built from the spans the stages
measured (every microbatch's forward and backward on both stages, inside
each stage's step), and `trainyard logs` prints the job's log lines from
both workers, each with its stage and worker in front."""
import json
import os
import re
import subprocess
import time

from cluster import CLI_BIN, Cluster, pb, small_spec, spec_from_json

STEPS = 8
MICROBATCHES = 4
start = time.time()

cluster = Cluster(workers=2)
spec = small_spec(stages=2, steps=STEPS, name="traced", features=64, batch=64,
                  microbatches=MICROBATCHES)
# Wide enough that every forward and backward takes measurable time.
for block in spec["model"]["blocks"][:-1]:
    block.update(outFeatures=128, ffnHiddenSize=512)
job = cluster.submit(spec_from_json(spec))
events = cluster.watch(job.job_id)
assert events[-1].state.state == pb.SUCCEEDED, events[-1]


def cli(*args, check=True):
    return subprocess.run([CLI_BIN, *args, *cluster.cli_flags()], check=check,
                          capture_output=True, text=True, timeout=30)


def load_trace(step):
    path = os.path.join(cluster.dir, f"step{step}.json")
    out = cli("trace", job.job_id, f"--step={step}", f"--out={path}")
    assert out.stdout.strip() == path, out.stdout
    with open(path) as f:
        return json.load(f)


# A step without an eval after it (evals follow steps 4 and 8).
doc = load_trace(5)
assert doc["otherData"]["job_id"] == job.job_id, doc["otherData"]
complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in complete} == {0, 1}, {e["pid"] for e in complete}
for pid in (0, 1):
    mine = [e for e in complete if e["pid"] == pid]
    names = {e["name"] for e in mine}
    for mb in range(MICROBATCHES):
        for action in ("F", "B", "W"):
            assert f"{action}{mb}" in names, (pid, action, mb, sorted(names))
    for e in mine:
        if e["name"][0] in "FBW" and e["name"][1:].isdigit():
            assert e["dur"] > 0, e
            assert e["args"]["microbatch"] == int(e["name"][1:]), e
    steps = [e for e in mine if e["cat"] == "step"]
    assert len(steps) == 1, steps
    step_us = steps[0]["dur"]
    spans = [e for e in mine if e["cat"] not in ("step", "eval")]
    busy = sum(e["dur"] for e in spans)
    assert 0 < busy <= step_us, (pid, busy, step_us)
    assert all(0 <= e["ts"] and e["ts"] + e["dur"] <= step_us for e in spans), pid
    # One after another, as the stage did them.
    spans.sort(key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(spans, spans[1:])), pid
    # The stage's neighbour traffic is there too.
    assert any(e["name"].startswith(">A" if pid == 0 else ">G") for e in mine), pid
lanes = {e["args"]["name"] for e in doc["traceEvents"]
         if e["ph"] == "M" and e["name"] == "thread_name"}
assert {"forward", "backward input", "recv wait (idle)", "optimizer"} <= lanes, lanes

# The eval after step 4 is a span of step 4 on both stages, after the step.
doc = load_trace(4)
for pid in (0, 1):
    mine = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
    step_us = [e["dur"] for e in mine if e["cat"] == "step"][0]
    evals = [e for e in mine if e["cat"] == "eval"]
    assert len(evals) == 1 and evals[0]["ts"] >= step_us, (pid, evals, step_us)

gone = cli("trace", job.job_id, "--step=999", check=False)
assert gone.returncode == 2, (gone.returncode, gone.stderr)
assert "step 999 is not held; steps 1..8 are" in gone.stderr, gone.stderr

# Logs: every worker's lines about the job, stage and worker in front.
out = cli("logs", job.job_id)
lines = out.stdout.splitlines()
prefix = re.compile(r"^\[stage ([01]) (w-\d+) (w[01])\] \d\d:\d\d:\d\d\.\d\d\d (.*)$")
seen = {}
for line in lines:
    m = prefix.match(line)
    assert m, line
    seen.setdefault(int(m.group(1)), []).append(m.group(4))
assert set(seen) == {0, 1}, lines
for stage, texts in seen.items():
    assert f"starting job {job.job_id} stage {stage} (attempt 0)" in texts, texts
    assert any(t.startswith(f"job {job.job_id} stage {stage} transport tcp")
               for t in texts), texts
    assert f"job {job.job_id} stage {stage} done" in texts, texts
# --follow on an ended job prints the same lines and ends.
followed = cli("logs", job.job_id, "--follow")
assert followed.stdout.splitlines() == lines, (followed.stdout, lines)

# The schedule simulated with the pass costs measured in the job's trace.
sim = cli("schedule", "--stages=2", "--microbatches=4", "--schedule=zbh1",
          f"--costs_from={job.job_id}")
first = sim.stdout.splitlines()[0]
m = re.match(r"costs from \S+ step (\d+) \(mean per microbatch over 2 "
             r"stage\(s\)\): F ([0-9.]+) ms, B ([0-9.]+) ms, W ([0-9.]+) ms", first)
assert m, sim.stdout[:500]
assert all(float(m.group(k)) > 0 for k in (2, 3, 4)), first
assert "bubble" in sim.stdout, sim.stdout[-500:]

elapsed = time.time() - start
assert elapsed < 60, elapsed
print(f"PASS: traces of steps 4 and 5 ({len(complete)} events in step 5) and "
      f"{len(lines)} log lines from 2 stages in {elapsed:.1f} s")
