#!/usr/bin/env bash
# One-shot check of Trainyard's GPU path on a GPU machine (NVIDIA driver,
# CUDA toolkit at $CUDA_HOME or /usr/local/cuda; no network needed). Run it
# from a copy of the repository:
#
#   OUT=/tmp/gpu-results tools/gpu_check.sh
#
# It runs, each step logged to its own file and summarised at the end:
#   1. nvidia-smi
#   2. the gpu-tagged tests: bazel test --test_tag_filters=gpu //...
#      (the command line overrides .bazelrc's -gpu filter); this includes
#      //core:nccl_transport_test with TRAINYARD_REQUIRE_GPU=1, where a missing device is a failure
#   3. the NCCL smoke test on its own (its log shows the per-test lines)
#   4. the kernel benchmark //kernels/cuda:mlp_benchmark, when that target
#      exists
#   5. tools/bench_gpu_mlp.py (PyTorch reference), when python3 has torch
#      with CUDA
# Without Bazel, step 2/3 fall back to compiling the NCCL test with g++
# directly (needs Abseil and GoogleTest dev packages), and step 4 says what
# to build by hand. Logs and summary.txt go to $OUT when it is set, else to
# a new /tmp/trainyard-gpu-check-* folder.
#
# On a machine without a GPU it stops at once, saying so, with exit code 2.
# Exit code: 0 when every step that ran passed, 1 otherwise.
set -u -o pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LOGS=$(mktemp -d /tmp/trainyard-gpu-check-XXXXXX)
SUMMARY=$LOGS/summary.txt
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }

finish() {
  note "logs: ${OUT:-$LOGS}"
  if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT" && cp -r "$LOGS"/. "$OUT"/
  fi
  exit "$1"
}

# step NAME COMMAND...: runs COMMAND, logs to NAME.log, records PASS/FAIL.
step() {
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$SUMMARY"
  local start=$SECONDS
  if "$@" >"$LOGS/$name.log" 2>&1; then
    note "   PASS $name ($((SECONDS - start)) s)"
  else
    note "   FAIL $name (exit $?, $((SECONDS - start)) s; see $name.log)"
    tail -n 20 "$LOGS/$name.log" | sed 's/^/   | /'
    FAILED=1
  fi
}

skip() { note "== $1: SKIPPED: $2"; }

note "trainyard gpu check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"

# --- 0. Is there a GPU at all? ---------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$LOGS/gpus.txt" 2>&1 \
    || ! grep -q '^GPU ' "$LOGS/gpus.txt"; then
  note "no NVIDIA GPU here (nvidia-smi missing or lists no GPU): nothing to check."
  note "Run this script on a machine with an NVIDIA GPU and driver."
  finish 2
fi
if [[ ! -x "$CUDA_HOME/bin/nvcc" ]]; then
  note "no CUDA toolkit at $CUDA_HOME (set CUDA_HOME): the GPU code cannot be built."
  finish 1
fi
note "$(cat "$LOGS/gpus.txt")"
NUM_GPUS=$(grep -c '^GPU ' "$LOGS/gpus.txt")

# --- 1. nvidia-smi ----------------------------------------------------------
step nvidia_smi nvidia-smi

BAZEL=""
for b in /usr/bin/bazel "$(command -v bazel 2>/dev/null)"; do
  if [[ -n "$b" && -x "$b" ]]; then BAZEL=$b; break; fi
done

if [[ -n "$BAZEL" ]]; then
  note "bazel: $BAZEL ($("$BAZEL" --version 2>/dev/null))"
  export CUDA_HOME
  # --- 2. every gpu-tagged test --------------------------------------------
  step gpu_tests "$BAZEL" test --test_tag_filters=gpu --test_output=all \
    --test_env=TRAINYARD_REQUIRE_GPU=1 //...
  # --- 3. the NCCL smoke test, by name ---------------------------------------
  step nccl_smoke "$BAZEL" test --test_output=all \
    --test_env=TRAINYARD_REQUIRE_GPU=1 //core:nccl_transport_test
  if [[ $NUM_GPUS -lt 2 ]]; then
    note "   note: $NUM_GPUS GPU(s): the two-rank NCCL tests are skipped (need 2)"
  fi
  # --- 4. kernel benchmark ---------------------------------------------------
  if "$BAZEL" query //kernels/cuda:mlp_benchmark >/dev/null 2>&1; then
    step kernel_benchmark "$BAZEL" run //kernels/cuda:mlp_benchmark
  else
    skip kernel_benchmark "//kernels/cuda:mlp_benchmark does not exist in this tree"
  fi
else
  note "bazel: not installed; building the NCCL test with g++ directly"
  # --- 2+3 without Bazel: the NCCL test, compiled by hand --------------------
  # The same sources //core:nccl_transport_test builds, with the flags of
  # .bazelrc and the link line of tools/system_libs.bzl (+ @cuda).
  if pkg-config --exists gtest_main absl_status 2>/dev/null; then
    BIN=$LOGS/nccl_transport_test
    step nccl_build g++ -std=c++17 -O2 -ffp-contract=off -Wall \
      -DTRAINYARD_HAVE_NCCL -I"$REPO" -I"$CUDA_HOME/include" \
      core/nccl_transport_test.cc core/nccl_transport.cc core/rendezvous.cc \
      core/tensor.cc core/transport.cc -o "$BIN" \
      $(pkg-config --cflags --libs gtest_main gmock absl_status absl_statusor \
        absl_strings absl_str_format absl_synchronization absl_time) \
      -lglog -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" \
      -lcudart -lnccl -lpthread
    if [[ -x "$BIN" ]]; then
      step nccl_smoke env TRAINYARD_REQUIRE_GPU=1 "$BIN"
    fi
  else
    skip nccl_smoke "no Bazel and no Abseil/GoogleTest dev packages (pkg-config gtest_main absl_status); install bazel or libgtest-dev libabsl-dev libgoogle-glog-dev, or run tools/setup.sh"
  fi
  skip gpu_tests "other gpu-tagged tests (kernels/cuda) need Bazel: bazel test --test_tag_filters=gpu //..."
  skip kernel_benchmark "needs Bazel: bazel run //kernels/cuda:mlp_benchmark (see kernels/cuda/BUILD.bazel for its sources and copts)"
fi

# --- 5. PyTorch reference --------------------------------------------------
PY=${PYTHON:-python3}
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; then
  step torch_reference "$PY" tools/bench_gpu_mlp.py
  [[ -f "$LOGS/torch_reference.log" ]] && grep '^{' "$LOGS/torch_reference.log" \
    >"$LOGS/torch_reference.jsonl" || true
else
  skip torch_reference "$PY has no torch with CUDA ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
fi

if [[ $FAILED -eq 0 ]]; then note "RESULT: every step that ran passed"; else note "RESULT: some steps FAILED"; fi
finish "$FAILED"
