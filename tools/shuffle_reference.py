#!/usr/bin/python3
"""The shuffle of a Trainyard data source, in Python: the row at place i of
epoch e's order of n rows (engine/dataset.h, ShuffledRow; docs/SPEC.md,
"Batches"), for checking or reproducing a job's batches outside Trainyard.

    shuffle_reference.py N SEED EPOCHS   # prints each epoch's rows, one JSON list a line

With shuffle on, the job's stream of rows is epoch 0's list, then epoch 1's,
...; batch k is entries k*B .. k*B+B-1 of that stream.
"""
import json
import sys

M64 = (1 << 64) - 1
SHUFFLE_STREAM_BASE = 0x5348554600000000  # engine/dataset.h kShuffleStreamBase


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def shuffled_row(index, n, seed, epoch):
    h = 1
    while (1 << (2 * h)) < n:
        h += 1
    mask = (1 << h) - 1
    base = mix64(seed ^ mix64((SHUFFLE_STREAM_BASE + epoch) & M64))
    keys = [mix64((base + r) & M64) for r in range(4)]
    x = index
    while True:
        left, right = x >> h, x & mask
        for key in keys:
            left, right = right, left ^ (mix64(right ^ key) & mask)
        x = (left << h) | right
        if x < n:
            return x


def main():
    n, seed, epochs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for e in range(epochs):
        print(json.dumps([shuffled_row(i, n, seed, e) for i in range(n)]))


if __name__ == "__main__":
    main()
