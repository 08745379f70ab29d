#!/usr/bin/env bash
# End-to-end test of deploy/ on a real, throw-away, single-node Kubernetes
# on this machine (Debian 12, root). Not part of `bazel test //...`: its
# first run builds Kubernetes from Debian's source package (~11 minutes on
# 2 cores). docs/K8S_E2E.md has the recipe, what each step proves and the
# output of its last runs.
#
#   tools/k8s_e2e.sh [--keep] [--head]
#     --keep: leave the run folder (/tmp/trainyard-k8s-e2e) for reading
#     --head: build the Trainyard binaries from the repository's HEAD commit
#             (git archive) instead of its working tree, e.g. while the
#             working tree is in the middle of an edit; the manifests and
#             this script still come from the working tree
#
# What it does, as a user would:
#   1. installs what is missing (Debian packages only); builds kube-apiserver,
#      kube-controller-manager, kube-scheduler and kubelet once from Debian's
#      `kubernetes` source package and caches them, with a debian:12 base
#      image made by debootstrap, in $TRAINYARD_K8S_CACHE
#      (/var/cache/trainyard-k8s);
#   2. builds Trainyard with Bazel, makes the image with
#      deploy/Dockerfile.prebuilt (podman) and a pause image from
#      Kubernetes' pause.c, and loads both into containerd;
#   3. starts etcd, the API server, controller-manager, scheduler, containerd
#      and kubelet, all on 127.0.0.1 (host networking, no bridge, no CNI
#      network but loopback, no cloud metadata), state in /tmp/trainyard-k8s-e2e;
#   4. makes credentials with `trainyard certs`, loads them as Secrets and
#      applies deploy/overlays/test (the base manifests plus the test
#      cluster's differences, nothing else);
#   5. waits for the controller and both workers to be Ready and the workers
#      registered; runs a 2-stage job from a Kubernetes Job (`trainyard
#      submit --watch`) to SUCCEEDED; runs it again, deletes a worker pod in
#      the middle, checks the StatefulSet brings the pod back and the job
#      recovers and SUCCEEDS with every step's loss bitwise equal to the
#      first run's (and to `trainyard train` of the same spec); checks
#      `kubectl logs` of a worker names its stage and /metrics answers;
#   6. tears everything down by PID (also on failure or Ctrl-C) and checks
#      that no process, mount, cgroup or file it made is left outside the
#      cache.
# Exit status 0 only when every check passed and the teardown is clean. A
# step that fails prints "FAILED: <what>: <why>" and the logs that explain it.
set -Eeuo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
HERE="$REPO/tools/k8s"
CACHE="${TRAINYARD_K8S_CACHE:-/var/cache/trainyard-k8s}"
# Fixed: deploy/overlays/test names its hostPath volumes under it.
RUN=/tmp/trainyard-k8s-e2e
KEEP=0 FROM_HEAD=0
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    --head) FROM_HEAD=1 ;;
    *) echo "usage: tools/k8s_e2e.sh [--keep] [--head]" >&2; exit 2 ;;
  esac
done

# Ports, all on 127.0.0.1, away from the defaults of a real cluster's
# daemons so that one on this machine would not be touched.
ETCD_PORT=12379 ETCD_PEER_PORT=12380 API_PORT=16443
CM_PORT=20257 SCHED_PORT=20259 KUBELET_PORT=20250 KUBELET_HEALTHZ=20248
CONTROLLER_PORT=17070 CONTROLLER_METRICS=17071  # deploy/overlays/test
NODE=trainyard-e2e-node
CGROUP=trainyard-k8s                         # the kubelet's --cgroup-root
IMAGE=localhost/trainyard:e2e
PAUSE_IMAGE=localhost/trainyard-pause:e2e
NS=trainyard

T0=$(date +%s)
PHASE="start" PHASE_T0=$T0
TIMINGS=()
declare -A PIDS=()   # name -> pid of every daemon this script started
ORDER=()             # start order (torn down in reverse)
PRE_EXISTING=()      # folders outside $RUN the kubelet/containerd create

say() { printf '[%4ds] %s\n' "$(($(date +%s) - T0))" "$*"; }
phase_end() {
  [ "$PHASE" = start ] && return 0
  local d=$(($(date +%s) - PHASE_T0))
  TIMINGS+=("$(printf '%-64s %4ds' "$PHASE" "$d")")
}
phase() { phase_end; PHASE="$1"; PHASE_T0=$(date +%s); say "== $1"; }
fail() {
  say "FAILED: $PHASE: $*"
  FAILED=1
  exit 1
}
FAILED=0

