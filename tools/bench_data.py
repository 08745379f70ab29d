#!/usr/bin/python3
"""Reading data at scale: Trainyard's sharded reader against dd and PyTorch's
DataLoader, over a data set larger than the page cache (docs/BENCHMARKS.md,
"Reading data at scale").

The data set (--make): pairs of .npy shards in --dir, features-NNNNN.npy
float16 [n, D] (D = 1024; --shard_mib of features each, 512 MiB = 262,144
rows) and targets-NNNNN.npy int64 [n] (each row's index in the whole set;
classes-NNNNN.npy the same modulo 1000, for --train),
as many pairs as make --gb GB (1 GB = 1e9 bytes). Row r's features are row
r % 1021 of a fixed table, so the contents are deterministic, cheap to make
and differ from row to row. Files already present with the right size are
kept, so a larger set made in the same folder reuses a smaller one.

The run (--run), per round, each reader after the page cache is dropped
(`sync; echo 3 > /proc/sys/vm/drop_caches`, as root; without it the round
goes on and says so):
  dd         dd if=<shard> of=/dev/null bs=16M over the shards in order
             until --seconds pass: sequential reading, the disk's ceiling;
  trainyard  //engine:data_read_benchmark: the job's own read path
             (npy_shards, shuffled BatchSampler, the first stage's
             read-ahead thread) for --seconds;
  pytorch    torch.utils.data.DataLoader over a Dataset whose __getitem__
             reads row i from np.load(mmap_mode='r') shards, batch --batch,
             shuffle=True with a seeded generator, --workers workers, for
             --seconds.
Rows/s and GB/s count rows at the files' stored width (2*D + 8 bytes).
Peak RSS is trainyard's VmHWM; for PyTorch, the largest sum of VmRSS over
its main process and workers, sampled every 0.2 s; for dd, the same
sampling. Peak PSS, sampled the same way for every reader, shares each page
mapped by several processes out among them (the workers map the same file
pages; RSS counts them once per worker). Prints a markdown table per round,
the medians, and a JSON line; `uptime` and `free -g` at the start say how
busy the machine was. "disk read" is what the data's block device read
(/proc/diskstats) while each reader ran, its process start included: per
row, it shows how much each row really costs the disk.

    /usr/bin/python3 tools/bench_data.py --make --gb 40
    /usr/bin/python3 tools/bench_data.py --run --seconds 60 --rounds 2

The benchmark binary is built with Bazel from this checkout unless --bin
names one.
"""
import argparse
import bisect
import glob
import io
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_ROWS = 1021  # prime: the row pattern's period


