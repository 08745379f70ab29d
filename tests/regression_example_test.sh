#!/usr/bin/env bash
# The regression example (synthetic teacher, MSE, SGD + nesterov, 2 stages,
# GPipe) fits: eval loss falls well below the untrained model's.
set -euo pipefail
trainyard="$1"
spec="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/regression.jsonl"
"$trainyard" train --spec "$spec" --metrics_out "$out" --threads 1
/usr/bin/python3 - "$out" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "loss" in l]
evals = [l for l in lines if "eval_loss" in l]
assert len(steps) == 300, len(steps)
first, last = steps[0]["loss"], evals[-1]["eval_loss"]
print(f"step 1 train loss {first:.5f}; final eval loss {last:.5f} "
      f"(ratio {last / first:.4f})")
assert last < 0.1 * first, "regression did not fit"
PY
