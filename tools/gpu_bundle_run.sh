#!/usr/bin/env bash
# Checks Trainyard's GPU path from a bundle made by tools/gpu_bundle.sh (this
# file is the bundle's run.sh). The GPU machine needs only the NVIDIA driver,
# CUDA 13 runtime libraries (cudart, cuBLAS, cuBLASLt, NCCL) in
# /usr/local/cuda/lib64, $CUDA_HOME/lib64 or a python's
# site-packages/nvidia/{cu13,nccl}/lib, bash with coreutils, and python3 (any,
# standard library only) for the comparisons:
#
#   run.sh [RESULTS_DIR]          # default $OUT, else ./gpu-results
#
# Steps, each under a timeout and logged to its own file:
#   nvidia_smi, runtime_libs      the GPU; ldd finds every library
#   //<package>:<test>            every gpu-tagged test, TRAINYARD_REQUIRE_GPU=1;
#                                 a skipped test fails, unless it was skipped
#                                 for needing more GPUs than this machine has
#   job_cpu                       trainyard train examples/digits.json --device cpu
#   job_cuda_fp32                 --device cuda:0 --precision fp32: loss within
#                                 1e-5 relative of job_cpu for the first 50
#                                 steps (training is chaotic: later steps
#                                 drift by rounding), the same final
#                                 eval_accuracy
#   job_cuda_bf16                 --precision bf16: within 5e-2 for the first
#                                 20 steps, last eval_accuracy >= 0.95
#   job_cuda_4stages              --stages 4 on cuda:0 (a 4-block variant of
#                                 the spec if digits' 3 blocks are refused),
#                                 held to the CPU run of the same spec: the
#                                 first 30 steps within 1e-5 (two CPU runs
#                                 of the 4-block variant that differ only in
#                                 GEMM summation order part by 1e-5 at step
#                                 36), last eval_accuracy >= 0.95
#   job_cluster_4workers          trainyard up: a controller and 4 workers on
#                                 cuda:0 started as a user's are (TLS and
#                                 tokens on), a 4-stage job run to SUCCEEDED
#   bench_kernels, //<pkg>:<name> mlp_benchmark (and any other GPU benchmark)
#   bench_torch                   tools/bench_gpu_mlp.py, when a python has
#                                 torch with CUDA (tried: python3,
#                                 /opt/torch/.venv/bin/python)
#   bench_infer                   tools/bench_inference.py --device cuda: an
#                                 inference job's rows/s (2 blocks, h=8192,
#                                 bf16) next to torch.inference_mode, same
#                                 python
#   bench_packed_gemm             packed_gemm_benchmark on this machine's CPU:
#                                 its FMA peak (--peak), then the packed
#                                 GEMM on its default kernel
#                                 against OpenBLAS, and against the AVX2
#                                 kernel (where the CPU has AVX-512)
#   bench_cpu_step                tools/bench_cpu_step.py: the CPU training
#                                 step (M = 1, 2, 4, 8; 2 threads; the packed
#                                 GEMM on this CPU's kernel and on AVX2, and
#                                 OpenBLAS alone) next to that python's torch
#                                 on this machine's CPU
#   bench_cpu_optimizer           optimizer_benchmark on this machine's CPU:
#                                 AdamW, SGD and the gradient's sums of
#                                 squares on 2 threads against a memcpy and a
#                                 loop with their own memory traffic
#   bench_gemm_libs               tools/gemm_libs on this machine's CPU: the
#                                 block's GEMMs through OpenBLAS, BLIS,
#                                 oneDNN, libxsmm and our packed GEMM, 1 and
#                                 2 threads, four blocks' weights streaming
#                                 (SKIPPED when the bundle has no
#                                 bin/gemm_libs)
# RESULTS_DIR gets summary.txt (one row per step: PASS/FAIL/SKIPPED, seconds,
# detail; the benchmarks side by side) and gpu-results.tar.gz (every log,
# metric file and spec). Exit: 0 when every step that ran passed, 1 otherwise,
# 2 when there is no NVIDIA GPU. Every process it starts is stopped on exit.
#
# Environment: TY_TEST_TIMEOUT, TY_JOB_TIMEOUT, TY_BENCH_TIMEOUT: seconds per
# step (default 300 each); TY_DEADLINE: seconds for the whole run (default 0:
# none), after which running steps are cut and later ones SKIPPED, so that a
# machine lent for a fixed time still gets the summary (use 540 for 600 s);
# TY_CPU_ROUNDS: bench_cpu_step's rounds (default 2, about a minute each on
# an H200 machine's CPU; the rounds of one run move by up to 40%, so take
# more where the lease allows, with TY_BENCH_TIMEOUT to match);
# TY_ONLY: an extended regular expression, run only the steps whose names
# match it (the others are not listed), e.g. 'nvidia_smi|sharded|bench_infer'.

