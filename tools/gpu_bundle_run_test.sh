#!/bin/bash
# Without an NVIDIA GPU, the bundle's run.sh and tools/gpu_check.sh stop before
# doing anything else: exit code 2, "no NVIDIA GPU here (<reason>)" on
# stderr, no results folder, no build. With a GPU, gpu_check.sh hands over to
# the bundle's run.sh.
#   gpu_bundle_run_test.sh RUN_SH GPU_CHECK_SH
set -euo pipefail
RUN=$(realpath "$1")
CHECK=$(realpath "$2")
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpu_run_test.XXXXXX")
trap 'rm -rf "$T"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# A PATH with what the scripts need but no nvidia-smi, plus a bazel that
# leaves a mark when called, and fake nvidia-smi variants.
mkdir -p "$T/bin" "$T/no_gpus" "$T/broken" "$T/one_gpu" "$T/bundle"
for tool in bash env dirname timeout head grep cat; do
  ln -s "$(command -v "$tool")" "$T/bin/$tool"
done
printf '#!/bin/sh\ntouch %s/bazel_was_called\nexit 1\n' "$T" >"$T/bin/bazel"
printf '#!/bin/sh\nexit 0\n' >"$T/no_gpus/nvidia-smi"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn'"'"'t communicate with the NVIDIA driver."\nexit 9\n' \
  >"$T/broken/nvidia-smi"
printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n' >"$T/one_gpu/nvidia-smi"
printf '#!/bin/sh\necho "fake run.sh: $*"\nexit 7\n' >"$T/bundle/run.sh"
chmod +x "$T/bin/bazel" "$T"/*/nvidia-smi "$T/bundle/run.sh"

# expect CASE WANT_RC WANT_TEXT PATH COMMAND...: runs COMMAND with that PATH
# (and RESULTS_DIR $T/results) and checks its exit code and output.
expect() {
  local name=$1 want_rc=$2 want=$3 path=$4 rc=0
  shift 4
  rm -rf "$T/results" "$T/bazel_was_called"
  env -i PATH="$path" HOME="$T" TMPDIR="$T" "$@" "$T/results" >"$T/out" 2>&1 || rc=$?
  if [[ $rc != "$want_rc" ]]; then
    fail "$name: exit code $rc, want $want_rc; output:"
    cat "$T/out" >&2
  elif ! grep -qF -- "$want" "$T/out"; then
    fail "$name: output lacks '$want'; output:"
    cat "$T/out" >&2
  else
    echo "ok: $name: exit $rc, '$want'"
  fi
  if [[ $want_rc == 2 && -e $T/results ]]; then fail "$name: created $T/results"; fi
  if [[ -e $T/bazel_was_called ]]; then fail "$name: called bazel"; fi
}

expect "run.sh, no nvidia-smi" 2 "no NVIDIA GPU here (nvidia-smi not found on PATH)" \
  "$T/bin" "$RUN"
expect "run.sh, nvidia-smi lists nothing" 2 "no NVIDIA GPU here (nvidia-smi -L lists no GPU)" \
  "$T/no_gpus:$T/bin" "$RUN"
expect "run.sh, nvidia-smi fails" 2 \
  "no NVIDIA GPU here (nvidia-smi -L failed: NVIDIA-SMI has failed because it couldn't communicate" \
  "$T/broken:$T/bin" "$RUN"
expect "gpu_check.sh, no nvidia-smi" 2 "no NVIDIA GPU here (nvidia-smi not found on PATH)" \
  "$T/bin" "$CHECK"
expect "gpu_check.sh --bundle, nvidia-smi lists nothing" 2 \
  "no NVIDIA GPU here (nvidia-smi -L lists no GPU)" "$T/no_gpus:$T/bin" \
  "$CHECK" --bundle "$T/bundle"
# Positive control: with a GPU listed, gpu_check.sh runs the bundle's run.sh
# with the remaining arguments and returns its exit code.
expect "gpu_check.sh --bundle, one GPU" 7 "fake run.sh: $T/results" \
  "$T/one_gpu:$T/bin" "$CHECK" --bundle "$T/bundle"
expect "gpu_check.sh, one GPU, not a bundle" 1 "$T/bin/run.sh missing: not a bundle" \
  "$T/one_gpu:$T/bin" "$CHECK" --bundle "$T/bin"

if ((failures)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "PASS"
