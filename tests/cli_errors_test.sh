#!/usr/bin/env bash
# `trainyard train` reports bad input clearly and with the right exit code.
set -uo pipefail
trainyard="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
expect() {  # expect NAME EXIT_CODE PATTERN... -- ARGS...
  local name="$1" code="$2"; shift 2
  local patterns=()
  while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
  shift
  "$trainyard" "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" != "$code" ]; then
    echo "FAIL $name: exit $got, want $code"; cat "$tmp/err"; fail=1; return
  fi
  for p in "${patterns[@]}"; do
    if ! grep -qF -- "$p" "$tmp/err"; then
      echo "FAIL $name: stderr lacks: $p"; cat "$tmp/err"; fail=1; return
    fi
  done
  echo "ok $name"
}

cat >"$tmp/bad.json" <<'JSON'
{"steps": 0,
 "model": {"blocks": [{"outFeatures": 4, "ffnHiddenSize": -4, "activation": "tanh"}]},
 "parallelism": {"schedule": "zb"},
 "optimizer": {"lr": 0.1},
 "task": {"plugin": "mse"},
 "data": {"train": {"npy": {"features": "nope.npy", "targets": "nope_y.npy"}}, "batchSize": 8}}
JSON
expect bad_spec 2 "model.blocks[0].ffn_hidden_size" "got -4" "parallelism.schedule" "steps" "nope.npy" -- \
  train --spec "$tmp/bad.json"

echo '{"stepz": 3}' >"$tmp/typo.json"
expect unknown_field 2 "typo.json" "stepz" -- train --spec "$tmp/typo.json"

expect missing_spec 2 "does_not_exist.json" -- train --spec "$tmp/does_not_exist.json"
expect no_spec 2 "--spec is required" -- train
expect unknown_command 2 "unknown command \"fly\"" -- fly

cat >"$tmp/plugin.json" <<'JSON'
{"steps": 2,
 "model": {"blocks": [{"outFeatures": 3, "ffnHiddenSize": 8}]},
 "optimizer": {"lr": 0.1},
 "task": {"plugin": "no_such_plugin"},
 "data": {"train": {"synthetic": {"kind": "gaussian_blobs", "numSamples": 64, "numFeatures": 4, "numOutputs": 3, "noise": 1}},
          "batchSize": 8}}
JSON
expect unknown_plugin 1 "no_such_plugin" "libno_such_plugin.so" -- train --spec "$tmp/plugin.json"

expect bad_device 2 '--device: device "gpu": expected "cpu" or "cuda:N"' -- \
  train --spec "$tmp/plugin.json" --device gpu
expect bf16_on_cpu 2 'precision: bf16 needs device "cuda" (or "sim"), got device "cpu"' -- \
  train --spec "$tmp/plugin.json" --precision bf16
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  # No GPU here: a GPU job fails at once, saying why (not a crash, no hang).
  expect no_gpu 1 "cuda:0 is not usable" -- \
    train --spec "$tmp/plugin.json" --device cuda:0
else
  echo "skip no_gpu: this machine has a GPU"
fi

# No controller listening: submit fails fast (exit 3), it does not wait out
# its deadline.
cat >"$tmp/ok.json" <<'JSON'
{"steps": 2,
 "model": {"blocks": [{"outFeatures": 3, "ffnHiddenSize": 8}]},
 "optimizer": {"lr": 0.1},
 "task": {"plugin": "cross_entropy"},
 "data": {"train": {"synthetic": {"kind": "gaussian_blobs", "numSamples": 64, "numFeatures": 4, "numOutputs": 3, "noise": 1}},
          "batchSize": 8}}
JSON
start=$SECONDS
expect submit_no_controller 3 "127.0.0.1:1" "add --request_id" -- \
  submit --controller 127.0.0.1:1 --spec "$tmp/ok.json"
if [ $((SECONDS - start)) -gt 5 ]; then
  echo "FAIL submit_no_controller: took $((SECONDS - start)) s (limit 5)"; fail=1
fi

exit $fail