# Step functions are called through `step NAME FUNC`:
# shellcheck disable=SC2317
set -uo pipefail # no -e: a failing step is recorded and the next one runs

no_gpu() {
  echo "no NVIDIA GPU here ($1)" >&2
  exit 2
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found on PATH"
GPUS=$(timeout 60 nvidia-smi -L 2>&1) || no_gpu "nvidia-smi -L failed: $(head -n 1 <<<"$GPUS")"
grep -q '^GPU [0-9]' <<<"$GPUS" || no_gpu "nvidia-smi -L lists no GPU"
NUM_GPUS=$(grep -c '^GPU [0-9]' <<<"$GPUS")

HERE=$(cd "$(dirname "$0")" && pwd)
RESULTS=${1:-${OUT:-$PWD/gpu-results}}
mkdir -p "$RESULTS" && RESULTS=$(cd "$RESULTS" && pwd) || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-gpu-run.XXXXXX") || exit 1
LOGS=$WORK/gpu-results # packed into the tarball
mkdir -p "$LOGS"
echo "$GPUS" >"$LOGS/gpus.txt"
cd "$HERE" || exit 1
TY_TEST_TIMEOUT=${TY_TEST_TIMEOUT:-300}
TY_JOB_TIMEOUT=${TY_JOB_TIMEOUT:-300}
TY_BENCH_TIMEOUT=${TY_BENCH_TIMEOUT:-300}
TY_DEADLINE=${TY_DEADLINE:-0}
TY_CPU_ROUNDS=${TY_CPU_ROUNDS:-2}
TY_ONLY=${TY_ONLY:-}
T0=$SECONDS

# --- libraries: the bundle's, then CUDA's wherever they are -----------------
ORIG_LD=${LD_LIBRARY_PATH-}
LIB_DIRS=("$HERE/lib")
add_dir() {
  local d
  [[ -d $1 ]] || return 0
  for d in "${LIB_DIRS[@]}"; do [[ $d -ef $1 ]] && return 0; done
  LIB_DIRS+=("$1")
}
[[ -n ${CUDA_HOME:-} ]] && add_dir "$CUDA_HOME/lib64"
add_dir /usr/local/cuda/lib64
for py in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  while read -r sp; do
    add_dir "$sp/nvidia/cu13/lib"
    add_dir "$sp/nvidia/nccl/lib"
  done < <(LD_LIBRARY_PATH=$ORIG_LD timeout 60 "$py" -c \
    'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
done
add_dir /usr/lib/x86_64-linux-gnu
LD_LIBRARY_PATH=$(IFS=:; echo "${LIB_DIRS[*]}")
export LD_LIBRARY_PATH

# A python for gpu_compare.py (standard library only), run without our libs.
PY=""
for py in python3 /opt/torch/.venv/bin/python3 /opt/torch/.venv/bin/python; do
  if command -v "$py" >/dev/null 2>&1; then PY=$py && break; fi
done
py() {
  if [[ -z $PY ]]; then
    echo "no python3 on this machine"
    return 2
  fi
  LD_LIBRARY_PATH=$ORIG_LD "$PY" "$HERE/tools/gpu_compare.py" "$@"
}

# --- step bookkeeping -------------------------------------------------------
NAMES=() STATUSES=() TIMES=() DETAILS=()
FAILED=0 CHILD="" DAEMONS=() DETAIL="" STEP="" STEP_LOG=/dev/null FINISHED=0

record() {
  NAMES+=("$1") STATUSES+=("$2") TIMES+=("$3") DETAILS+=("$4")
  if [[ $2 == FAIL ]]; then FAILED=1; fi
  printf '%-44s %-7s %5s s  %s\n' "$1" "$2" "$3" "$4" >&3
}

last_line() { grep -v '^[[:space:]]*$' | tail -n 1 | tr '\t' ' ' | cut -c1-200; }

deadline_passed() { ((TY_DEADLINE > 0 && SECONDS - T0 >= TY_DEADLINE)); }

# cap SECONDS: SECONDS, or less when TY_DEADLINE is nearer.
cap() {
  local left=$((T0 + TY_DEADLINE - SECONDS))
  if ((TY_DEADLINE > 0 && left < $1)); then echo $((left > 1 ? left : 1)); else echo "$1"; fi
}

# step NAME FUNC ARGS...: FUNC's output goes to NAME's log; it returns 0
# (PASS), 3 (SKIPPED) or anything else (FAIL) and may set DETAIL.
step() {
  local name=$1 start=$SECONDS rc status=FAIL
  shift
  if [[ -n $TY_ONLY ]] && ! [[ $name =~ $TY_ONLY ]]; then return; fi
  if deadline_passed; then
    record "$name" SKIPPED 0 "TY_DEADLINE=$TY_DEADLINE s reached"
    return
  fi
  DETAIL=""
  STEP=$name
  STEP_LOG=${name#//}
  STEP_LOG=$LOGS/${STEP_LOG//[^A-Za-z0-9_.-]/_}.log
  "$@" >"$STEP_LOG" 2>&1
  rc=$?
  if ((rc == 0)); then status=PASS; elif ((rc == 3)); then status=SKIPPED; fi
  [[ -n $DETAIL ]] || DETAIL=$(last_line <"$STEP_LOG")
  STEP=""
  record "$name" "$status" $((SECONDS - start)) "$DETAIL"
}

# run TIMEOUT CMD...: CMD under a timeout, output into the step's log. On
# failure DETAIL becomes the command's own last line of output, or says that
# it timed out. Waits in the background so that a signal is handled at once.
run() {
  local t rc from what
  t=$(cap "$1")
  shift
  what=$(printf '%s\n' "$@" | grep -v -e '^env$' -e '^[A-Z_]*=' | head -n 1)
  what=${what##*/}
  echo "+ $*"
  from=$(($(stat -c %s "$STEP_LOG") + 1))
  timeout -k 10 "$t" "$@" &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=""
  if ((rc == 124 || rc == 137)); then
    DETAIL="$what timed out after $t s"
  elif ((rc != 0)); then
    DETAIL="$what exit $rc: $(tail -c +"$from" "$STEP_LOG" | last_line)"
  fi
  return "$rc"
}

stop_daemons() {
  local p i
  ((${#DAEMONS[@]})) || return 0
  kill -TERM "${DAEMONS[@]}" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    kill -0 "${DAEMONS[@]}" 2>/dev/null || break
    sleep 0.1
  done
  for p in "${DAEMONS[@]}"; do
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  DAEMONS=()
}

cleanup() {
  if [[ -n $CHILD ]]; then
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
    CHILD=""
  fi
  stop_daemons
}

# --- steps --------------------------------------------------------------------
nvidia_smi() {
  run 60 nvidia-smi || return 1
  DETAIL=$(timeout 60 nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>&1 | head -n 1)
}

runtime_libs() {
  local f bad=()
  while read -r f; do
    if ldd "$f" 2>&1 | grep -q 'not found'; then
      bad+=("${f#"$HERE"/}: $(ldd "$f" | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')")
    fi
  done < <(find bin plugins lib -name '*.runfiles' -prune -o -type f -print | sort)
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$HERE/$(head -n 1 gpu_tests.txt | cut -d' ' -f1)" | grep -E 'libcudart|libcublas|libnccl'
  if ((${#bad[@]})); then
    printf 'missing: %s\n' "${bad[@]}"
    DETAIL="libraries not found: ${bad[0]}$( ((${#bad[@]} > 1)) && echo " (+$((${#bad[@]} - 1)) files)")"
    return 1
  fi
  DETAIL="ldd finds every library of $(find bin plugins lib -name '*.runfiles' -prune -o -type f -print | wc -l) files"
}

# gpu_test PATH: one gtest binary. A [ SKIPPED ] test is a failure, unless
# its reason is "needs N CUDA devices, this machine has M" with M >= 1.
gpu_test() {
  local bin=$HERE/$1 rf=$HERE/$1.runfiles tmp rc skipped hw ws
  tmp=$WORK/tmp/${1//\//_}
  mkdir -p "$tmp"
  local env=(TRAINYARD_REQUIRE_GPU=1 TEST_TMPDIR="$tmp")
  if [[ -d $rf ]]; then
    ws=$(find "$rf" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | head -n 1)
    env+=(TEST_SRCDIR="$rf" RUNFILES_DIR="$rf" TEST_WORKSPACE="$ws")
    cd "$rf/$ws" || return 1
  fi
  run "$TY_TEST_TIMEOUT" env "${env[@]}" "$bin"
  rc=$?
  cd "$HERE" || return 1
  if ((rc == 124 || rc == 137)); then
    local last
    last=$(grep '^\[ RUN' "$STEP_LOG" | tail -n 1 | awk '{print $NF}')
    [[ -n $last ]] && DETAIL="$DETAIL, in $last"
    return 1
  elif ((rc != 0)); then
    local failed why
    failed=$(grep -oE '^\[  FAILED  \] [^ ]+\.[^ ]+' "$STEP_LOG" | awk '{print $NF}' | sort -u)
    # gtest prints "file:line: Failure", then ("Failed" and) the message.
    why=$(awk 'f && $0 != "Failed" && NF {print; exit} /: Failure$/ {f = 1}' "$STEP_LOG" | cut -c1-160)
    if [[ -n $failed ]]; then
      DETAIL="$(grep -c . <<<"$failed") failed ($(head -n 2 <<<"$failed" | paste -sd' ')...): $why"
    fi
    return 1
  fi
  skipped=$(grep -oE '^\[ *SKIPPED *\] [^ ]+\.[^ ]+' "$STEP_LOG" | awk '{print $NF}' | sort -u | wc -l)
  hw=$(grep -cE '^needs [0-9]+ CUDA devices, this machine has [1-9][0-9]*$' "$STEP_LOG")
  DETAIL=$(grep -E '^\[  PASSED  \]' "$STEP_LOG" | tail -n 1 | sed 's/^\[  PASSED  \] //; s/\.$/ passed/')
  if ((skipped > 0 && hw >= skipped)); then
    DETAIL="$DETAIL; $skipped skipped: need more GPUs than this machine's $NUM_GPUS"
  elif ((skipped > 0)); then
    DETAIL="$skipped test(s) SKIPPED: $(grep -A1 ': Skipped$' "$STEP_LOG" | grep -v ': Skipped$' | grep -v '^--' | grep -v '^needs [0-9]* CUDA devices' | head -n 1)"
    return 1
  fi
}

SPEC=$HERE/examples/digits.json

# train NAME ARGS...: trainyard train, metrics into NAME.jsonl.
train() {
  local name=$1
  shift
  run "$TY_JOB_TIMEOUT" "$HERE/bin/trainyard" train --plugin_dir "$HERE/plugins" \
    --metrics_out "$LOGS/$name.jsonl" "$@"
}

# compare REF GOT RTOL FIRST_STEPS [gpu_compare.py compare flags...]
compare() {
  if [[ ! -s $LOGS/$1.jsonl ]]; then
    DETAIL="ran, but there is no reference to compare with ($1 failed)"
    return 1
  fi
  DETAIL=$(py compare "$LOGS/$1.jsonl" "$LOGS/$2.jsonl" --rtol "$3" \
    --first-steps "$4" "${@:5}" 2>&1 | last_line)
  echo "$DETAIL"
  [[ $DETAIL == PASS:* ]] || return 1
  DETAIL=${DETAIL#PASS: }
}

job_cpu() {
  train cpu --spec "$SPEC" --device cpu || return 1
  DETAIL=$(py summary "$LOGS/cpu.jsonl")
}

job_cuda() { # NAME PRECISION RTOL FIRST_STEPS [compare flags...]
  train "$1" --spec "$SPEC" --device cuda:0 --precision "$2" || return 1
  compare cpu "$1" "$3" "$4" "${@:5}"
}

job_cuda_4stages() {
  local from ref=cpu spec=$SPEC
  from=$(($(stat -c %s "$STEP_LOG") + 1))
  if ! train cuda_4stages --spec "$spec" --device cuda:0 --precision fp32 --stages 4; then
    tail -c +"$from" "$STEP_LOG" | grep -q 'must be <= the number of blocks' || return 1
    echo "== $spec has fewer blocks than 4 stages: a 4-block variant, with its own CPU reference"
    spec=$LOGS/digits_4blocks.json
    py spec "$SPEC" "$spec" --blocks 4 --stages 4 || return 1
    ref=cpu_4blocks
    train "$ref" --spec "$spec" --device cpu || return 1
    train cuda_4stages --spec "$spec" --device cuda:0 --precision fp32 --stages 4 || return 1
  fi
  # The 4-block variant is more chaotic than digits: two CPU runs of it,
  # OpenBLAS and the packed GEMM (TRAINYARD_PACKED_GEMM=0 and the default),
  # part by 1e-5 at step 36 and can end one eval sample apart; digits' part
  # at step 61 (docs/GPU.md, "Checking a GPU machine").
  compare "$ref" cuda_4stages 1e-5 30 --min-final-accuracy 0.95 || return 1
  [[ $ref == cpu ]] || DETAIL="$DETAIL (4-block variant vs its CPU run)"
}

job_cluster() {
  py spec "$SPEC" "$LOGS/cluster_spec.json" --blocks 4 --stages 4 --device cuda \
    --precision fp32 || return 1
  # As a user starts a cluster: trainyard up makes the certificates and
  # tokens and starts the daemons secure (their logs go under --data_dir).
  # The job's files (digits' .npy) are in the bundle's examples/, which
  # --job_data_dir lets it read; the spec itself is written to the logs.
  run "$TY_JOB_TIMEOUT" "$HERE/bin/trainyard" up --workers 4 --device cuda:0 \
    --controller_bin "$HERE/bin/trainyard-controller" \
    --worker_bin "$HERE/bin/trainyard-worker" --plugin_dir "$HERE/plugins" \
    --data_dir "$WORK/cluster" --job_data_dir "$HERE/examples" \
    --run "$LOGS/cluster_spec.json" || {
    cp -r "$WORK/cluster" "$LOGS/cluster" 2>/dev/null
    return 1
  }
  grep -q 'SUCCEEDED' "$STEP_LOG" || {
    DETAIL="trainyard up ended without SUCCEEDED: $(last_line <"$STEP_LOG")"
    return 1
  }
  DETAIL="4-stage job on 4 workers sharing cuda:0 (TLS, tokens): SUCCEEDED; $(grep 'final eval' "$STEP_LOG" | last_line)"
}

bench() { # NAME BINARY
  run "$TY_BENCH_TIMEOUT" "$2" || return 1
  grep '^{' "$STEP_LOG" >"$LOGS/$1.jsonl"
  DETAIL="$(grep -c . "$LOGS/$1.jsonl") results (table in summary.txt)"
}

# torch_python: the first python with torch on CUDA (its version in WHY);
# returns 3 with WHY saying why when there is none.
torch_python() {
  local p
  WHY=""
  for p in python3 /opt/torch/.venv/bin/python; do
    command -v "$p" >/dev/null 2>&1 || continue
    if WHY=$(LD_LIBRARY_PATH=$ORIG_LD timeout 120 "$p" -c \
      'import torch; assert torch.cuda.is_available(), "torch.cuda.is_available() is False"; print(torch.__version__)' 2>&1); then
      TORCH_PY=$p
      return 0
    fi
  done
  WHY="no python with torch and CUDA (python3, /opt/torch/.venv/bin/python): $(last_line <<<"$WHY")"
  return 3
}

bench_torch() {
  torch_python || { DETAIL=$WHY; return 3; }
  run "$TY_BENCH_TIMEOUT" env LD_LIBRARY_PATH="$ORIG_LD" "$TORCH_PY" "$HERE/tools/bench_gpu_mlp.py" ||
    return 1
  grep '^{' "$STEP_LOG" >"$LOGS/bench_torch.jsonl"
  DETAIL="torch $(last_line <<<"$WHY") ($TORCH_PY): $(grep -c . "$LOGS/bench_torch.jsonl") results"
}

bench_infer() {
  torch_python || { DETAIL=$WHY; return 3; }
  run "$TY_BENCH_TIMEOUT" env LD_LIBRARY_PATH="$ORIG_LD" "$TORCH_PY" \
    "$HERE/tools/bench_inference.py" --device cuda --rounds 2 \
    --trainyard "$HERE/bin/trainyard" --plugin_dir "$HERE/plugins" \
    --ld_library_path "$LD_LIBRARY_PATH" || return 1
  DETAIL=$(grep '^median' "$STEP_LOG" | last_line)
}

# The CPU step (engine/train_step_benchmark's breakdown at M = 1, 4, 8, 2
# threads) against this machine's PyTorch on its CPU: the step's figures on
# another CPU kind (the GPU machines' have AVX-512).
bench_cpu_step() {
  torch_python || { DETAIL=$WHY; return 3; }
  run "$TY_BENCH_TIMEOUT" env LD_LIBRARY_PATH="$ORIG_LD" "$TORCH_PY" \
    "$HERE/tools/bench_cpu_step.py" --rounds "$TY_CPU_ROUNDS" --min_time 1 \
    --gemm packed,avx2,openblas --bench "$HERE/bin/train_step_benchmark" \
    --ld_library_path "$LD_LIBRARY_PATH" || return 1
  DETAIL="$(grep '^machine' "$STEP_LOG" | last_line); $(grep 'M = 4' "$STEP_LOG" | last_line | cut -c1-120)"
}

# This CPU's FMA peak, then the step's GEMMs at 32 to 256 rows: the packed
# GEMM (this CPU's kernel) against OpenBLAS, then, where the CPU has
# AVX-512, the AVX-512 kernel against the AVX2 one (2 threads).
bench_packed_gemm() {
  local b="$HERE/bin/packed_gemm_benchmark" a
  run "$TY_BENCH_TIMEOUT" "$b" --peak || return 1
  for a in "" "--weight_gradients"; do
    run "$TY_BENCH_TIMEOUT" "$b" --microbatches=1,2,4,8 --rounds=5 ${a:+"$a"} || return 1
  done
  if grep -qw avx512f /proc/cpuinfo; then
    for a in "" "--weight_gradients"; do
      run "$TY_BENCH_TIMEOUT" "$b" --kernel=avx512 --baseline=avx2 \
        --microbatches=1,2,4,8 --rounds=5 ${a:+"$a"} || return 1
    done
  fi
  DETAIL="$(grep -m1 'OpenBLAS' "$STEP_LOG" | cut -c1-80); $(grep 'FMA peak, 2' "$STEP_LOG" | last_line); $(grep 'M=8' "$STEP_LOG" | head -n 1 | cut -c1-150)"
}

# The CPU optimizer against this machine's memory bandwidth on 2 threads
# (docs/BENCHMARKS.md, "CPU optimizer vs. memory bandwidth"): the bound the
# step's optimizer part is held to on another CPU kind. About a minute.
bench_cpu_optimizer() {
  run "$TY_BENCH_TIMEOUT" "$HERE/bin/optimizer_benchmark" \
    --benchmark_filter=/2/ --benchmark_min_time=1 --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true || return 1
  DETAIL=$(grep 'adamw/2/.*_median' "$STEP_LOG" | grep -oE '[a-z_]*GB/s=[0-9.]+|x_memcpy=[0-9.]+|x_same_traffic=[0-9.]+' | tr '\n' ' ')
  DETAIL="AdamW, 2 threads: ${DETAIL% }"
}

# The GEMM library survey (docs/BENCHMARKS.md, "GEMM libraries for
# microbatches") on this CPU kind, which decides the library per kind.
bench_gemm_libs() {
  local b="$HERE/bin/gemm_libs"
  [[ -x $b ]] || { DETAIL="the bundle has no bin/gemm_libs (built where BLIS, oneDNN and libxsmm are installed)"; return 3; }
  run "$TY_BENCH_TIMEOUT" "$b" --rounds=3 --blocks=4 || return 1
  DETAIL="$(grep -F '**all six** | 256' "$STEP_LOG" | tail -n 1 | cut -c1-150)"
}

finish() {
  ((FINISHED)) && return
  FINISHED=1
  cleanup
  local i summary=$LOGS/summary.txt
  {
    echo "trainyard GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), $((SECONDS - T0)) s"
    sed -n 's/^commit: /bundle commit: /p; s/^built: /bundle built: /p' "$HERE/MANIFEST.txt"
    sed 's/^/  /' "$LOGS/gpus.txt"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    awk '/=>/ {print "  " $1 " from " $3}' "$LOGS/runtime_libs.log" 2>/dev/null
    echo
    printf '%-44s %-7s %7s  %s\n' STEP RESULT SECONDS DETAIL
    for i in "${!NAMES[@]}"; do
      printf '%-44s %-7s %7s  %s\n' "${NAMES[i]}" "${STATUSES[i]}" "${TIMES[i]}" "${DETAILS[i]}"
    done
    local ours=() f
    for f in "$LOGS"/bench_*.jsonl; do
      [[ -s $f && $f != "$LOGS/bench_torch.jsonl" ]] && ours+=("$f")
    done
    if ((${#ours[@]})) || [[ -s $LOGS/bench_torch.jsonl ]]; then
      echo
      echo "benchmarks side by side (ours: mlp_benchmark and the train-step benchmark; torch: bench_gpu_mlp.py):"
      py bench "$LOGS/bench_torch.jsonl" "${ours[@]:-/dev/null}"
    fi
    echo
    local n_skipped=0 s
    for s in "${STATUSES[@]}"; do [[ $s == SKIPPED ]] && n_skipped=$((n_skipped + 1)); done
    if ((FAILED)); then echo -n "RESULT: some steps FAILED"; else echo -n "RESULT: every step that ran passed"; fi
    echo " (${#NAMES[@]} steps, $n_skipped skipped)"
  } >"$summary" 2>&1
  cp "$summary" "$RESULTS/summary.txt"
  tar -C "$WORK" -czf "$RESULTS/gpu-results.tar.gz" gpu-results
  cat "$summary" >&3
  echo "results: $RESULTS/summary.txt, $RESULTS/gpu-results.tar.gz (unpacked: $LOGS)" >&3
}

on_signal() {
  trap - INT TERM
  cleanup
  record "${STEP:-interrupted}" FAIL 0 "run.sh was stopped by a signal (later steps did not run)"
  finish
  exit 1
}

exec 3>&1 # the console, while step output goes to logs
trap on_signal INT TERM
trap cleanup EXIT

echo "trainyard GPU check: $NUM_GPUS GPU(s); results to $RESULTS"
step nvidia_smi nvidia_smi
step runtime_libs runtime_libs
mapfile -t TESTS <gpu_tests.txt
mapfile -t BENCHES <gpu_benchmarks.txt
for t in "${TESTS[@]}"; do
  step "${t#* }" gpu_test "${t%% *}"
done
step job_cpu job_cpu
step job_cuda_fp32 job_cuda cuda_fp32 fp32 1e-5 50 --same-final-accuracy
step job_cuda_bf16 job_cuda cuda_bf16 bf16 5e-2 20 --min-final-accuracy 0.95
step job_cuda_4stages job_cuda_4stages
step job_cluster_4workers job_cluster
step bench_kernels bench bench_kernels "$HERE/bin/mlp_benchmark"
for t in "${BENCHES[@]}"; do
  b=${t%% *}
  step "${t#* }" bench "bench_${b##*/}" "$HERE/$b"
done
step bench_torch bench_torch
step bench_infer bench_infer
step bench_packed_gemm bench_packed_gemm
step bench_cpu_step bench_cpu_step
step bench_cpu_optimizer bench_cpu_optimizer
step bench_gemm_libs bench_gemm_libs
finish
exit "$FAILED"
