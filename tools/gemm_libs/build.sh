#!/bin/bash
# Builds the GEMM library survey (not part of the Bazel build) with g++
# against Debian 12's system libraries. Needs:
#   apt-get install -y libopenblas0-pthread libblis-dev libdnnl-dev \
#     libxsmm-dev libabsl-dev
# Then run: tools/gemm_libs/gemm_libs [--rounds=N]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
# OpenBLAS and BLIS are dlopen()ed (they export the same BLAS symbols);
# oneDNN links dynamically, libxsmm statically (Debian ships only .a),
# without its BLAS fallback.
g++ -std=c++17 -O2 -fopenmp -Wall -I"${root}" \
  -I/usr/include/x86_64-linux-gnu/blis-openmp \
  "${here}"/gemm_libs.cc "${here}"/openblas_backends.cc \
  "${here}"/blis_backend.cc "${here}"/onednn_backend.cc \
  "${here}"/libxsmm_backend.cc \
  "${root}"/kernels/blas.cc "${root}"/kernels/parallel.cc \
  "${root}"/kernels/activation.cc \
  -o "${here}/gemm_libs" \
  $(pkg-config --libs absl_status absl_statusor absl_strings \
    absl_synchronization) \
  -ldnnl -L/usr/lib -lxsmm -lxsmmnoblas -ldl -lpthread -lrt -lm
echo "built ${here}/gemm_libs"
