"""A shard that changes while a job reads it fails the job, naming the file,
at the step that needs its rows (the read-ahead never hands on other rows),
and the checkpoints written before stay complete.

`trainyard train` runs a long shuffled job over four shard pairs; once it
has passed step 40 the test replaces x-00002.npy (a rename over it, as a
data pipeline republishing a shard would). Every batch of 64 shuffled rows
touches every shard, so the job must stop within a few steps, exit with an
error naming the file, and keep the checkpoints it had committed."""
import json
import os
import subprocess
import tempfile

import numpy as np

from cluster import CLI_BIN, PLUGIN_DIR

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
D, ROWS = 32, 2048

rng = np.random.default_rng(5)
for k in range(4):
    np.save(os.path.join(WORK, f"x-{k:05d}.npy"),
            rng.standard_normal((ROWS, D), dtype=np.float32))
    np.save(os.path.join(WORK, f"y-{k:05d}.npy"),
            rng.integers(0, 4, size=ROWS, dtype=np.int64))

ckpt = os.path.join(WORK, "ckpt")
spec = {
    "name": "changed-shard", "steps": 1000000, "seed": 3,
    "model": {"blocks": [{"outFeatures": 4, "ffnHiddenSize": 16}]},
    "optimizer": {"lr": 0.01},
    "task": {"plugin": "cross_entropy"},
    "data": {"train": {"npyShards": {"features": [os.path.join(WORK, "x-*.npy")],
                                     "targets": [os.path.join(WORK, "y-*.npy")]}},
             "batchSize": 64, "shuffle": True},
    "checkpoint": {"dir": ckpt, "every": 10, "keepLast": 3},
}
spec_path = os.path.join(WORK, "spec.json")
with open(spec_path, "w") as f:
    json.dump(spec, f)

proc = subprocess.Popen([CLI_BIN, "train", "--spec", spec_path, "--threads", "1",
                         f"--plugin_dir={PLUGIN_DIR}"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
changed_at = None
last_step = 0
for line in proc.stdout:
    rec = json.loads(line)
    if "step" in rec and "loss" in rec:
        last_step = rec["step"]
    if changed_at is None and last_step >= 40:
        replacement = os.path.join(WORK, "replacement.npy")
        np.save(replacement, np.zeros((ROWS, D), dtype=np.float32))
        os.replace(replacement, os.path.join(WORK, "x-00002.npy"))
        changed_at = last_step
err = proc.stderr.read()
code = proc.wait(timeout=60)
assert changed_at is not None, f"the job ended before step 40: {err[-2000:]}"
assert code != 0, "the job went on over a changed shard"
assert "x-00002.npy" in err and "changed since the job opened it" in err, err[-2000:]
# The read-ahead holds at most a few batches read before the change.
assert last_step < changed_at + 8, (changed_at, last_step)
steps = sorted(int(n[len("step_"):]) for n in os.listdir(ckpt) if n.startswith("step_"))
complete = [s for s in steps
            if os.path.exists(os.path.join(ckpt, f"step_{s:08d}", "manifest.json"))]
# Every checkpoint saved before the change is kept. A checkpoint's commit is
# queued once every stage's file is on disk (at the latest when the next
# one is due), and a failing stage still runs it; the newest, whose file may
# not have been counted yet, can be left uncommitted: a folder without a
# manifest, which is no checkpoint.
assert complete and complete[-1] >= changed_at // 10 * 10 - 10, (changed_at, steps, complete)
assert complete == list(range(10, complete[-1] + 1, 10))[-3:], complete
print(f"PASS: changed after step {changed_at}, failed after step {last_step}; "
      f"checkpoints {steps}")