# --- Preconditions -----------------------------------------------------------
[ "$(id -u)" = 0 ] || { echo "k8s_e2e: must run as root (it starts a kubelet and containerd)" >&2; exit 1; }
for p in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $CM_PORT $SCHED_PORT $KUBELET_PORT \
    $KUBELET_HEALTHZ $CONTROLLER_PORT $CONTROLLER_METRICS 17100 17101 17102 17110 17111 17112; do
  if ss -Hltn "sport = :$p" | grep -q .; then
    echo "k8s_e2e: port 127.0.0.1:$p is in use (another run? $(ss -Hltnp "sport = :$p" | head -1))" >&2
    exit 1
  fi
done
if [ -e "$RUN" ]; then
  if pgrep -f -- "$RUN/" >/dev/null; then
    echo "k8s_e2e: $RUN is in use by running processes: $(pgrep -f -- "$RUN/" | tr '\n' ' ')" >&2
    exit 1
  fi
  if findmnt -rn -o TARGET | grep -q "^$RUN"; then
    echo "k8s_e2e: mounts left under $RUN by an earlier run; unmount them first:" >&2
    findmnt -rn -o TARGET | grep "^$RUN" >&2
    exit 1
  fi
  rm -rf "$RUN"
fi
mkdir -p "$RUN"/{logs,pids,pki,etc} "$CACHE"
LOGS="$RUN/logs"