def npy_header(dtype, shape):
    """The .npy header numpy writes for an array of `dtype` and `shape`."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
              "fortran_order": False, "shape": shape})
    return buf.getvalue()


def feature_table(d):
    """[TABLE_ROWS, d] float16 values in [-1, 1): row r of the data set holds
    row r % TABLE_ROWS."""
    i = np.arange(TABLE_ROWS, dtype=np.int64)[:, None]
    j = np.arange(d, dtype=np.int64)[None, :]
    return (((i * 37 + j * 11) % 2003) / 1001.5 - 1.0).astype(np.float16)


def write_npy(path, dtype, shape, chunks):
    """Writes the array `chunks` yields (in row order) as `path`, through a
    temporary file renamed into place; keeps a present file of the right
    size. Returns True when it wrote."""
    header = npy_header(dtype, shape)
    size = len(header) + int(np.prod(shape)) * np.dtype(dtype).itemsize
    if os.path.isfile(path) and os.path.getsize(path) == size:
        return False
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        for chunk in chunks:
            f.write(np.ascontiguousarray(chunk, dtype=dtype).tobytes())
    if os.path.getsize(tmp) != size:
        raise RuntimeError(f"{tmp}: wrote {os.path.getsize(tmp)} bytes, "
                           f"expected {size}")
    os.replace(tmp, path)
    return True


def make(args):
    d = args.features_dim
    rows = args.shard_mib * 2**20 // (2 * d)
    pair_bytes = rows * (2 * d + 8)
    shards = max(1, math.ceil(args.gb * 1e9 / pair_bytes))
    os.makedirs(args.dir, exist_ok=True)
    table = feature_table(d)
    step = 16384
    start_time = time.monotonic()
    wrote = 0
    for k in range(shards):
        first = k * rows
        ids = np.arange(first, first + rows, dtype=np.int64)
        features = (table[ids[a:a + step] % TABLE_ROWS]
                    for a in range(0, rows, step))
        wrote += write_npy(os.path.join(args.dir, f"features-{k:05d}.npy"),
                           np.float16, (rows, d), features)
        wrote += write_npy(os.path.join(args.dir, f"targets-{k:05d}.npy"),
                           np.int64, (rows,), [ids])
        # Class ids for the training figure (--train): the row's index
        # modulo 1000.
        wrote += write_npy(os.path.join(args.dir, f"classes-{k:05d}.npy"),
                           np.int64, (rows,), [ids % 1000])
        print(f"\rshard {k + 1}/{shards}", end="", flush=True)
    print(f"\r{args.dir}: {shards} pairs of {rows} rows, float16 D={d} + "
          f"int64, {shards * pair_bytes / 1e9:.2f} GB; wrote {wrote} files "
          f"in {time.monotonic() - start_time:.0f} s")
    extra = len(shard_files(args.dir, "features")) - shards
    if extra > 0:
        print(f"note: {args.dir} holds {extra} more features shards than "
              f"--gb {args.gb} makes; --run reads them all")


def shard_files(folder, kind):
    return sorted(glob.glob(os.path.join(folder, f"{kind}-[0-9]*.npy")))


def disk_read_bytes(folder):
    """Bytes the block device holding `folder` has read since boot
    (/proc/diskstats), or None when it is not listed there."""
    dev = os.stat(folder).st_dev
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if (int(p[0]), int(p[1])) == (os.major(dev), os.minor(dev)):
                return int(p[5]) * 512
    return None


def drop_caches():
    """Empties the page cache; returns a note when it cannot."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        note = f"page cache not dropped (/proc/sys/vm/drop_caches: {e})"
        print(note)
        return note


def process_tree(root):
    """`root` and its descendants' process ids."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # pid (comm) state ppid ...: comm may hold spaces.
                parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    tree, changed = {root}, True
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                changed = True
    return tree


def status_kib(pid, path, field):
    """Field `field` ("VmRSS:", "Pss:") of /proc/<pid>/<path> in KiB; 0 when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_memory_mib(root):
    """(sum of VmRSS, sum of Pss) over `root` and its descendants, in MiB.
    RSS counts a file page mapped by several processes once in each; PSS
    shares it out."""
    tree = process_tree(root)
    rss = sum(status_kib(pid, "status", "VmRSS:") for pid in tree)
    pss = sum(status_kib(pid, "smaps_rollup", "Pss:") for pid in tree)
    return rss / 1024, pss / 1024


