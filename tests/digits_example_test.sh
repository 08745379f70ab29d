#!/usr/bin/env bash
# The README's main job: the digits example trains across 3 pipeline stages
# to >= 95% eval accuracy, and its loss goes down.
set -euo pipefail
trainyard="$1"
spec="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/digits.jsonl"
"$trainyard" train --spec "$spec" --metrics_out "$out" --threads 1
/usr/bin/python3 - "$out" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "loss" in l]
evals = [l for l in lines if "eval_loss" in l]
assert len(steps) == 300, f"expected 300 step lines, got {len(steps)}"
assert [s["step"] for s in steps] == list(range(1, 301)), "steps out of order"
first = sum(s["loss"] for s in steps[:10]) / 10
last = sum(s["loss"] for s in steps[-10:]) / 10
print(f"mean loss of steps 1-10: {first:.4f}, of steps 291-300: {last:.4f}")
assert last < 0.5 * first, "loss did not go down"
final = evals[-1]
print(f"final eval: step {final['step']} accuracy {final['eval_accuracy']:.4f} "
      f"on {final['eval_samples']} samples")
assert final["step"] == 300
assert final["eval_samples"] == 360
assert final["eval_accuracy"] >= 0.95, "eval accuracy below 95%"
PY
