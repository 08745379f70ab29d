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
echo PASS