def run_sampled(cmd):
    """Runs `cmd`; returns (its stdout, the peaks of its process tree's
    summed VmRSS and Pss in MiB, sampled every 0.2 s)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = [0.0, 0.0]

    def sample():
        while proc.poll() is None:
            rss, pss = tree_memory_mib(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, _ = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
    return out, peak


def read_dd(args):
    """dd over the shards in order (features, then targets, pair by pair)
    until --seconds pass or every file is read once."""
    files = [f for pair in zip(shard_files(args.dir, "features"),
                               shard_files(args.dir, "targets"))
             for f in pair]
    nbytes, peak, start = 0, [0.0, 0.0], time.monotonic()
    for path in files:
        _, p = run_sampled(["dd", f"if={path}", "of=/dev/null", "bs=16M",
                            "status=none"])
        nbytes += os.path.getsize(path)
        peak = [max(a, b) for a, b in zip(peak, p)]
        if time.monotonic() - start >= args.seconds:
            break
    seconds = time.monotonic() - start
    return {"reader": "dd", "bytes": nbytes, "seconds": seconds,
            "rows_per_s": None, "gb_per_s": nbytes / seconds / 1e9,
            "peak_rss_mib": peak[0], "peak_pss_mib": peak[1]}


def read_trainyard(args, binary):
    cmd = [binary,
           "--features", os.path.join(args.dir, "features-[0-9]*.npy"),
           "--targets", os.path.join(args.dir, "targets-[0-9]*.npy"),
           "--batch", str(args.batch), "--seconds", str(args.seconds),
           "--shuffle", "--seed", str(args.seed)]
    out, sampled = run_sampled(cmd)
    r = json.loads(out.strip().splitlines()[-1])
    r["sampled_peak_rss_mib"], r["peak_pss_mib"] = sampled
    return r


def read_pytorch(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch_child",
           "--dir", args.dir, "--batch", str(args.batch),
           "--seconds", str(args.seconds), "--seed", str(args.seed),
           "--workers", str(args.workers)]
    out, peak = run_sampled(cmd)
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_mib"], r["peak_pss_mib"] = peak
    return r


class ShardRows:
    """Row i of the shards in `folder` (their rows in file order), read from
    np.load(mmap_mode='r') maps: (features float32 [D], target)."""

    def __init__(self, folder):
        self.features = [np.load(p, mmap_mode="r")
                         for p in shard_files(folder, "features")]
        self.targets = [np.load(p, mmap_mode="r")
                        for p in shard_files(folder, "targets")]
        self.starts = [0]
        for f in self.features:
            self.starts.append(self.starts[-1] + f.shape[0])
        self.row_bytes = (self.features[0].shape[1] *
                          self.features[0].itemsize +
                          self.targets[0].itemsize)

    def __len__(self):
        return self.starts[-1]

    def __getitem__(self, i):
        import torch
        k = bisect.bisect_right(self.starts, i) - 1
        j = i - self.starts[k]
        # float32 like the rows a Trainyard stage gets.
        x = torch.from_numpy(self.features[k][j].astype(np.float32))
        return x, int(self.targets[k][j])


def torch_child(args):
    """The PyTorch reader, in a process of its own so that its peak RSS and
    its workers' are its own. Prints one JSON line."""
    import torch
    data = ShardRows(args.dir)
    generator = torch.Generator()
    generator.manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch, shuffle=True, generator=generator,
        num_workers=args.workers)
    disk_before = disk_read_bytes(args.dir)
    rows, batches, start = 0, 0, time.monotonic()
    for x, _ in loader:
        rows += x.shape[0]
        batches += 1
        if time.monotonic() - start >= args.seconds:
            break
    seconds = time.monotonic() - start
    disk_after = disk_read_bytes(args.dir)
    print(json.dumps({
        "reader": "pytorch", "rows": rows, "batches": batches,
        "seconds": seconds, "rows_per_s": rows / seconds,
        "gb_per_s": rows * data.row_bytes / seconds / 1e9,
        "disk_bytes": (None if disk_before is None or disk_after is None
                       else disk_after - disk_before)}))


def measure_disk(folder, read):
    """read()'s result, with what the disk read while it ran: disk_gb_per_s
    and disk_kib_per_row (None for dd). Over read()'s wall time, process
    start included, unless the reader measured its own window ("disk_bytes"
    over its "seconds": the PyTorch child, whose `import torch` alone reads
    about 0.5 GB). Reads by other processes on the same disk count too."""
    before, start = disk_read_bytes(folder), time.monotonic()
    r = read()
    after, seconds = disk_read_bytes(folder), time.monotonic() - start
    nbytes = None if before is None or after is None else after - before
    if "disk_bytes" in r:
        nbytes, seconds = r["disk_bytes"], r["seconds"]
    r["disk_gb_per_s"] = r["disk_kib_per_row"] = None
    if nbytes is not None:
        r["disk_gb_per_s"] = nbytes / seconds / 1e9
        if r.get("rows"):
            r["disk_kib_per_row"] = nbytes / r["rows"] / 1024
    return r


def build_binary():
    subprocess.run(["bazel", "build", "//engine:data_read_benchmark"],
                   cwd=REPO, check=True)
    return os.path.join(REPO, "bazel-bin", "engine", "data_read_benchmark")


def command_output(cmd):
    return subprocess.run(cmd, capture_output=True, text=True,
                          check=False).stdout.rstrip()


def fmt(value, digits):
    return "-" if value is None else f"{value:,.{digits}f}"


