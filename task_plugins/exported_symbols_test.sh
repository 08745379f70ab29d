#!/bin/bash
# Each task plugin .so given as an argument must export exactly its ABI
# entry points, trainyard_task_v1 and trainyard_task_v2 (everything else is
# hidden by exports.lds).
set -euo pipefail
status=0
for so in "$@"; do
  symbols="$(nm -D --defined-only "$so" | awk '{print $3}' | sort | tr '\n' ' ')"
  if [[ "$symbols" != "trainyard_task_v1 trainyard_task_v2 " ]]; then
    echo "FAIL: $so exports:" >&2
    echo "$symbols" >&2
    status=1
  else
    echo "ok: $so exports only trainyard_task_v1 and trainyard_task_v2"
  fi
done
exit $status
