#!/usr/bin/env bash
# One-shot check of Trainyard's GPU path on a machine with an NVIDIA GPU:
#
#   tools/gpu_check.sh [--bundle DIR] [RESULTS_DIR]
#
# Runs a bundle's run.sh (see tools/gpu_bundle.sh and tools/gpu_bundle_run.sh:
# the gpu tests, CPU-vs-GPU training jobs, the benchmarks; summary.txt and
# gpu-results.tar.gz in RESULTS_DIR, default $OUT, else ./gpu-results). The
# bundle is DIR, else $TRAINYARD_GPU_BUNDLE, else one built here first with
# Bazel and the CUDA toolkit (into $TMPDIR/trainyard-gpu-bundle).
#
# Without a GPU it stops at once: exit 2, "no NVIDIA GPU here (...)".
# Exit code: run.sh's (0 every step that ran passed, 1 otherwise).
set -euo pipefail

no_gpu() {
  echo "no NVIDIA GPU here ($1)" >&2
  exit 2
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found on PATH"
gpus=$(timeout 60 nvidia-smi -L 2>&1) || no_gpu "nvidia-smi -L failed: $(head -n 1 <<<"$gpus")"
grep -q '^GPU [0-9]' <<<"$gpus" || no_gpu "nvidia-smi -L lists no GPU"

bundle=${TRAINYARD_GPU_BUNDLE:-}
if [[ ${1:-} == --bundle ]]; then
  bundle=${2:?--bundle needs a folder}
  shift 2
fi
if [[ -z $bundle ]]; then
  command -v bazel >/dev/null 2>&1 || {
    echo "gpu_check: no bundle (--bundle DIR or TRAINYARD_GPU_BUNDLE) and no bazel to build one" >&2
    exit 1
  }
  bundle=${TMPDIR:-/tmp}/trainyard-gpu-bundle
  "$(dirname "$0")/gpu_bundle.sh" "$bundle"
fi
[[ -x $bundle/run.sh ]] || {
  echo "gpu_check: $bundle/run.sh missing: not a bundle made by tools/gpu_bundle.sh" >&2
  exit 1
}
exec "$bundle/run.sh" "$@"