def print_table(title, results):
    dd = results["dd"]["gb_per_s"]
    print(f"\n{title}\n")
    print("| reader | rows/s | GB/s | vs dd | peak RSS (MiB) | "
          "peak PSS (MiB) | disk read GB/s | disk read / row (KiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ("dd", "trainyard", "pytorch"):
        r = results[name]
        print(f"| {name} | {fmt(r['rows_per_s'], 0)} | "
              f"{fmt(r['gb_per_s'], 4)} | {r['gb_per_s'] / dd:.2%} | "
              f"{fmt(r['peak_rss_mib'], 0)} | {fmt(r['peak_pss_mib'], 0)} | "
              f"{fmt(r['disk_gb_per_s'], 3)} | "
              f"{fmt(r['disk_kib_per_row'], 0)} |")


def run(args):
    if not shard_files(args.dir, "features"):
        sys.exit(f"{args.dir}: no features-*.npy shards (run --make first)")
    binary = args.bin or build_binary()
    machine = {"uptime": command_output(["uptime"]),
               "free_g": command_output(["free", "-g"])}
    print(f"uptime: {machine['uptime']}\n{machine['free_g']}")
    rounds, notes = [], []
    readers = (("dd", lambda: read_dd(args)),
               ("trainyard", lambda: read_trainyard(args, binary)),
               ("pytorch", lambda: read_pytorch(args)))
    for k in range(args.rounds):
        results = {}
        for name, read in readers:
            note = drop_caches()
            if note:
                notes.append(note)
            results[name] = measure_disk(args.dir, read)
        rounds.append(results)
        print_table(f"Round {k + 1}", results)
    medians = {}
    for name, _ in readers:
        medians[name] = {}
        for key in ("rows_per_s", "gb_per_s", "peak_rss_mib", "peak_pss_mib",
                    "disk_gb_per_s", "disk_kib_per_row"):
            values = [r[name][key] for r in rounds
                      if r[name].get(key) is not None]
            medians[name][key] = statistics.median(values) if values else None
    print_table(f"Median of {args.rounds} rounds", medians)
    print(json.dumps({"bench": "data_read", "dir": args.dir,
                      "seconds": args.seconds, "batch": args.batch,
                      "workers": args.workers, "machine": machine,
                      "notes": notes, "rounds": rounds, "median": medians}))


def train(args):
    """The first stage's data wait while the CPU benchmark model trains on
    the set (shuffled, cold page cache), as //engine:data_read_benchmark
    --train_steps measures it."""
    binary = args.bin or os.path.join(REPO, "bazel-bin", "engine",
                                      "data_read_benchmark")
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary}: not built (bazel build //engine:data_read_benchmark)")
    print(drop_caches() or "page cache dropped")
    out = subprocess.run(
        [binary, "--train_steps", str(args.steps), "--threads", "2",
         "--features", os.path.join(args.dir, "features-[0-9]*.npy"),
         "--targets", os.path.join(args.dir, "classes-[0-9]*.npy")],
        check=True, capture_output=True, text=True).stdout
    print(out.strip())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--make", action="store_true", help="write the data set")
    p.add_argument("--run", action="store_true", help="run the readers")
    p.add_argument("--dir", default="/var/tmp/trainyard-bench-data")
    p.add_argument("--gb", type=float, default=40, help="data set size (1e9)")
    p.add_argument("--shard_mib", type=int, default=512,
                   help="features per shard, MiB")
    p.add_argument("--features_dim", type=int, default=1024, help="D")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2,
                   help="DataLoader num_workers")
    p.add_argument("--bin", help="data_read_benchmark binary (default: "
                   "bazel build it)")
    p.add_argument("--train", action="store_true",
                   help="train the CPU benchmark model on the set "
                   "(data_read_benchmark --train_steps, page cache dropped "
                   "first) and print its data-wait share")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--torch_child", action="store_true",
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_child:
        torch_child(args)
    elif not (args.make or args.run or args.train):
        p.error("give --make, --run, --train or several")
    if args.make:
        make(args)
    if args.run:
        run(args)
    if args.train:
        train(args)


if __name__ == "__main__":
    main()
