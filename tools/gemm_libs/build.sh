#!/bin/bash
# Builds the GEMM library survey (not part of the Bazel build) with g++
# against Debian 12's system libraries. Needs:
#   apt-get install -y libopenblas0-pthread libblis-dev libdnnl-dev \
#     libxsmm-dev libabsl-dev
# Then run: tools/gemm_libs/gemm_libs [--rounds=N]
# Usage: build.sh [OUT] (default tools/gemm_libs/gemm_libs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
out="${1:-${here}/gemm_libs}"
# OpenBLAS and BLIS are dlopen()ed (they export the same BLAS symbols);
# oneDNN links dynamically, libxsmm statically (Debian ships only .a),
# without its BLAS fallback.
# Our code with the Bazel build's value-preserving flags (.bazelrc,
# kernels/BUILD.bazel's KERNEL_COPTS), so our kernels run as in the engine.
g++ -std=c++17 -O3 -fno-trapping-math -ffp-contract=off -fno-math-errno \
  -fopenmp -Wall -I"${root}" \
  -I/usr/include/x86_64-linux-gnu/blis-openmp \
  "${here}"/gemm_libs.cc "${here}"/openblas_backends.cc \
  "${here}"/blis_backend.cc "${here}"/onednn_backend.cc \
  "${here}"/libxsmm_backend.cc "${here}"/packed_backend.cc \
  "${root}"/kernels/blas.cc "${root}"/kernels/cpu_kind.cc \
  "${root}"/kernels/parallel.cc "${root}"/kernels/activation.cc \
  "${root}"/kernels/packed_gemm.cc "${root}"/kernels/packed_gemm_kernels.cc \
  "${root}"/kernels/packed_gemm_transposed.cc \
  "${root}"/core/allocator.cc "${root}"/core/host_info.cc \
  "${root}"/core/device.cc \
  -o "${out}" \
  $(pkg-config --libs absl_status absl_statusor absl_strings \
    absl_synchronization) \
  -ldnnl -L/usr/lib -lxsmm -lxsmmnoblas -ldl -lpthread -lrt -lm
echo "built ${out}"
