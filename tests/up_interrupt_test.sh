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
echo "ok: SIGINT stopped the controller and both workers; exit 0"

# 2. With --run: SIGINT while the job runs cancels it and stops everything.
spec="${TEST_TMPDIR:-/tmp}/long.json"
cat >"$spec" <<'JSON'
{"name": "long", "steps": 1000000, "seed": 1,
 "model": {"blocks": [{"outFeatures": 16, "ffnHiddenSize": 32}, {"outFeatures": 3, "ffnHiddenSize": 16}]},
 "parallelism": {"stages": 2},
 "optimizer": {"lr": 0.001},
 "task": {"plugin": "cross_entropy"},
 "data": {"train": {"synthetic": {"kind": "gaussian_blobs", "numSamples": 256, "numFeatures": 16, "numOutputs": 3, "noise": 1}}, "batchSize": 32}}
JSON
log2="${TEST_TMPDIR:-/tmp}/up_run.log"
"$trainyard" up --workers 2 --data_dir "$dir-run" --run "$spec" >"$log2" 2>&1 &
pid=$!
for _ in $(seq 400); do
  grep -q "^step " "$log2" && break
  sleep 0.05
done
grep -q "^step " "$log2" || { echo "FAIL: the job did not start"; cat "$log2"; kill -9 $pid; exit 1; }
children=$(pgrep -P $pid | tr '\n' ' ')
kill -INT $pid
start=$(date +%s.%N)
for _ in $(seq 200); do
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
if kill -0 $pid 2>/dev/null; then
  echo "FAIL: up --run still running 10 s after SIGINT"; kill -9 $pid; exit 1
fi
wait $pid
rc=$?
took=$(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $start}")
for c in $children; do
  if kill -0 "$c" 2>/dev/null; then echo "FAIL: child $c survived"; exit 1; fi
done
[ $rc = 1 ] || { echo "FAIL: exit status $rc, want 1"; tail "$log2"; exit 1; }
grep -q "interrupted; cancelling" "$log2" || { echo "FAIL: no interrupt message"; exit 1; }
# The watch shows why the stages talk TCP (the job's transport note).
grep -q "^note (stage [01]): transport: every stage is on cpu: using TCP$" "$log2" ||
  { echo "FAIL: no transport note in the watch output"; grep -n note "$log2"; exit 1; }
echo "ok: SIGINT during --run cancelled the job and stopped the cluster in ${took} s; exit 1"

# 3. SIGKILL of `trainyard up` itself: its daemons die with it.
"$trainyard" up --workers 2 --data_dir "$dir-kill" >"$log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  grep -q "controller at" "$log" && break
  sleep 0.05
done
children=$(pgrep -P $pid | tr '\n' ' ')
kill -KILL $pid
wait $pid 2>/dev/null
sleep 1
for c in $children; do
  if kill -0 "$c" 2>/dev/null; then echo "FAIL: child $c outlived SIGKILL of up"; exit 1; fi
done
echo "ok: SIGKILL of up took its ${children}daemons with it"
echo "PASS"
