#!/usr/bin/env bash
# Checkpoint cost: `trainyard train` wall time with and without checkpoints,
# for one or more builds side by side (interleaved rounds, same data).
#
#   tools/bench_checkpoints.sh [ROUNDS] NAME=BAZEL_BIN [NAME=BAZEL_BIN ...]
#   e.g. tools/bench_checkpoints.sh 3 new=$(bazel info bazel-bin)
#
# Model: 4 blocks h=1024, ffn=4096 (33.6M parameters), 2 stages, 2
# microbatches, batch 256, AdamW, MSE on 2048 random rows; 40 steps; a
# checkpoint every 5 steps (402 MB per checkpoint: parameters + AdamW
# state), keep_last 2. Needs /usr/bin/python3 with numpy (data). Prints one
# line per run and, per build, the mean overhead of checkpointing. Every run
# must print the same losses (checked).
set -euo pipefail
rounds=3
if [[ ${1:-} =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
[[ $# -ge 1 ]] || { echo "usage: $0 [ROUNDS] NAME=BAZEL_BIN ..." >&2; exit 2; }
work=$(mktemp -d /tmp/trainyard-ckpt-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
/usr/bin/python3 - <<'PY'
import json
import numpy as np
rng = np.random.default_rng(1)
np.save("x.npy", rng.standard_normal((2048, 1024)).astype(np.float32))
np.save("y.npy", rng.standard_normal((2048, 1024)).astype(np.float32))
base = {"name": "ckpt-bench", "steps": 40, "seed": 1,
        "model": {"blocks": [{"outFeatures": 1024, "ffnHiddenSize": 4096}] * 4},
        "parallelism": {"stages": 2, "microbatches": 2, "schedule": "1f1b"},
        "optimizer": {"type": "adamw", "lr": 1e-4, "clipGrad": 1.0},
        "task": {"plugin": "mse"},
        "data": {"train": {"npy": {"features": "x.npy", "targets": "y.npy"}},
                 "batchSize": 256, "shuffle": True}}
json.dump(base, open("none.json", "w"))
base["checkpoint"] = {"dir": "ck", "every": 5, "keepLast": 2}
json.dump(base, open("ckpt.json", "w"))
PY
declare -A sum
for ((r = 1; r <= rounds; r++)); do
  for build in "$@"; do
    name=${build%%=*} bin=${build#*=}
    for s in none ckpt; do
      rm -rf ck
      t0=$(date +%s.%N)
      env -u OPENBLAS_CORETYPE "$bin/cli/trainyard" train \
        --spec "$work/$s.json" --plugin_dir "$bin/task_plugins" --threads 2 \
        --metrics_out "$work/$name-$s.jsonl" 2>/dev/null
      t=$(echo "$(date +%s.%N) - $t0" | bc)
      sum[$name-$s]=$(echo "${sum[$name-$s]:-0} + $t" | bc)
      echo "round $r $name $s: $t s"
      sed -E 's/"samples_per_sec":[0-9.]+,//' "$work/$name-$s.jsonl" | md5sum |
        cut -d' ' -f1 >>"$work/losses"
    done
  done
done
[[ $(sort -u "$work/losses" | wc -l) -eq 1 ]] ||
  { echo "FAIL: runs printed different losses" >&2; exit 1; }
for build in "$@"; do
  name=${build%%=*}
  echo "$name: no checkpoints $(echo "scale=2; ${sum[$name-none]} / $rounds" | bc) s," \
    "checkpoints $(echo "scale=2; ${sum[$name-ckpt]} / $rounds" | bc) s," \
    "overhead $(echo "scale=0; 100 * (${sum[$name-ckpt]} - ${sum[$name-none]}) / ${sum[$name-none]}" | bc)%"
done
echo "every run printed the same losses"
