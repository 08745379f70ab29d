#!/usr/bin/env bash
# Runs a Python test with Debian's Python (python3-grpcio, python3-protobuf,
# numpy); the `python3` first on PATH may be another one.
set -euo pipefail
exec /usr/bin/python3 -u "$@"
