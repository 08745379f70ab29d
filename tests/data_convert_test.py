"""`trainyard data convert` and `trainyard data inspect`, run as a user would.

A CSV of a few thousand rows (float features, an integer class column and
float target columns in the middle) is converted with a small shard size;
the concatenated shards must equal numpy's own reading of the CSV
(np.loadtxt, float64, cast to float32) bitwise, including cells just past a
float32 rounding midpoint, where parsing straight to float32 (strtof) would
differ. The same CSV stored at half width: bfloat16 words equal to torch's
rounding of numpy's reading, float16 equal to numpy's astype(np.float16).
Then the refusals (a bad cell naming file, line and column, leaving nothing
behind; a non-empty output folder), a .npy pair split and rejoined bitwise,
and inspect's listing of every shard with its rows.

Usage: data_convert_test.py PATH_TO_TRAINYARD (run with /usr/bin/python3).
"""
import ctypes
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

CLI = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
ROWS = 3000
COLUMNS = ["f0", "f1", "label", "f2", "t0", "t1", "f3"]
# Just above float32 midpoints: float64 rounding lands on the midpoint,
# which then rounds to even, unlike a direct decimal-to-float32 rounding.
TRICKY = ["1.000000059604644775390625000000001",
          "-3.00000011920928955078125000000001",
          "0.1", "1e-45", "3.4028234e38", "-0.0", "  2.5 "]


def run(*args, ok=True):
    proc = subprocess.run([CLI, "data", *args], capture_output=True,
                          text=True, timeout=60)
    if ok and proc.returncode != 0:
        raise AssertionError(f"trainyard data {args} failed "
                             f"({proc.returncode}): {proc.stderr}")
    return proc


def write_csv(path, bad_line=None):
    rng = np.random.default_rng(7)
    lines = [",".join(COLUMNS)]
    for i in range(ROWS):
        cells = []
        for name in COLUMNS:
            if name == "label":
                cells.append(str(int(rng.integers(0, 10))))
            elif i < len(TRICKY) and name == "f1":
                cells.append(TRICKY[i])
            else:
                # 17 significant digits: every float64, most not float32.
                cells.append(repr(float(rng.normal() * 10.0 ** rng.integers(-6, 6))))
        lines.append(",".join(cells))
    if bad_line is not None:  # 1-based file line; the header is line 1
        cells = lines[bad_line - 1].split(",")
        cells[1] = "n/a"
        lines[bad_line - 1] = ",".join(cells)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def concat(out, letter):
    files = sorted(glob.glob(os.path.join(out, f"{letter}-*.npy")))
    return np.concatenate([np.load(f, mmap_mode="r") for f in files])


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_csv_matches_numpy(csv, numpy_rows):
    out = os.path.join(WORK, "classes")
    run("convert", "--in", csv, "--out", out, "--shard_rows", "700",
        "--target_columns", "label", "--feature_columns", "f0,f1,f2,f3")
    names = sorted(os.listdir(out))
    assert names == ["shards.json"] + [f"{c}-{k:05d}.npy" for c in "xy"
                                       for k in range(5)], names
    x, y = concat(out, "x"), concat(out, "y")
    want = numpy_rows[:, [0, 1, 3, 6]].astype(np.float32)
    assert x.dtype == np.float32 and x.shape == (ROWS, 4), (x.dtype, x.shape)
    assert np.array_equal(bits(x), bits(want)), "features differ from numpy"
    # The tricky cells really are ones where strtof-style rounding differs.
    # libc's strtof rounds them once, to the other neighbour.
    strtof = ctypes.CDLL(None).strtof
    strtof.restype = ctypes.c_float
    strtof.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    direct = np.array([strtof(t.encode(), None) for t in TRICKY[:2]],
                      dtype=np.float32)
    assert np.all(bits(direct) != bits(x[:2, 1])), (direct, x[:2, 1])
    assert list(x[:2, 1]) == [1.0, -3.0], x[:2, 1]
    assert y.dtype == np.int64 and y.shape == (ROWS,)
    assert np.array_equal(y, numpy_rows[:, 2].astype(np.int64))
    manifest = json.load(open(os.path.join(out, "shards.json")))
    assert manifest["rows"] == ROWS
    assert [s["rows"] for s in manifest["shards"]] == [700] * 4 + [200]
    for shard in manifest["shards"]:
        for key in ("features", "targets"):
            data = open(os.path.join(out, shard[key]["file"]), "rb").read()
            assert hashlib.sha256(data).hexdigest() == shard[key]["sha256"]
    return out


