"""The Python client example submits and watches a job to SUCCEEDED."""
import json
import os
import subprocess
import tempfile

from cluster import ROOT, Cluster, small_spec

cluster = Cluster(workers=2)
work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
spec_path = os.path.join(work, "job.json")
with open(spec_path, "w") as f:
    json.dump(small_spec(stages=2, steps=8, name="from-python"), f)
out = subprocess.run(
    ["/usr/bin/python3", os.path.join(ROOT, "examples/python_client/submit_and_watch.py"),
     "--controller", cluster.address, "--spec", spec_path, "--stubs", ROOT],
    capture_output=True, text=True, timeout=300)
print(out.stdout, out.stderr)
assert out.returncode == 0, out.returncode
lines = out.stdout.splitlines()
assert [l.split()[1] for l in lines if l.startswith("step ")] == [str(i) for i in range(1, 9)]
assert lines[-1].startswith("state SUCCEEDED"), lines[-1]
print("PASS")
