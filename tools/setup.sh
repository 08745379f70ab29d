#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build, test and run
# Trainyard. Idempotent; prints nothing when everything is already there.
# Needs root (or sudo) only when something is missing.
set -euo pipefail

# Build and run: Bazel, compilers' libraries, gRPC/protobuf, Abseil, glog,
# OpenBLAS, GoogleTest/Benchmark, nlohmann-json (plugin configs), SQLite.
# Tests and examples: Debian's Python with numpy, scikit-learn (the digits
# data set) and torch (reference checks).
PACKAGES=(
  bazel-bootstrap bazel-rules-java
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev
  libopenblas-dev libopenblas0-pthread
  libgtest-dev libgmock-dev libbenchmark-dev
  libsqlite3-dev nlohmann-json3-dev libssl-dev zlib1g-dev prometheus-cpp-dev
  libgloo-dev
  python3-numpy python3-sklearn python3-torch python3-pip
  python3-grpcio python3-protobuf python3-setuptools python3-venv python3-yaml
  iperf3 procps
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# Test-only Python tools Debian lacks: the real safetensors library (checks
# our checkpoint files), kubernetes-validate (checks deploy/ manifests) and
# prometheus_client (parses our /metrics). Tests that need them skip, saying
# so, if they are absent.
for mod in safetensors:safetensors kubernetes_validate:kubernetes-validate \
    prometheus_client:prometheus-client; do
  if ! /usr/bin/python3 -c "import ${mod%%:*}" 2>/dev/null; then
    echo "setup: installing ${mod##*:} for /usr/bin/python3 (test-only)" >&2
    /usr/bin/python3 -m pip install -q --break-system-packages "${mod##*:}" >/dev/null 2>&1 ||
      echo "setup: warning: could not install ${mod##*:}; its test will skip" >&2
  fi
done

# TensorBoard's event-file reader (tests/tensorboard_test.py reads our event
# files with it), test-only. Pinned, without its dependencies: newer
# TensorBoards need protobuf >= 5.26, and pip must not replace Debian's
# protobuf (4.21) that the gRPC stubs use. absl-py is its one other need.
if ! /usr/bin/python3 -c \
    "from tensorboard.backend.event_processing import event_file_loader" \
    2>/dev/null; then
  echo "setup: installing tensorboard 2.14.1 for /usr/bin/python3 (test-only)" >&2
  /usr/bin/python3 -m pip install -q --break-system-packages --no-deps \
    "tensorboard==2.14.1" absl-py >/dev/null 2>&1 ||
    echo "setup: warning: could not install tensorboard; its test will skip" >&2
fi

# Bazel's output root and disk cache live here (see .bazelrc).
if [ ! -d /var/cache/trainyard ]; then
  $SUDO mkdir -p /var/cache/trainyard
  $SUDO chmod 1777 /var/cache/trainyard
fi
