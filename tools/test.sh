#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, then `bazel test //...`
# (GPU tests, tagged "gpu", skip themselves with their reason where there is
# no GPU). Ends with one summary line: "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh || exit 1
log=$(mktemp)
# Under CI every test really runs: test results cached from an earlier run
# (Bazel keeps them in the disk cache) are not reused.
extra=()
if [ "${CI:-}" = "true" ]; then extra+=(--nocache_test_results); fi
bazel test //... "${extra[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//.* (PASSED|\(cached\) PASSED)' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log" || true)
summary=$(grep -E '^Executed [0-9]+ out of [0-9]+ tests?' "$log" | tail -n 1)
rm -f "$log"
if [ -n "$summary" ]; then
  total=$(echo "$summary" | sed -E 's/^Executed [0-9]+ out of ([0-9]+) tests?.*/\1/')
  fails=$(echo "$summary" | grep -oE '[0-9]+ fails?' | grep -oE '[0-9]+' || echo 0)
  [ -n "$fails" ] || fails=0
  failed=$fails
  passed=$((total - fails))
fi
# Test cases that skipped themselves (GPU tests without a device), with the
# first reason given, so a run without a GPU says so plainly.
if [ -d bazel-testlogs ]; then
  # Only the logs of today's test targets: bazel-testlogs keeps those of
  # targets that have since moved or gone.
  logs=$(bazel query 'tests(//...)' 2>/dev/null |
    sed -E 's#^//##; s#:#/#; s#^#bazel-testlogs/#; s#$#/test.log#' |
    while read -r f; do [ -f "$f" ] && echo "$f"; done)
  # shellcheck disable=SC2086
  skipped=$(cat $logs /dev/null 2>/dev/null | grep -c '^\[  SKIPPED \]' || true)
  if [ "${skipped:-0}" -gt 0 ]; then
    # shellcheck disable=SC2086
    reason=$(cat $logs /dev/null 2>/dev/null | grep -m1 -oE 'no CUDA device: [^"]*' |
      head -c 160)
    echo "skipped test cases: ${skipped} (${reason:-see the test logs})"
  fi
fi
echo "tests: ${passed} passed, ${failed} failed"
exit "$rc"