def test_float_targets(csv, numpy_rows):
    out = os.path.join(WORK, "floats")
    run("convert", "--in", csv, "--out", out, "--shard_rows", "1000",
        "--target_columns", "t0,t1")
    x, y = concat(out, "x"), concat(out, "y")
    assert y.dtype == np.float32 and y.shape == (ROWS, 2)
    assert np.array_equal(bits(y), bits(numpy_rows[:, [4, 5]]))
    # Default features: every other column, in file order.
    assert np.array_equal(bits(x), bits(numpy_rows[:, [0, 1, 2, 3, 6]]))


def convert_features(csv, name, dtype):
    out = os.path.join(WORK, name)
    proc = run("convert", "--in", csv, "--out", out, "--shard_rows", "700",
               "--target_columns", "label", "--feature_columns",
               "f0,f1,f2,f3", "--features_dtype", dtype)
    manifest = json.load(open(os.path.join(out, "shards.json")))
    assert manifest["features"] == {"dtype": dtype, "width": 4}, manifest
    return out, proc


def test_half_width(csv, numpy_rows):
    want32 = numpy_rows[:, [0, 1, 3, 6]].astype(np.float32)
    out, proc = convert_features(csv, "bf16", "bfloat16")
    x = concat(out, "x")
    assert x.dtype == np.uint16 and x.shape == (ROWS, 4), (x.dtype, x.shape)
    want = (torch.from_numpy(want32).to(torch.bfloat16).view(torch.int16)
            .numpy().view(np.uint16))
    assert np.array_equal(x, want), "bfloat16 words differ from torch's"
    # The CSV's 3.4028234e38 rounds past bfloat16's largest, as in torch.
    assert want[4, 1] == 0x7F80 and x[4, 1] == 0x7F80, hex(x[4, 1])
    assert "1 feature value(s) beyond bfloat16's range" in proc.stderr, (
        proc.stderr)
    assert np.array_equal(concat(out, "y"), numpy_rows[:, 2].astype(np.int64))
    text = run("inspect", "--in", out, "--features_dtype", "bfloat16").stdout
    assert "features bfloat16 [700, 4]" in text, text
    assert (f"total: 5 shard pair(s), {ROWS} rows" in text and
            "features bfloat16 [n, 4], targets int64 [n]" in text), text
    proc = run("inspect", "--in", out, ok=False)
    assert proc.returncode == 1 and (
        "x-00000.npy: dtype '<u2' holds 2-byte words: pass --features_dtype "
        "bfloat16" in proc.stderr), proc.stderr

    out, proc = convert_features(csv, "f16", "float16")
    x = concat(out, "x")
    assert x.dtype == np.float16 and x.shape == (ROWS, 4), (x.dtype, x.shape)
    with np.errstate(over="ignore"):
        want = want32.astype(np.float16)
    assert np.array_equal(x.view(np.uint16), want.view(np.uint16))
    overflowed = int(np.sum(np.isinf(want)))
    assert overflowed > 0 and (f"{overflowed} feature value(s) beyond "
                               "float16's range" in proc.stderr), proc.stderr
    text = run("inspect", "--in", out).stdout
    assert "features float16 [n, 4]" in text, text
    proc = run("inspect", "--in", out, "--features_dtype", "bfloat16",
               ok=False)
    assert proc.returncode == 1 and (
        "x-00000.npy: dtype '<f2', but --features_dtype is bfloat16 "
        "(expected '<u2' or '|V2')" in proc.stderr), proc.stderr
    proc = run("convert", "--in", csv, "--out", os.path.join(WORK, "f8"),
               "--shard_rows", "700", "--target_columns", "label",
               "--features_dtype", "float8", ok=False)
    assert proc.returncode == 2 and "--features_dtype must be float32, " \
        "float16 or bfloat16, got \"float8\"" in proc.stderr, proc.stderr