# --- Teardown ----------------------------------------------------------------
stop_pid() {  # NAME PID SECONDS: TERM, wait, KILL
  local name="$1" pid="$2" secs="$3" i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  say "teardown: $name (pid $pid) ignored SIGTERM for ${secs}s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

# Processes started on our behalf that are not our children: containerd's
# shims (they daemonize) and what runs in the containers. Found by the
# containerd socket named in their command line, or by being inside the
# kubelet's cgroup.
our_strays() {
  {
    pgrep -f -- "-address $RUN/containerd/containerd.sock" || true
    local h
    for h in /sys/fs/cgroup/*/"$CGROUP"; do
      [ -d "$h" ] && find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null
    done
  } | sort -un | grep -v "^$$\$" || true
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  [ "$FAILED" = 1 ] || [ "$rc" = 0 ] || say "FAILED: $PHASE: exit status $rc"
  if [ "$rc" != 0 ] && [ -n "${PIDS[kube-apiserver]:-}" ]; then
    say "state at the failure (also in $LOGS):"
    kc get nodes,pods,jobs -A -o wide 2>&1 | sed 's/^/    /' | head -40
    kc -n "$NS" describe pods >"$LOGS/describe-pods.txt" 2>&1
    kc get events -A --sort-by=.lastTimestamp 2>&1 | tail -25 | sed 's/^/    /'
    for f in kubelet containerd kube-apiserver; do
      [ -s "$LOGS/$f.log" ] && { say "last errors in $f.log:"; grep -E '^E[0-9]{4}|level=error' "$LOGS/$f.log" | tail -6 | cut -c1-300 | sed 's/^/    /'; }
    done
  fi
  phase "teardown"
  # Pods first, through the API, so the kubelet stops their containers and
  # unmounts their volumes itself.
  if [ -n "${PIDS[kubelet]:-}" ] && kill -0 "${PIDS[kubelet]}" 2>/dev/null; then
    kc delete namespace "$NS" --wait=false >/dev/null 2>&1
    local i
    for ((i = 0; i < 60; i++)); do
      [ -z "$(kc get pods -A -o name 2>/dev/null)" ] && break
      sleep 1
    done
    kc delete pv trainyard-e2e-controller-state trainyard-e2e-data --wait=false >/dev/null 2>&1
  fi
  # Then the daemons, newest first.
  local n
  for ((n = ${#ORDER[@]} - 1; n >= 0; n--)); do
    local name="${ORDER[$n]}"
    if [ "$name" = containerd ]; then
      # Containers the kubelet left (if it died early): kill them and let
      # their shims exit before containerd goes.
      local ids
      ids="$(ctr_ tasks ls -q 2>/dev/null)"
      for id in $ids; do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
      sleep 1
      for id in $ids; do ctr_ tasks delete -f "$id" >/dev/null 2>&1; done
      for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$id" >/dev/null 2>&1; done
    fi
    stop_pid "$name" "${PIDS[$name]}" 15
  done
  # Anything still running on our behalf (a shim whose containerd died),
  # by PID.
  local strays
  strays="$(our_strays)"
  if [ -n "$strays" ]; then
    say "teardown: stopping leftover processes: $(echo $strays)"
    for p in $strays; do kill -KILL "$p" 2>/dev/null; done
    sleep 1
  fi
  # Mounts the kubelet, containerd or podman made under our folders,
  # deepest first.
  local m
  for m in $(findmnt -rn -o TARGET | grep -E "^($RUN|$CACHE/podman)" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "teardown: cannot unmount $m"
  done
  # The kubelet's cgroups (pods, QoS classes) and podman's build cgroups.
  local h
  for h in /sys/fs/cgroup/*/"$CGROUP" $PODMAN_CGROUPS; do
    [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  # What the kubelet and containerd write outside their configured
  # folders (paths fixed in their code): pod log folders, shim sockets.
  rm -rf /var/log/pods/"$NS"_* /var/log/containers/*_"$NS"_* 2>/dev/null
  for d in "${CREATED_DIRS[@]}"; do
    [ -d "$d" ] && rm -rf "$d"
  done
  phase_end
  # Verify.
  local left=()
  strays="$(our_strays)"
  [ -n "$strays" ] && left+=("processes: $(echo $strays)")
  for name in "${ORDER[@]}"; do
    kill -0 "${PIDS[$name]}" 2>/dev/null && left+=("$name (pid ${PIDS[$name]})")
  done
  m="$(findmnt -rn -o TARGET | grep -E "^($RUN|$CACHE/podman|/var/lib/kubelet|/run/containerd)" || true)"
  [ -n "$m" ] && left+=("mounts: $(echo $m)")
  for h in /sys/fs/cgroup/*/"$CGROUP" $PODMAN_CGROUPS; do
    [ -d "$h" ] && left+=("cgroup $h")
  done
  for d in "${CREATED_DIRS[@]}"; do
    [ -e "$d" ] && left+=("$d")
  done
  if [ "$KEEP" = 0 ]; then
    rm -rf "$RUN"
    [ -e "$RUN" ] && left+=("$RUN")
  fi
  echo
  echo "timings:"
  printf '  %s\n' "${TIMINGS[@]}"
  printf '  %-64s %4ds\n' "total" "$(($(date +%s) - T0))"
  if [ ${#left[@]} -gt 0 ]; then
    say "FAILED: teardown left: ${left[*]}"
    rc=1
  else
    say "teardown clean: no process, mount, cgroup or file left outside $CACHE$([ "$KEEP" = 1 ] && echo " (and $RUN, kept: --keep)")"
  fi
  if [ "$rc" = 0 ]; then say "PASS"; else say "FAIL (exit status $rc)"; fi
  exit "$rc"
}
CREATED_DIRS=()
PODMAN_CGROUPS=""
# Folders the daemons create at fixed paths; removed at the end only when
# this run created them.
for d in /var/log/pods /var/log/containers /run/containerd /run/libpod /run/containers \
    /var/lib/containers /etc/cni /opt/cni /usr/libexec/kubernetes /var/lib/kubelet; do
  [ -e "$d" ] || CREATED_DIRS+=("$d")
done
for c in /sys/fs/cgroup/*/; do
  [ -d "${c}libpod_parent" ] || PODMAN_CGROUPS+=" ${c}libpod_parent"
done
trap teardown EXIT
trap 'FAILED=1; say "interrupted"; exit 130' INT TERM

start() {  # NAME CMD...: start a daemon in its own process group, log to LOGS/NAME.log
  local name="$1"; shift
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  PIDS[$name]=$!
  ORDER+=("$name")
  echo "${PIDS[$name]}" >"$RUN/pids/$name"
  say "started $name (pid ${PIDS[$name]})"
}
alive() {  # NAME: fail with the end of its log when it died
  kill -0 "${PIDS[$1]}" 2>/dev/null && return 0
  echo "--- last lines of $LOGS/$1.log:"; tail -15 "$LOGS/$1.log"
  fail "$1 exited"
}
wait_for() {  # SECONDS WHAT CMD...: retry CMD until it succeeds, for SECONDS of wall time
  local secs="$1" what="$2" n deadline=$((SECONDS + $1)); shift 2
  while [ "$SECONDS" -lt "$deadline" ]; do
    "$@" >/dev/null 2>&1 && return 0
    for n in "${ORDER[@]}"; do alive "$n"; done
    sleep 0.5
  done
  fail "$what: not within ${secs}s"
}
kc() { kubectl --kubeconfig "$RUN/etc/admin.kubeconfig" "$@"; }
ctr_() { ctr --address "$RUN/containerd/containerd.sock" --namespace k8s.io "$@"; }
ty() {  # the trainyard CLI on this host, as the cluster's admin
  TRAINYARD_CONTROLLER=127.0.0.1:$CONTROLLER_PORT TRAINYARD_CA="$RUN/creds/ca.pem" \
    TRAINYARD_TOKEN_FILE="$RUN/creds/admin.token" "$TY_BIN" "$@"
}

# --- 1. Packages, Kubernetes, base image ---------------------------------------
phase "install Debian packages"
PACKAGES=(etcd-server containerd runc podman golang-go debootstrap build-essential
          containernetworking-plugins openssl iproute2 procps util-linux dpkg-dev rsync)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# kubectl: the machine's own if there is one (any >= 1.19 speaks to 1.20);
# Debian's kubernetes-client otherwise.
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LOGS/apt.log" 2>&1 ||
    { tail -20 "$LOGS/apt.log"; fail "apt-get install ${missing[*]} failed (see above)"; }
fi
"$REPO/tools/setup.sh"
say "kubectl $(kubectl version --client --short 2>/dev/null || kubectl version --client 2>/dev/null | head -1)"

phase "Kubernetes binaries (build once, cached)"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
have=1
for b in "${K8S_BINS[@]}" pause.c; do [ -e "$CACHE/bin/$b" ] || have=0; done
if [ "$have" = 0 ]; then
  avail_kb=$(df -Pk "$CACHE" | awk 'NR==2 {print $4}')
  [ "$avail_kb" -gt $((5 * 1024 * 1024)) ] ||
    fail "building Kubernetes needs ~3.5 GB of scratch disk; $CACHE has $((avail_kb / 1024)) MB free"
  say "not cached in $CACHE/bin: building from Debian's kubernetes source package (~11 min on 2 cores; log: $LOGS/build-kubernetes.log)"
  "$HERE/build_kubernetes.sh" "$CACHE" "$CACHE/build.tmp" >"$LOGS/build-kubernetes.log" 2>&1 ||
    { tail -30 "$LOGS/build-kubernetes.log"; fail "building Kubernetes failed (above; whole log $LOGS/build-kubernetes.log)"; }
  tail -1 "$LOGS/build-kubernetes.log"
else
  say "cached: Kubernetes $(cat "$CACHE/bin/VERSION") in $CACHE/bin"
fi

# podman: private configuration; its image store is cached in $CACHE, its
# runtime state lives in $RUN. runc (crun cannot use this hybrid cgroup
# setup), explicit rlimits (no CAP_SYS_RESOURCE here), host network.
mkdir -p "$RUN/podman/tmp" "$CACHE/podman"
cat >"$RUN/podman/containers.conf" <<EOF
[containers]
netns = "host"
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$RUN/podman/events.log"
tmp_dir = "$RUN/podman/tmp"
[network]
network_config_dir = "$RUN/podman/networks"
EOF
cat >"$RUN/podman/storage.conf" <<EOF
[storage]
driver = "overlay"
runroot = "$RUN/podman/runroot"
graphroot = "$CACHE/podman/storage"
EOF
printf 'unqualified-search-registries = []\nshort-name-mode = "disabled"\n' >"$RUN/podman/registries.conf"
pm() {
  CONTAINERS_CONF="$RUN/podman/containers.conf" CONTAINERS_STORAGE_CONF="$RUN/podman/storage.conf" \
    CONTAINERS_REGISTRIES_CONF="$RUN/podman/registries.conf" XDG_RUNTIME_DIR="$RUN/podman/tmp" \
    podman "$@"
}

phase "debian:12 base image (debootstrap once, cached)"
if pm image exists docker.io/library/debian:12; then
  say "cached: docker.io/library/debian:12 in $CACHE/podman"
else
  if [ ! -s "$CACHE/debian12-minbase.tar" ]; then
    mirror="$(sed -n 's/^URIs:[[:space:]]*\(\S*debian\)\/\?[[:space:]]*$/\1/p' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    say "debootstrap --variant=minbase bookworm from $mirror"
    rm -rf "$CACHE/rootfs.tmp"
    debootstrap --variant=minbase bookworm "$CACHE/rootfs.tmp" "$mirror" >"$LOGS/debootstrap.log" 2>&1 ||
      { tail -20 "$LOGS/debootstrap.log"; fail "debootstrap failed (above)"; }
    tar -C "$CACHE/rootfs.tmp" -cf "$CACHE/debian12-minbase.tar.tmp" . &&
      mv "$CACHE/debian12-minbase.tar.tmp" "$CACHE/debian12-minbase.tar"
    rm -rf "$CACHE/rootfs.tmp"
  fi
  pm import "$CACHE/debian12-minbase.tar" docker.io/library/debian:12 >/dev/null
  say "imported docker.io/library/debian:12 ($(du -h "$CACHE/debian12-minbase.tar" | cut -f1))"
fi

# --- 2. Trainyard and the images -------------------------------------------------
phase "bazel build (Trainyard binaries, CPU-only)"
# The image is Debian 12 without CUDA, as deploy/Dockerfile builds it: build
# without the toolkit (CUDA_HOME pointing nowhere gives the CPU-only stubs,
# tools/cuda.bzl), in an output base of our own under $CACHE so the
# repository's usual (CUDA) build is not invalidated, and with no
# bazel-* symlinks in the repository. The disk cache is shared.
SRC="$REPO" OUTPUT_BASE="$CACHE/bazel-cpu"
if [ "$FROM_HEAD" = 1 ]; then
  SRC="$RUN/src" OUTPUT_BASE="$CACHE/bazel-cpu-head"
  mkdir -p "$SRC"
  git -C "$REPO" archive HEAD | tar -x -C "$SRC" || fail "git archive HEAD of $REPO failed"
  say "building $(git -C "$REPO" log -1 --format='%h %s' | cut -c1-100) (HEAD, not the working tree)"
fi
BAZEL=(bazel --output_base="$OUTPUT_BASE")
BAZEL_FLAGS=(--symlink_prefix=/ --action_env=CUDA_HOME=/nonexistent)
(cd "$SRC" && CUDA_HOME=/nonexistent "${BAZEL[@]}" build "${BAZEL_FLAGS[@]}" \
    //controller:trainyard-controller //worker:trainyard-worker \
    //cli:trainyard //task_plugins:plugins) >"$LOGS/bazel.log" 2>&1 ||
  { grep -E '^ERROR|error:' "$LOGS/bazel.log" | head -8 | cut -c1-300
    fail "bazel build of $SRC failed (errors above; whole log $LOGS/bazel.log)$([ "$FROM_HEAD" = 0 ] && echo "; if the working tree is mid-edit, --head builds HEAD")"; }
BIN="$(cd "$SRC" && CUDA_HOME=/nonexistent "${BAZEL[@]}" info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)"
# Its server is ours: stop it now rather than leave it running.
(cd "$SRC" && "${BAZEL[@]}" shutdown) >/dev/null 2>&1 || true
TY_BIN="$BIN/cli/trainyard"
if ldd "$BIN/worker/trainyard-worker" | grep -q libcudart; then
  fail "$BIN/worker/trainyard-worker links CUDA although CUDA_HOME=/nonexistent"
fi
say "$(grep -E '^(INFO: Elapsed|INFO: Build completed)' "$LOGS/bazel.log" | tr '\n' ' ')"

phase "images: trainyard (Dockerfile.prebuilt) and pause"
ctx="$RUN/image-context"
mkdir -p "$ctx/bin" "$ctx/task_plugins" "$RUN/pause-context"
cp "$BIN/controller/trainyard-controller" "$BIN/worker/trainyard-worker" "$TY_BIN" "$ctx/bin/"
cp "$BIN"/task_plugins/lib*.so "$ctx/task_plugins/"
chmod -R u+w "$ctx"
pm build --pull=never --network=host -q -f "$REPO/deploy/Dockerfile.prebuilt" -t "$IMAGE" "$ctx" \
  >"$LOGS/podman-build.log" 2>&1 ||
  { tail -20 "$LOGS/podman-build.log"; fail "podman build of deploy/Dockerfile.prebuilt failed (above)"; }
# The pause image: Kubernetes' own pause.c (kept by build_kubernetes.sh),
# static, in an otherwise empty image.
gcc -Os -Wall -static -DVERSION=v3.4-trainyard-e2e -o "$RUN/pause-context/pause" "$CACHE/bin/pause.c"
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$RUN/pause-context/Dockerfile"
pm build --pull=never --network=host -q -t "$PAUSE_IMAGE" "$RUN/pause-context" >>"$LOGS/podman-build.log" 2>&1 ||
  { tail -20 "$LOGS/podman-build.log"; fail "podman build of the pause image failed (above)"; }
pm save -m --format docker-archive -o "$RUN/images.tar" "$IMAGE" "$PAUSE_IMAGE" >/dev/null 2>>"$LOGS/podman-build.log" ||
  fail "podman save failed: $(tail -3 "$LOGS/podman-build.log")"
say "image $IMAGE: $(pm image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec) ($(pm image inspect --format '{{.Id}}' "$IMAGE" | cut -c1-12))"

# --- 3. The cluster ------------------------------------------------------------
phase "cluster: certificates and configuration"
pki="$RUN/pki"
openssl_quiet() { openssl "$@" >/dev/null 2>&1 || fail "openssl $1 failed"; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=trainyard-e2e-ca \
  -keyout "$pki/ca.key" -out "$pki/ca.crt"
cert() {  # NAME SUBJECT [SAN]
  local ext="$pki/$1.ext"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
  [ -n "${3:-}" ] && echo "subjectAltName=$3" >>"$ext"
  openssl_quiet req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr"
  openssl_quiet x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$ext" -out "$pki/$1.crt"
}
cert apiserver /CN=kube-apiserver "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,IP:10.96.0.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
ADMIN_TOKEN="$(openssl rand -hex 24)"
# One identity for everything (a throw-away cluster): system:masters.
echo "$ADMIN_TOKEN,admin,admin,system:masters" >"$pki/tokens.csv"
cat >"$RUN/etc/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- cluster: {certificate-authority: $pki/ca.crt, server: "https://127.0.0.1:$API_PORT"}
  name: e2e
users:
- name: admin
  user: {token: $ADMIN_TOKEN}
contexts:
- context: {cluster: e2e, user: admin}
  name: e2e
current-context: e2e
EOF
chmod 600 "$RUN/etc/admin.kubeconfig"
mkdir -p "$RUN/containerd" "$RUN/cni" "$RUN/kubelet"
# Only loopback: hostNetwork pods use none, but the runtime reports its
# network ready only with a CNI configuration.
cat >"$RUN/cni/10-loopback.conflist" <<'EOF'
{"cniVersion": "0.4.0", "name": "trainyard-e2e-loopback", "plugins": [{"type": "loopback"}]}
EOF
cat >"$RUN/etc/containerd.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$RUN/containerd/containerd.sock"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # No CAP_SYS_RESOURCE here: never ask for a lower oom_score_adj than ours.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni"
EOF
cat >"$RUN/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP
failSwapOn: false
# Never touch the host's iptables or kernel settings.
makeIPTablesUtilChains: false
protectKernelDefaults: false
serializeImagePulls: false
volumePluginDir: $RUN/kubelet/volume-plugins
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 100
EOF
for h in /sys/fs/cgroup/*/; do
  case "$h" in */unified/) continue ;; esac
  mkdir -p "$h$CGROUP" 2>/dev/null || fail "cannot create cgroup $h$CGROUP (read-only cgroup filesystem?)"
done

phase "cluster: start etcd, control plane, containerd, kubelet"
start etcd etcd --name e2e --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT"
start containerd containerd --config "$RUN/etc/containerd.toml"
wait_for 30 "etcd healthy" curl -sf "http://127.0.0.1:$ETCD_PORT/health"
start kube-apiserver "$CACHE/bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=$API_PORT --insecure-port=0 \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/24 --endpoint-reconciler-type=none \
  --authorization-mode=RBAC --allow-privileged=true \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP --profiling=false --v=1
wait_for 60 "API server ready" kc get --raw /readyz
start kube-controller-manager "$CACHE/bin/kube-controller-manager" \
  --kubeconfig="$RUN/etc/admin.kubeconfig" --authentication-kubeconfig="$RUN/etc/admin.kubeconfig" \
  --authorization-kubeconfig="$RUN/etc/admin.kubeconfig" --leader-elect=false \
  --bind-address=127.0.0.1 --port=0 --secure-port=$CM_PORT \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --use-service-account-credentials=false --profiling=false --v=1
start kube-scheduler "$CACHE/bin/kube-scheduler" \
  --kubeconfig="$RUN/etc/admin.kubeconfig" --authentication-kubeconfig="$RUN/etc/admin.kubeconfig" \
  --authorization-kubeconfig="$RUN/etc/admin.kubeconfig" --leader-elect=false \
  --bind-address=127.0.0.1 --port=0 --secure-port=$SCHED_PORT --profiling=false --v=1
wait_for 30 "containerd up" ctr_ version
ctr_ images import "$RUN/images.tar" >"$LOGS/ctr-import.log" 2>&1 ||
  { cat "$LOGS/ctr-import.log"; fail "ctr images import failed (above)"; }
say "containerd images: $(ctr_ images ls -q | grep -E 'trainyard' | tr '\n' ' ')"
# AWS_EC2_METADATA_DISABLED: no cloud-metadata lookups.
start kubelet env AWS_EC2_METADATA_DISABLED=true "$CACHE/bin/kubelet" \
  --config="$RUN/etc/kubelet.yaml" --kubeconfig="$RUN/etc/admin.kubeconfig" \
  --container-runtime=remote --container-runtime-endpoint="unix://$RUN/containerd/containerd.sock" \
  --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet/pki" \
  --node-ip=127.0.0.1 --hostname-override=$NODE --v=1
node_ready() { kc get node $NODE -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
wait_for 90 "node $NODE Ready" node_ready
say "node: $(kc get node $NODE --no-headers -o wide | awk '{print $1, $2, $5, $6}')"
wait_for 60 "default service account" kc -n default get serviceaccount default

# --- 4. Deploy ---------------------------------------------------------------------
phase "deploy: credentials, Secrets, kubectl apply -k deploy/overlays/test"
ty certs --out "$RUN/creds" --hosts trainyard-controller,trainyard-controller.$NS,trainyard-controller.$NS.svc \
  >"$LOGS/certs.log" 2>&1 || { cat "$LOGS/certs.log"; fail "trainyard certs failed"; }
# A user (not the admin) submits from inside the cluster.
ty token --user e2e --tokens_file "$RUN/creds/tokens" >"$RUN/creds/e2e.token" 2>>"$LOGS/certs.log" ||
  fail "trainyard token failed: $(tail -2 "$LOGS/certs.log")"
mkdir -p "$RUN/volumes/controller-state" "$RUN/volumes/data"
chown 10001:10001 "$RUN/volumes/controller-state"
chmod 0755 "$RUN/volumes/data" "$RUN"
kc apply -f "$REPO/deploy/overlays/test/namespace.yaml" >/dev/null
wait_for 30 "namespace's default service account" kc -n $NS get serviceaccount default
kc -n $NS create secret generic trainyard-tls --from-file="$RUN/creds/ca.pem" \
  --from-file="$RUN/creds/controller.pem" --from-file="$RUN/creds/controller.key" \
  --from-file="$RUN/creds/worker.pem" --from-file="$RUN/creds/worker.key" >/dev/null
kc -n $NS create secret generic trainyard-tokens --from-file="$RUN/creds/tokens" >/dev/null
kc -n $NS create secret generic trainyard-e2e-client --from-file=token="$RUN/creds/e2e.token" >/dev/null
kc apply -k "$REPO/deploy/overlays/test" 2>&1 | sed 's/^/    /'

phase "wait: pods Ready, workers registered"
pods_ready() {
  kc -n $NS wait --for=condition=Ready pod -l app=trainyard --timeout=1s >/dev/null 2>&1 &&
    [ "$(kc -n $NS get pods -l app=trainyard --no-headers | wc -l)" = 3 ]
}
wait_for 120 "controller and 2 worker pods Ready" pods_ready
kc -n $NS get pods -o wide | sed 's/^/    /'
registered() { [ "$(ty workers 2>/dev/null | grep -c 'trainyard-worker-[01]')" = 2 ]; }
wait_for 30 "both workers registered with the controller" registered
ty workers | sed 's/^/    /'

# --- 5. Jobs -------------------------------------------------------------------------
submit_job() {  # NAME: a Kubernetes Job that runs `trainyard submit --watch` on the e2e spec
  sed "s/@NAME@/$1/g; s#@IMAGE@#$IMAGE#g" "$HERE/submit-job.yaml" | kc apply -f - >/dev/null
}
job_pod() { kc -n $NS get pods -l job-name="$1" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
trainyard_job_id() {  # NAME: the job id `trainyard submit` printed first in its pod's log
  kc -n $NS logs "$(job_pod "$1")" 2>/dev/null | grep -m1 -E '^[A-Za-z0-9_-]+$' || true
}
has_job_id() { [ -n "$(trainyard_job_id "$1")" ]; }
k8s_job_done() {  # NAME: 0 when Complete, fail when Failed
  local c
  c="$(kc -n $NS get job "$1" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {end}')"
  case "$c" in
    *Failed=True*)
      kc -n $NS logs "$(job_pod "$1")" 2>&1 | tail -20 | sed 's/^/    /'
      fail "Kubernetes Job $1 failed: \`trainyard submit --watch\` exited non-zero (its log above)" ;;
    *Complete=True*) return 0 ;;
  esac
  return 1
}
kc -n $NS create configmap trainyard-e2e-spec --from-file=job.json="$HERE/e2e-job.json" >/dev/null

phase "job 1: submit from a Kubernetes Job, watch to SUCCEEDED"
submit_job submit-reference
wait_for 60 "job 1's trainyard job id (first line of the Job's log)" has_job_id submit-reference
REF_ID="$(trainyard_job_id submit-reference)"
say "Kubernetes Job submit-reference submitted trainyard job $REF_ID"
wait_for 300 "Kubernetes Job submit-reference Complete" k8s_job_done submit-reference
kc -n $NS logs "$(job_pod submit-reference)" >"$LOGS/submit-reference.log"
grep -E "^job $REF_ID: " "$LOGS/submit-reference.log" | sed 's/^/    /'
grep -q "^job $REF_ID: SUCCEEDED" "$LOGS/submit-reference.log" || fail "job $REF_ID did not end SUCCEEDED"
say "job $REF_ID SUCCEEDED ($(grep -c '^step ' "$LOGS/submit-reference.log") step lines in the Job's log)"

phase "job 2: delete a worker pod mid-job, recover, SUCCEEDED"
victim=trainyard-worker-1
old_uid="$(kc -n $NS get pod $victim -o jsonpath='{.metadata.uid}')"
submit_job submit-interrupted
wait_for 60 "job 2's trainyard job id (first line of the Job's log)" has_job_id submit-interrupted
JOB_ID="$(trainyard_job_id submit-interrupted)"
say "Kubernetes Job submit-interrupted submitted trainyard job $JOB_ID"
total_steps="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' "$HERE/e2e-job.json")"
mid_step=$((total_steps / 3))
current_step() { ty get "$JOB_ID" 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin).get("steps_completed", 0)))' 2>/dev/null || echo 0; }
reached_mid() { [ "$(current_step)" -ge "$mid_step" ]; }
wait_for 120 "job $JOB_ID reaching step $mid_step" reached_mid
at="$(current_step)"
kc -n $NS delete pod $victim --wait=false >/dev/null
say "deleted pod $victim at step $at of $total_steps"
new_pod() {
  local uid
  uid="$(kc -n $NS get pod $victim -o jsonpath='{.metadata.uid}' 2>/dev/null)"
  [ -n "$uid" ] && [ "$uid" != "$old_uid" ] &&
    kc -n $NS wait --for=condition=Ready pod/$victim --timeout=1s >/dev/null 2>&1
}
wait_for 120 "pod $victim recreated by the StatefulSet and Ready (registered)" new_pod
say "pod $victim is back: $(kc -n $NS get pod $victim --no-headers -o wide | awk '{print $1, $2, $3, $4, $5}')"
wait_for 300 "Kubernetes Job submit-interrupted Complete" k8s_job_done submit-interrupted
kc -n $NS logs "$(job_pod submit-interrupted)" >"$LOGS/submit-interrupted.log"
grep -E "^(job $JOB_ID: |recovery|restart)" "$LOGS/submit-interrupted.log" | sed 's/^/    /'
grep -q "^job $JOB_ID: SUCCEEDED" "$LOGS/submit-interrupted.log" || fail "job $JOB_ID did not end SUCCEEDED"

phase "bitwise: every step's loss, job 2 vs job 1 vs trainyard train"
# In the pods' environment (none of this shell's OPENBLAS_* settings), so
# that OpenBLAS picks the same kernels as in the pods: bitwise equality is
# promised per machine and BLAS kernel, not across kernels.
env -i PATH=/usr/bin:/bin HOME="$RUN" "$TY_BIN" train --spec "$HERE/e2e-job.json" \
  --metrics_out "$LOGS/train-reference.jsonl" >"$LOGS/train.log" 2>&1 ||
  { tail -5 "$LOGS/train.log"; fail "trainyard train of the same spec failed"; }
say "trainyard train: $(grep -o 'BLAS .*' "$LOGS/train.log" | head -1)"
PYTHONPATH="$REPO/python" TRAINYARD_CA="$RUN/creds/ca.pem" TRAINYARD_TOKEN_FILE="$RUN/creds/admin.token" \
  /usr/bin/python3 "$HERE/compare_losses.py" --controller "127.0.0.1:$CONTROLLER_PORT" \
  --reference "$REF_ID" --interrupted "$JOB_ID" --train "$LOGS/train-reference.jsonl" \
  --out "$LOGS/losses.tsv" || fail "losses differ (above)"

phase "kubectl logs and /metrics"
kc -n $NS logs trainyard-worker-0 >"$LOGS/worker-0.log" 2>&1
stage_lines="$(grep -iE "stage [0-9]" "$LOGS/worker-0.log" | grep -E "$REF_ID|$JOB_ID" | head -3)"
[ -n "$stage_lines" ] || { tail -20 "$LOGS/worker-0.log"; fail "kubectl logs trainyard-worker-0 names no stage of jobs $REF_ID/$JOB_ID"; }
echo "$stage_lines" | cut -c1-200 | sed 's/^/    kubectl logs trainyard-worker-0: /'
metrics="$(curl -sf "http://127.0.0.1:$CONTROLLER_METRICS/metrics")" || fail "controller /metrics on 127.0.0.1:$CONTROLLER_METRICS did not answer"
echo "$metrics" | grep -E '^trainyard_[a-z_]*(jobs|workers)[a-z_]*(\{[^}]*\})? ' | head -4 | sed 's/^/    /'
say "all checks passed"
phase_end
PHASE=start  # nothing more to time before the teardown
