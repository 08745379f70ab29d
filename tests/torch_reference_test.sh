#!/usr/bin/env bash
# Runs torch_reference_test.py with Debian's Python (python3-torch).
set -euo pipefail
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 lacks torch or numpy (apt-get install python3-torch python3-numpy)"
  exit 0
fi
exec /usr/bin/python3 "$(dirname "$0")/torch_reference_test.py" "$1"