def test_refusals(csv):
    bad = os.path.join(WORK, "bad.csv")
    write_csv(bad, bad_line=1234)
    out = os.path.join(WORK, "bad_out")
    proc = run("convert", "--in", bad, "--out", out, "--shard_rows", "500",
               "--target_columns", "label", ok=False)
    want = f'{bad}:1234: column "f1": "n/a" is not a number'
    assert proc.returncode == 1 and want in proc.stderr, proc.stderr
    assert not os.path.exists(out), os.listdir(out)  # 2 full shards removed
    taken = os.path.join(WORK, "taken")
    os.makedirs(taken)
    open(os.path.join(taken, "keep.txt"), "w").write("mine")
    proc = run("convert", "--in", csv, "--out", taken, "--shard_rows", "500",
               "--target_columns", "label", ok=False)
    assert proc.returncode == 1 and "exists and is not empty" in proc.stderr
    assert os.listdir(taken) == ["keep.txt"]
    proc = run("convert", "--in", csv, "--out", out, "--shard_rows", "500",
               ok=False)
    assert proc.returncode == 2 and "--target_columns" in proc.stderr


def test_npy_pair_round_trip():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2500, 5)).astype(np.float32)
    for name, y in (("class", rng.integers(0, 7, size=2500)),
                    ("float", rng.normal(size=(2500, 3)).astype(np.float32))):
        xp = os.path.join(WORK, f"big_x_{name}.npy")
        yp = os.path.join(WORK, f"big_y_{name}.npy")
        np.save(xp, x)
        np.save(yp, y)
        out = os.path.join(WORK, f"npy_{name}")
        run("convert", "--in", xp, "--targets_in", yp, "--out", out,
            "--shard_rows", "1000")
        assert len(glob.glob(os.path.join(out, "x-*.npy"))) == 3
        got_y = concat(out, "y")
        assert np.array_equal(bits(concat(out, "x")), bits(x))
        assert got_y.dtype == y.dtype and np.array_equal(got_y, y)


def test_inspect(out):
    for where in (out, os.path.join(out, "x-*.npy")):
        text = run("inspect", "--in", where).stdout
        for k in range(5):
            rows = 700 if k < 4 else 200
            assert (f"x-{k:05d}.npy + {out}/y-{k:05d}.npy: {rows} rows"
                    in text), text
        assert f"int64 [{200}]" in text and "float32 [700, 4]" in text
        assert f"total: 5 shard pair(s), {ROWS} rows" in text, text
    # A pair whose row counts differ names the file.
    broken = os.path.join(WORK, "broken")
    os.makedirs(broken)
    np.save(os.path.join(broken, "x-00000.npy"), np.zeros((4, 2), np.float32))
    np.save(os.path.join(broken, "y-00000.npy"), np.zeros(3, np.int64))
    proc = run("inspect", "--in", broken, ok=False)
    assert proc.returncode == 1 and "y-00000.npy: 3 rows" in proc.stderr, (
        proc.stderr)


def main():
    csv = os.path.join(WORK, "data.csv")
    write_csv(csv)
    numpy_rows = np.loadtxt(csv, delimiter=",", skiprows=1)
    out = test_csv_matches_numpy(csv, numpy_rows)
    test_float_targets(csv, numpy_rows)
    test_half_width(csv, numpy_rows)
    test_refusals(csv)
    test_npy_pair_round_trip()
    test_inspect(out)
    print("data_convert_test: OK")


if __name__ == "__main__":
    main()
