#!/usr/bin/python3
"""Builds examples/digits/: the scikit-learn 8x8 handwritten digits as .npy.

Source: the copy of the UCI optical digits set that Debian's python3-sklearn
ships at /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
(1797 rows: 64 pixel values in 0..16, then the label 0..9). No download.

Split: a permutation from numpy's PCG64 generator seeded with 20240601, the
first 1437 permuted rows are train, the last 360 eval. Features are pixels
/ 16 as float32 [N, 64] in [0, 1]; labels int64 [N].

Writes examples/digits/{train,eval}_{features,labels}.npy. Re-run (from the
repository root; deterministic, the outputs are committed):

    /usr/bin/python3 examples/make_digits.py

Use Debian's /usr/bin/python3: it has numpy (python3-numpy) and the CSV
(python3-sklearn); another python on PATH may have neither.
"""
import gzip
import os
import sys

import numpy as np

SOURCE = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
SEED = 20240601
NUM_TRAIN = 1437
NUM_EVAL = 360


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits")
    if not os.path.exists(SOURCE):
        sys.exit(f"{SOURCE}: not found; install it with "
                 "`apt-get install -y python3-sklearn`")
    with gzip.open(SOURCE, "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float64)
    if data.shape != (NUM_TRAIN + NUM_EVAL, 65):
        sys.exit(f"{SOURCE}: expected shape (1797, 65), got {data.shape}")
    features = (data[:, :64] / 16.0).astype("<f4")
    labels = data[:, 64].astype("<i8")
    assert features.min() >= 0.0 and features.max() <= 1.0
    assert set(labels.tolist()) == set(range(10))

    perm = np.random.Generator(np.random.PCG64(SEED)).permutation(len(labels))
    train, evaluation = perm[:NUM_TRAIN], perm[NUM_TRAIN:]
    os.makedirs(out_dir, exist_ok=True)
    outputs = {
        "train_features.npy": features[train],
        "train_labels.npy": labels[train],
        "eval_features.npy": features[evaluation],
        "eval_labels.npy": labels[evaluation],
    }
    for name, array in outputs.items():
        path = os.path.join(out_dir, name)
        np.save(path, np.ascontiguousarray(array))
        print(f"wrote {path}: {array.dtype} {array.shape}")


if __name__ == "__main__":
    main()
