"""The controller writes every job's scalars as TensorBoard event files
under <data_dir>/tensorboard/<job_id>/; read back with the real tensorboard
package's event reader, they match the job's history (float32, TensorBoard's
scalar type), and `trainyard get` names the folder."""
import glob
import json
import os
import struct
import subprocess
import sys

from cluster import CLI_BIN, Cluster, pb, small_spec, spec_from_json

try:
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util
except ImportError:
    print("SKIP: tensorboard is not installed (tools/setup.sh installs it)")
    sys.exit(0)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


STEPS = 12
cluster = Cluster(workers=2)
job = cluster.submit(spec_from_json(small_spec(stages=2, steps=STEPS, name="tb")))
events = cluster.watch(job.job_id)
assert events[-1].state.state == pb.SUCCEEDED, events[-1]
steps = {e.step.step: e.step for e in events if e.WhichOneof("event") == "step"}
evals = {e.eval.step: e.eval for e in events if e.WhichOneof("event") == "eval"}
assert sorted(steps) == list(range(1, STEPS + 1)) and evals, (steps.keys(), evals)

got = json.loads(subprocess.run([CLI_BIN, "get", job.job_id,
                                 *cluster.cli_flags()],
                                check=True, capture_output=True, text=True).stdout)
logdir = got["tensorboard_dir"]
assert logdir == os.path.join(cluster.dir, "controller", "tensorboard", job.job_id), logdir
files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
assert len(files) == 1, files

scalars = {}  # (tag, step) -> value
versions = []
for event in event_file_loader.EventFileLoader(files[0]).Load():
    if event.HasField("file_version"):
        versions.append(event.file_version)
    # EventFileLoader migrates simple values to TensorBoard's scalar
    # tensors, as TensorBoard itself reads them.
    for v in event.summary.value:
        assert v.metadata.plugin_data.plugin_name == "scalars", v
        scalars[(v.tag, event.step)] = float(tensor_util.make_ndarray(v.tensor))
assert versions == ["brain.Event:2"], versions
for n, s in steps.items():
    assert scalars[("loss", n)] == f32(s.loss), (n, scalars[("loss", n)], s.loss)
    assert scalars[("lr", n)] == f32(s.lr)
    assert scalars[("grad_norm", n)] == f32(s.grad_norm)
    assert scalars[("metrics/accuracy", n)] == f32(s.metrics["accuracy"])
    for t in s.stages:
        assert scalars[(f"stage{t.stage}/forward_s", n)] == f32(t.forward_s)
        assert scalars[(f"stage{t.stage}/idle_s", n)] == f32(t.idle_s)
for n, e in evals.items():
    assert scalars[("eval/loss", n)] == f32(e.loss), n
    assert scalars[("eval/accuracy", n)] == f32(e.metrics["accuracy"]), n
print(f"PASS: {len(scalars)} scalars over {STEPS} steps and {len(evals)} evals read "
      f"back with tensorboard's EventFileLoader from {logdir}")
