#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler and kubelet
# from Debian 12's `kubernetes` source package (1.20, every dependency
# vendored) with Debian's Go, and installs them (and Kubernetes' pause.c)
# into CACHE/bin. Nothing but Debian's archive is contacted. 6 to 11 minutes
# and 3.5 GB of scratch disk on 2 cores; the scratch folder is removed
# afterwards.
#
# Usage: build_kubernetes.sh CACHE WORK
#   CACHE  where bin/ and the build's stamp go (kept between runs)
#   WORK   a scratch folder (removed afterwards)
#
# Two kubelet edits, both for a throw-away node on 127.0.0.1:
#   - validateNodeIP refuses a loopback --node-ip: allow it;
#   - setupNode sets kernel.panic, kernel.panic_on_oops and
#     vm.overcommit_memory on the host unless --protect-kernel-defaults
#     (which instead refuses to start when they differ): only warn.
set -euo pipefail
cache="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet"

mkdir -p "$work" "$cache/bin"
"$here/private_apt.sh" "$work/apt" source kubernetes "$work/src"
src="$(echo "$work"/src/kubernetes-*/)"
[ -d "$src" ] || { echo "build_kubernetes: no kubernetes-* folder in $work/src after apt-get source" >&2; exit 1; }
version="$(cd "$src" && dpkg-parsechangelog -S Version)"
echo "build_kubernetes: Debian's kubernetes $version in $src"

patch_once() {  # FILE OLD NEW: replace OLD by NEW exactly once, or fail
  local file="$src/$1" old="$2" new="$3" n
  n="$(grep -cF -- "$old" "$file" || true)"
  if [ "$n" != 1 ]; then
    echo "build_kubernetes: $1: expected 1 line with '$old', found $n (source changed?)" >&2
    exit 1
  fi
  OLD="$old" NEW="$new" perl -0pi -e 's/\Q$ENV{OLD}\E/$ENV{NEW}/' "$file"
}
patch_once pkg/kubelet/kubelet_node_status.go \
  'if nodeIP.IsLoopback() {' 'if false && nodeIP.IsLoopback() {'
patch_once pkg/kubelet/cm/container_manager_linux.go \
  'b := KernelTunableModify' 'b := KernelTunableWarn'

cd "$src"
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
# As debian/rules builds it: static binaries, Debian's Go, no network
# (GOFLAGS=-mod=vendor, GOPROXY=off: a missing module is an error).
env GOPATH="$src/.go" CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor \
  GOCACHE="$work/gocache" HOME="$work/home" PATH="/usr/lib/go/bin:$PATH" \
  make WHAT="$WHAT"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  install -m 0755 "_output/bin/$b" "$cache/bin/$b"
done
# The pod sandbox's "pause" program, compiled by the e2e script.
install -m 0644 build/pause/linux/pause.c "$cache/bin/pause.c"
echo "$version" >"$cache/bin/VERSION"
cd /
rm -rf "$work"
echo "build_kubernetes: installed $(ls "$cache/bin" | tr '\n' ' ')into $cache/bin"
