#!/usr/bin/python3
"""Writes the npy_*.npy fixtures of core/npy_test.cc with numpy's own writer.

Run from the repository root with Debian's python (it has numpy):
    /usr/bin/python3 core/testdata/make_npy_fixtures.py
The committed files were made by numpy 1.24.2.
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def path(name):
    return os.path.join(HERE, name)


np.save(path("npy_f32_2x3.npy"),
        (np.arange(6, dtype="<f4").reshape(2, 3) / 4 - 0.5).astype("<f4"))
np.save(path("npy_i64_1d.npy"), np.array([-3, 0, 7, 2**40], dtype="<i8"))
with open(path("npy_i32_0d_v2.npy"), "wb") as f:
    np.lib.format.write_array(f, np.array(-123456, dtype="<i4"), version=(2, 0))
np.save(path("npy_f32_fortran.npy"),
        np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
