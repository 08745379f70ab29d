"""A job over a sharded source keeps its memory for data under the spec's
`data.memory_limit_mib`, whatever the data set's size: `trainyard train`
over 256 MiB of features read as `npy_shards` with a limit of 64 MiB (the
data four times the limit) peaks within 48 MiB of the same job over 8 MiB
of data, and within the limit plus 8 MiB of slack (allocator noise) of a
job whose data is one batch held in memory, i.e. everything the sharded
job adds for its data (read-ahead buffers, mapped pages) fits the limit.
The same 256 MiB as an in-memory `npy` pair peaks at least 200 MiB higher
(so the test can tell), and with the 64 MiB limit the planner refuses it,
naming the field. Peak resident memory is the process's ru_maxrss (from
wait4), i.e. its VmHWM in /proc."""
import json
import os
import subprocess
import tempfile

import numpy as np

from cluster import CLI_BIN, PLUGIN_DIR

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
D, BATCH = 256, 512
BIG, SMALL = 262144, 8192  # rows: 256 MiB and 8 MiB of float32 features
LIMIT_MIB, SLACK_MIB = 64, 8


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


def train(source, tag, limit_mib):
    """Trains one shuffled epoch of the big set's size (512 steps); returns
    the exit code, stderr and the process's peak resident set in MiB."""
    spec = {
        "name": tag, "steps": BIG // BATCH, "seed": 3,
        "model": {"blocks": [{"outFeatures": 10, "ffnHiddenSize": 64}]},
        "optimizer": {"lr": 0.01},
        "task": {"plugin": "cross_entropy"},
        "data": {"train": source, "batchSize": BATCH, "shuffle": True,
                 "memoryLimitMib": limit_mib},
    }
    path = os.path.join(WORK, f"{tag}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    proc = subprocess.Popen([CLI_BIN, "train", "--spec", path, "--threads", "1",
                             f"--plugin_dir={PLUGIN_DIR}",
                             "--metrics_out", os.path.join(WORK, f"{tag}.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), err, usage.ru_maxrss / 1024


def peak_rss_mib(source, tag, limit_mib=LIMIT_MIB):
    code, err, peak = train(source, tag, limit_mib)
    assert code == 0, err[-2000:]
    return peak


def shards(name):
    return {"npyShards": {"features": [os.path.join(WORK, f"{name}-x.npy")],
                          "targets": [os.path.join(WORK, f"{name}-y.npy")]}}


def pair(name):
    return {"npy": {"features": os.path.join(WORK, f"{name}-x.npy"),
                    "targets": os.path.join(WORK, f"{name}-y.npy")}}


write_pair("big", BIG)
write_pair("small", SMALL)
write_pair("tiny", BATCH)
tiny = peak_rss_mib(pair("tiny"), "tiny-in-memory")
small = peak_rss_mib(shards("small"), "small-shards")
big = peak_rss_mib(shards("big"), "big-shards")
in_memory = peak_rss_mib(pair("big"), "big-in-memory", limit_mib=1024)
print(f"peak RSS: one batch in memory {tiny:.0f} MiB, 8 MiB as shards {small:.0f} MiB, "
      f"256 MiB as shards {big:.0f} MiB, 256 MiB in memory {in_memory:.0f} MiB "
      f"(limit {LIMIT_MIB} MiB for the shards)")
assert big - small < 48, f"the sharded job's memory grew {big - small:.0f} MiB with its data"
assert big - tiny < LIMIT_MIB + SLACK_MIB, (
    f"the sharded job's data took {big - tiny:.0f} MiB, over the {LIMIT_MIB} MiB limit")
assert in_memory - small > 200, "the in-memory job should hold the data (test cannot tell)"
code, err, _ = train(pair("big"), "big-in-memory-refused", LIMIT_MIB)
assert code != 0 and "data.memory_limit_mib" in err and "stream the data" in err, (code, err[-2000:])
print("PASS")
