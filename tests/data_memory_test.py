"""A job over a sharded source keeps its memory for data about a batch:
`trainyard train` over 256 MiB of features read as `npy_shards` (memory-
mapped, a batch gathered at a time) peaks within 48 MiB of the same job
over 8 MiB of data, while the same 256 MiB as an in-memory `npy` pair peaks
at least 200 MiB higher (so the test can tell). Peak resident memory is the
process's ru_maxrss (from wait4), i.e. its VmHWM in /proc."""
import json
import os
import subprocess
import tempfile

import numpy as np

from cluster import CLI_BIN, PLUGIN_DIR

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
D, BATCH = 256, 512
BIG, SMALL = 262144, 8192  # rows: 256 MiB and 8 MiB of float32 features


def write_pair(name, rows):
    rng = np.random.default_rng(rows)
    x = np.lib.format.open_memmap(os.path.join(WORK, f"{name}-x.npy"), mode="w+",
                                  dtype=np.float32, shape=(rows, D))
    for b in range(0, rows, 65536):
        x[b:b + 65536] = rng.standard_normal((min(65536, rows - b), D),
                                             dtype=np.float32)
    x.flush()
    del x
    np.save(os.path.join(WORK, f"{name}-y.npy"),
            rng.integers(0, 10, size=rows, dtype=np.int64))


def peak_rss_mib(source, tag):
    """Trains one shuffled epoch of the big set's size (512 steps) and
    returns the process's peak resident set in MiB."""
    spec = {
        "name": tag, "steps": BIG // BATCH, "seed": 3,
        "model": {"blocks": [{"outFeatures": 10, "ffnHiddenSize": 64}]},
        "optimizer": {"lr": 0.01},
        "task": {"plugin": "cross_entropy"},
        "data": {"train": source, "batchSize": BATCH, "shuffle": True},
    }
    path = os.path.join(WORK, f"{tag}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    proc = subprocess.Popen([CLI_BIN, "train", "--spec", path, "--threads", "1",
                             f"--plugin_dir={PLUGIN_DIR}",
                             "--metrics_out", os.path.join(WORK, f"{tag}.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode()
    assert os.waitstatus_to_exitcode(status) == 0, err[-2000:]
    return usage.ru_maxrss / 1024


def shards(name):
    return {"npyShards": {"features": [os.path.join(WORK, f"{name}-x.npy")],
                          "targets": [os.path.join(WORK, f"{name}-y.npy")]}}


write_pair("big", BIG)
write_pair("small", SMALL)
small = peak_rss_mib(shards("small"), "small-shards")
big = peak_rss_mib(shards("big"), "big-shards")
in_memory = peak_rss_mib({"npy": {"features": os.path.join(WORK, "big-x.npy"),
                                  "targets": os.path.join(WORK, "big-y.npy")}},
                         "big-in-memory")
print(f"peak RSS: 8 MiB as shards {small:.0f} MiB, 256 MiB as shards {big:.0f} MiB, "
      f"256 MiB in memory {in_memory:.0f} MiB")
assert big - small < 48, f"the sharded job's memory grew {big - small:.0f} MiB with its data"
assert in_memory - small > 200, "the in-memory job should hold the data (test cannot tell)"
print("PASS")
