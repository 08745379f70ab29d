#!/bin/bash
# Each task plugin .so given as an argument must export exactly one dynamic
# symbol, trainyard_task_v1 (everything else is hidden by exports.lds).
set -euo pipefail
status=0
for so in "$@"; do
  symbols="$(nm -D --defined-only "$so" | awk '{print $3}')"
  if [[ "$symbols" != "trainyard_task_v1" ]]; then
    echo "FAIL: $so exports:" >&2
    echo "$symbols" >&2
    status=1
  else
    echo "ok: $so exports only trainyard_task_v1"
  fi
done
exit $status
