#!/bin/bash
# Runs tools/style_report_test.py with Debian's Python.
#   style_report_test.sh STYLE_REPORT_TEST_PY
set -euo pipefail
exec /usr/bin/python3 "$1"
