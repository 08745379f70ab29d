#!/usr/bin/env bash
# The Kubernetes manifests render with kustomize and every object validates
# against the Kubernetes API schemas (kubernetes-validate, test-only from
# PyPI). The worker args must include the flags the worker binary accepts.
set -euo pipefail
dir="$1"
worker="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/rendered.yaml"
if ! command -v kubectl >/dev/null; then
  echo "SKIPPED: kubectl not installed"; exit 0
fi
# Bazel's runfiles are symlinks, which kustomize does not follow: copy.
copy="${TEST_TMPDIR:-$(mktemp -d)}/manifests"
mkdir -p "$copy"
cp -L "$dir"/*.yaml "$copy/"
kubectl kustomize "$copy" >"$out"
echo "rendered $(grep -c '^kind:' "$out") objects: $(grep '^kind:' "$out" | awk '{print $2}' | tr '\n' ' ')"
if /usr/bin/python3 -c 'import kubernetes_validate' 2>/dev/null; then
  /usr/bin/python3 -m kubernetes_validate --strict -k 1.29.0 "$out"
else
  echo "SKIPPED schema validation: kubernetes-validate missing (tools/setup.sh installs it)"
fi
# Every --flag in the worker manifest is one the worker binary knows.
help=$("$worker" --helpfull 2>&1 || true)
for flag in $(grep -oE -- '- --[a-z_]+' "$dir/workers.yaml" | sed 's/- --//'); do
  if ! grep -q -- "-$flag " <<<"$help" && ! grep -q -- "-$flag)" <<<"$help"; then
    echo "FAIL: workers.yaml passes --$flag, which trainyard-worker does not define"; exit 1
  fi
done
echo "PASS"
