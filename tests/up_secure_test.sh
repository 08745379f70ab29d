#!/usr/bin/env bash
# The quickstart's one command, `trainyard up --workers 3 --run
# examples/digits.json`, trains to SUCCEEDED with everything on by default:
# TLS on the controller, worker certificates, the admin's token, a job
# secret on the data plane. Checked from the daemons' own logs and files.
set -uo pipefail
trainyard="$1"
spec="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}/up-secure"
out="${TEST_TMPDIR:-/tmp}/up-secure.out"
# Bazel's runfiles are symlinks; the spec's data folder sits beside it.
timeout 600 "$trainyard" up --workers 3 --data_dir "$dir" --run "$(readlink -f "$spec")" >"$out" 2>&1
rc=$?
fail() { echo "FAIL: $*"; tail -30 "$out"; exit 1; }
[ $rc = 0 ] || fail "exit status $rc"
grep -q "final eval after step" "$out" || fail "no final eval line"
grep -q "TLS, worker certificates and tokens are on" "$out" || fail "up did not say it is secure"
grep -q "export TRAINYARD_CA=$dir/pki/ca.pem" "$out" || fail "no export lines"
grep -q "(TLS)" "$dir/logs/controller.log" || fail "the controller did not serve TLS"
grep -q "tokens from $dir/pki/tokens" "$dir/logs/controller.log" || fail "the controller did not check tokens"
if grep -q -- "--insecure" "$dir/logs/"*.log; then fail "a daemon ran --insecure"; fi
for f in ca.key controller.key worker.key tokens admin.token; do
  mode=$(stat -c %a "$dir/pki/$f")
  [ "$mode" = 600 ] || fail "$f has mode $mode, want 600"
done
grep -q "$(cat "$dir/pki/admin.token")" "$dir/pki/tokens" && fail "the tokens file holds a token, not its hash"
echo "ok: $(grep 'final eval' "$out")"
grep -q "must stay inside $(dirname "$(readlink -f "$spec")")" "$out" ||
  fail "up did not confine jobs to the spec's folder"

# Confined like a deployed cluster: a job's files must stay inside the
# folder up names (here --job_data_dir); the controller refuses the rest
# at submit, naming the field.
jobs="${TEST_TMPDIR:-/tmp}/up-jobs"
mkdir -p "$jobs"
dir2="${TEST_TMPDIR:-/tmp}/up-confined"
"$trainyard" up --workers 1 --data_dir "$dir2" --job_data_dir "$jobs" >"$out.2" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for _ in $(seq 300); do
  grep -q "workers registered" "$out.2" && break
  sleep 0.1
done
grep -q "must stay inside $jobs" "$out.2" || { cat "$out.2"; fail "up did not say where jobs' files must stay"; }
cat >"$jobs/bad.json" <<'JSON'
{"name": "outside", "steps": 1,
 "model": {"blocks": [{"inFeatures": 4, "outFeatures": 2, "ffnHiddenSize": 4}]},
 "optimizer": {"lr": 0.1}, "task": {"plugin": "mse"},
 "data": {"train": {"npy": {"features": "/etc/passwd", "targets": "/etc/passwd"}}, "batchSize": 1},
 "checkpoint": {"dir": "/tmp/anywhere"}}
JSON
export TRAINYARD_CONTROLLER="127.0.0.1:$(cat "$dir2/controller.port")"
export TRAINYARD_CA="$dir2/pki/ca.pem" TRAINYARD_TOKEN_FILE="$dir2/pki/admin.token"
"$trainyard" submit --spec "$jobs/bad.json" >"$out.3" 2>&1
rc=$?
[ $rc = 2 ] || { cat "$out.3"; fail "a spec reading /etc/passwd was not refused (exit $rc)"; }
for field in data.train.npy.features data.train.npy.targets checkpoint.dir; do
  grep -q "$field: .*outside the data folder $jobs" "$out.3" ||
    { cat "$out.3"; fail "the refusal does not name $field"; }
done
kill -INT $pid
wait $pid
echo "ok: an up cluster refuses /etc/passwd and /tmp/anywhere at submit"
echo PASS
