#!/bin/bash
# tools/gpu_compare.py, as the bundle's run.sh uses it: a loss difference
# above the tolerance fails (exit 1, naming the step), one below passes;
# missing steps, a NaN loss and a low final accuracy fail; --first-steps
# holds only the first steps to the tolerance and --same-final-accuracy
# wants the reference's accuracy; the 4-block spec variant keeps the widths
# and makes data paths absolute; the benchmark table sets full training
# steps side by side.
#   gpu_compare_test.sh GPU_COMPARE_PY DIGITS_JSON
set -euo pipefail
CMP=$(realpath "$1")
DIGITS=$(realpath "$2")
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpu_compare_test.XXXXXX")
trap 'rm -rf "$T"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

cat >"$T/ref.jsonl" <<'EOF'
{"step":1,"loss":2.5,"lr":0.001,"grad_norm":1.5,"samples_per_sec":100.0}
{"step":2,"loss":2.0,"lr":0.001,"grad_norm":1.25,"samples_per_sec":100.0}
{"step":2,"eval_loss":1.9,"eval_samples":100,"eval_accuracy":0.96}
{"step":3,"loss":1.5,"lr":0.001,"grad_norm":1,"samples_per_sec":100.0}
EOF
# 4e-7 relative at step 2: inside 1e-5.
sed 's/"loss":2.0,/"loss":2.0000008,/' "$T/ref.jsonl" >"$T/close.jsonl"
# 5e-4 relative at step 2: outside 1e-5, inside 1e-2.
sed 's/"loss":2.0,/"loss":2.001,/' "$T/ref.jsonl" >"$T/off.jsonl"
grep -v '"step":3,' "$T/ref.jsonl" >"$T/short.jsonl"
sed 's/"loss":1.5,/"loss":nan,/' "$T/ref.jsonl" >"$T/nan.jsonl"
sed 's/"eval_accuracy":0.96/"eval_accuracy":0.9/' "$T/ref.jsonl" >"$T/weak.jsonl"

# expect NAME WANT_RC WANT_TEXT ARGS...
expect() {
  local name=$1 want_rc=$2 want=$3 rc=0 out
  shift 3
  out=$(python3 "$CMP" "$@" 2>&1) || rc=$?
  if [[ $rc != "$want_rc" ]]; then
    fail "$name: exit code $rc, want $want_rc: $out"
  elif [[ $out != *"$want"* ]]; then
    fail "$name: output lacks '$want': $out"
  else
    echo "ok: $name: $out"
  fi
}

expect "identical" 0 "PASS: 3 steps, max relative loss difference 0" \
  compare "$T/ref.jsonl" "$T/ref.jsonl" --rtol 1e-5
expect "below tolerance" 0 "PASS: 3 steps, max relative loss difference 4e-07 at step 2" \
  compare "$T/ref.jsonl" "$T/close.jsonl" --rtol 1e-5
expect "above tolerance" 1 "FAIL: off.jsonl step 2 loss 2.001 vs reference 2: relative difference 0.0005 > 1e-05" \
  compare "$T/ref.jsonl" "$T/off.jsonl" --rtol 1e-5
expect "bf16 tolerance" 0 "PASS: 3 steps, max relative loss difference 0.0005 at step 2 (tolerance 0.01); last eval_accuracy 0.9600" \
  compare "$T/ref.jsonl" "$T/off.jsonl" --rtol 1e-2 --min-final-accuracy 0.95
expect "missing step" 1 "FAIL: short.jsonl ran 2 of the reference's 3 steps; first missing step 3" \
  compare "$T/ref.jsonl" "$T/short.jsonl" --rtol 1e-5
expect "nan loss" 1 "FAIL: nan.jsonl step 3 loss is nan" \
  compare "$T/ref.jsonl" "$T/nan.jsonl" --rtol 1e-5
expect "low accuracy" 1 "FAIL: weak.jsonl last eval_accuracy 0.9000 < 0.95" \
  compare "$T/ref.jsonl" "$T/weak.jsonl" --rtol 1e-5 --min-final-accuracy 0.95
expect "unreadable" 2 "FAIL: " compare "$T/ref.jsonl" "$T/absent.jsonl" --rtol 1e-5
# 5e-4 at step 2, after the first step: only step 1 is held to 1e-5.
expect "first steps" 0 "PASS: 3 steps; the first 1 within 1e-05 (max relative loss difference 0 at step 1); last eval_accuracy 0.9600 (the reference's)" \
  compare "$T/ref.jsonl" "$T/off.jsonl" --rtol 1e-5 --first-steps 1 --same-final-accuracy
expect "first steps, still too far" 1 "FAIL: off.jsonl step 2 loss 2.001" \
  compare "$T/ref.jsonl" "$T/off.jsonl" --rtol 1e-5 --first-steps 2
expect "first steps, a later nan" 1 "FAIL: nan.jsonl step 3 loss is nan" \
  compare "$T/ref.jsonl" "$T/nan.jsonl" --rtol 1e-5 --first-steps 1
expect "another final accuracy" 1 "FAIL: weak.jsonl last eval_accuracy 0.9000, the reference's 0.9600" \
  compare "$T/ref.jsonl" "$T/weak.jsonl" --rtol 1e-5 --first-steps 1 --same-final-accuracy

cat >"$T/torch.jsonl" <<'EOF'
{"bench": "gemm_bf16", "mode": "bf16", "tflops": 700.0}
{"bench": "train_step", "mode": "bf16", "step_ms": 100.0, "mfu": 0.53, "tflops": 525.0}
EOF
cat >"$T/kernels.jsonl" <<'EOF'
{"bench": "gemm", "mode": "bf16", "tflops": 770.0}
EOF
cat >"$T/step.jsonl" <<'EOF'
{"bench": "train_step", "mode": "bf16", "step_ms": 80.0, "mfu": 0.66, "tflops": 656.3}
{"bench": "train_step_4blocks_4stages", "mode": "bf16", "step_ms": 170.0, "mfu": 0.62}
EOF
expect "bench gemm" 0 "gemm                       bf16           770.0          700.0    1.10" \
  bench "$T/torch.jsonl" "$T/kernels.jsonl" "$T/step.jsonl"
expect "bench train step" 0 "train_step                 bf16         80.00    0.660       100.00    0.530   1.25" \
  bench "$T/torch.jsonl" "$T/kernels.jsonl" "$T/step.jsonl"
expect "bench train step without torch" 0 "train_step_4blocks_4stages bf16        170.00    0.620            -        -      -" \
  bench "$T/torch.jsonl" "$T/kernels.jsonl" "$T/step.jsonl"

expect "4-block spec" 0 "4 blocks, 4 stages, device cuda" \
  spec "$DIGITS" "$T/spec4.json" --blocks 4 --stages 4 --device cuda --precision fp32
python3 - "$T/spec4.json" "$(dirname "$DIGITS")" <<'EOF' || fail "4-block spec content"
import json, os, sys
spec = json.load(open(sys.argv[1]))
blocks = spec["model"]["blocks"]
widths = [b["outFeatures"] for b in blocks]
assert widths == [128, 128, 128, 10], widths
assert blocks[2] == blocks[1] and blocks[2]["residual"], blocks
assert spec["parallelism"]["stages"] == 4, spec["parallelism"]
assert spec["device"] == "cuda" and spec["precision"] == "fp32"
path = spec["data"]["train"]["npy"]["features"]
assert path == os.path.join(sys.argv[2], "digits/train_features.npy"), path
print("ok: 4-block spec content")
EOF

if ((failures)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "PASS"
