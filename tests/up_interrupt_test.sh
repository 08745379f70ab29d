#!/usr/bin/env bash
# `trainyard up` starts a controller and workers, and Ctrl-C (SIGINT) stops
# all of them cleanly: exit 0, no process left behind.
set -uo pipefail
trainyard="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/up"
log="${TEST_TMPDIR:-/tmp}/up.log"
"$trainyard" up --workers 2 --data_dir "$dir" >"$log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  grep -q "controller at" "$log" && break
  sleep 0.05
done
if ! grep -q "controller at" "$log"; then
  echo "FAIL: cluster did not come up"; cat "$log"; kill -9 $pid; exit 1
fi
sleep 0.5  # let the workers register
children=$(pgrep -P $pid | tr '\n' ' ')
echo "cluster up: $(grep 'controller at' "$log"); children: $children"
[ "$(echo $children | wc -w)" = 3 ] || { echo "FAIL: expected 3 children"; exit 1; }
kill -INT $pid
for _ in $(seq 200); do
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
if kill -0 $pid 2>/dev/null; then
  echo "FAIL: trainyard up still running 10 s after SIGINT"; kill -9 $pid; exit 1
fi
wait $pid
rc=$?
for c in $children; do
  if kill -0 "$c" 2>/dev/null; then echo "FAIL: child $c survived"; exit 1; fi
done
[ $rc = 0 ] || { echo "FAIL: exit status $rc"; cat "$log"; exit 1; }
grep -q "stopping" "$log" || { echo "FAIL: no stopping message"; exit 1; }
echo "PASS: SIGINT stopped the controller and both workers; exit 0"
