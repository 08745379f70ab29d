#!/usr/bin/env bash
# The Kubernetes manifests render with kustomize, every object validates
# against the Kubernetes API schemas (kubernetes-validate, test-only from
# PyPI), and the rendered objects are secure by default:
#   - every container runs as the image's non-root user with a read-only
#     root filesystem, no privilege escalation, no capabilities and the
#     RuntimeDefault seccomp profile; whatever is writable is an emptyDir or
#     a claim;
#   - the daemons get their certificates and tokens from Secrets (read-only,
#     each pod only its own key) and the flags that use them; nothing runs
#     --insecure; the probes run `trainyard health` over TLS;
#   - NetworkPolicies deny ingress by default and admit, port by port, only
#     workers to the stage port, workers and clients to the controller, and
#     monitoring pods to /metrics;
#   - the manifests run binaries the image (deploy/Dockerfile) installs, as
#     the user it creates;
#   - every --flag a container or probe passes is one its binary defines;
#   - CPU and GPU workers are separate StatefulSets (the GPU one asks for
#     one nvidia.com/gpu and runs --device=cuda:0), covered by one
#     PodDisruptionBudget, their requests set from the sizing ConfigMap;
#   - deploy/Dockerfile.prebuilt makes the same runtime image as
#     deploy/Dockerfile;
#   - the test cluster's overlay (deploy/overlays/test, used by
#     tools/k8s_e2e.sh) renders, validates, and keeps every pod non-root and
#     read-only with the same Secret files.
#
# Usage: deploy_manifests_test.sh DIR WORKER [CONTROLLER [CLI]]
#   DIR: deploy/kubernetes (deploy/Dockerfile* and deploy/overlays/test are
#   read from DIR/..)
#   WORKER, CONTROLLER, CLI: trainyard-worker, trainyard-controller and
#   trainyard binaries whose flags are checked; the last two are optional
#   (their flags are then not checked).
set -euo pipefail
dir="$1"
worker="$2"
controller="${3:-}"
cli="${4:-}"

out="${TEST_TMPDIR:-$(mktemp -d)}/rendered.yaml"
if ! command -v kubectl >/dev/null; then
  echo "SKIPPED: kubectl not installed"; exit 0
fi
# Bazel's runfiles are symlinks, which kustomize does not follow: copy
# deploy/ (the base, its components and the overlays) as plain files.
copy="${TEST_TMPDIR:-$(mktemp -d)}/deploy"
rm -rf "$copy"
mkdir -p "$copy"
cp -rL "$dir" "$copy/kubernetes"
cp -rL "$dir/../overlays" "$copy/overlays"
kubectl kustomize "$copy/kubernetes" >"$out"
echo "rendered $(grep -c '^kind:' "$out") objects: $(grep '^kind:' "$out" | awk '{print $2}' | tr '\n' ' ')"
overlay_out="${out%.yaml}-test-overlay.yaml"
kubectl kustomize "$copy/overlays/test" >"$overlay_out"
echo "rendered the test overlay: $(grep -c '^kind:' "$overlay_out") objects"
if /usr/bin/python3 -c 'import kubernetes_validate' 2>/dev/null; then
  /usr/bin/python3 -m kubernetes_validate --strict -k 1.29.0 "$out"
  # The overlay's objects too, but its policy/v1beta1 PodDisruptionBudget
  # (for its 1.20 cluster; 1.29 no longer serves that version).
  /usr/bin/python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
yaml.safe_dump_all([d for d in docs if d["apiVersion"] != "policy/v1beta1"],
                   open(sys.argv[2], "w"))' "$overlay_out" "$overlay_out.v129.yaml"
  /usr/bin/python3 -m kubernetes_validate --strict -k 1.29.0 "$overlay_out.v129.yaml"
else
  echo "SKIPPED schema validation: kubernetes-validate missing (tools/setup.sh installs it)"
fi

# python3-yaml comes with python3-torch, which tools/setup.sh installs.
OVERLAY="$overlay_out" PREBUILT="$dir/../Dockerfile.prebuilt" \
  /usr/bin/python3 - "$out" "$dir/../Dockerfile" \
  "trainyard-worker=$worker" "trainyard-controller=$controller" \
  "trainyard=$cli" <<'EOF'
import os
import posixpath
import re
import subprocess
import sys

import yaml

rendered, dockerfile = sys.argv[1], sys.argv[2]
binaries = {}
for arg in sys.argv[3:]:
    name, path = arg.split("=", 1)
    if path:
        binaries[name] = path

NAMESPACE = "trainyard"
BIN_DIR = "/opt/trainyard/bin/"
CONTROLLER = {"app": "trainyard", "component": "controller"}
WORKER = {"app": "trainyard", "component": "worker"}
CLIENT = {"trainyard-client": "true"}
MONITORING = {"trainyard-monitoring": "true"}
TLS_SECRET = "trainyard-tls"
TOKENS_SECRET = "trainyard-tokens"
# Flags whose value is a file that must come from a mounted Secret.
SECRET_FILE_FLAGS = ("tls_cert", "tls_key", "tls_ca", "tokens_file")
# What each daemon must be given, and nothing more of the Secrets.
EXPECTED_SECRET_FILES = {
    "controller": {(TLS_SECRET, "ca.pem"), (TLS_SECRET, "controller.pem"),
                   (TLS_SECRET, "controller.key"),
                   (TOKENS_SECRET, "tokens")},
    "worker": {(TLS_SECRET, "ca.pem"), (TLS_SECRET, "worker.pem"),
               (TLS_SECRET, "worker.key")},
}
EXPECTED_FLAGS = {
    "controller": {"tls_cert", "tls_key", "tls_ca", "tokens_file"},
    "worker": {"tls_cert", "tls_key", "tls_ca"},
}
# Ingress by container port name: who may connect, as (namespace, labels);
# "same" = the pod's own namespace, "any" = every namespace.
def sel(labels):
    return tuple(sorted(labels.items()))


EXPECTED_INGRESS = {
    "controller": {"grpc": {("same", sel(WORKER)), ("same", sel(CLIENT))},
                   "metrics": {("any", sel(MONITORING))}},
    "worker": {"peer": {("same", sel(WORKER))},
               "metrics": {("any", sel(MONITORING))}},
}
# The worker's readiness follows its registration (worker/worker_daemon.cc);
# every other probe checks the overall status ("").
PROBE_SERVICE = {
    ("worker", "readinessProbe"): "trainyard.v1.WorkerRegistration",
    ("worker", "livenessProbe"): "",
    ("controller", "readinessProbe"): "",
    ("controller", "livenessProbe"): "",
}

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
    return ok


def flags_of(argv):
    """{name: value} of --name=value / --name arguments."""
    flags = {}
    for a in argv:
        m = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", a)
        if m:
            flags[m.group(1)] = m.group(2) if m.group(2) is not None else True
    return flags


def labels_match(selector, labels):
    check("matchExpressions" not in selector,
          f"selector {selector}: matchExpressions are not understood by "
          "this test")
    return all(labels.get(k) == v
               for k, v in (selector.get("matchLabels") or {}).items())


def pod_spec(obj):
    kind = obj["kind"]
    if kind == "Pod":
        return obj["metadata"], obj["spec"]
    if kind == "CronJob":
        t = obj["spec"]["jobTemplate"]["spec"]["template"]
    else:
        t = obj["spec"]["template"]
    return t["metadata"], t["spec"]


docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
WORKLOADS = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet",
             "Job", "CronJob")

# --- The image: its binaries and its user. ---
image = open(dockerfile).read()
m = re.search(r"^USER\s+(\d+):(\d+)\s*$", image, re.M)
if check(m, f"{dockerfile}: no numeric USER uid:gid line"):
    image_uid, image_gid = int(m.group(1)), int(m.group(2))
    check(image_uid != 0 and image_gid != 0,
          f"{dockerfile}: USER {image_uid}:{image_gid} is root")
else:
    image_uid = image_gid = None
check(re.search(r"^COPY --from=build /out/bin/ " + re.escape(BIN_DIR) + r"$",
                image, re.M),
      f"{dockerfile}: binaries not copied to {BIN_DIR}")
image_binaries = set(re.findall(r"bazel-bin/[\w/]+/([\w-]+)\s", image))
image_binaries = {b for b in image_binaries if not b.startswith("lib")}

# --- Every pod. ---
# (role, container name, binary, argv) of every command run, for the flag
# check below.
commands = []
pods = {}  # "Kind/name" -> (role, labels, namespace, spec)
for obj in docs:
    if obj["kind"] not in WORKLOADS:
        continue
    where = f'{obj["kind"]}/{obj["metadata"]["name"]}'
    meta, spec = pod_spec(obj)
    labels = meta.get("labels", {})
    role = ("controller" if labels_match({"matchLabels": CONTROLLER}, labels)
            else "worker" if labels_match({"matchLabels": WORKER}, labels)
            else None)
    if role:
        pods[where] = (role, labels, obj["metadata"].get("namespace"), spec)
    check(obj["metadata"].get("namespace") == NAMESPACE,
          f"{where}: not in namespace {NAMESPACE}")

    psc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not spec.get(key), f"{where}: {key} is set")
    check(spec.get("automountServiceAccountToken") is False,
          f"{where}: automountServiceAccountToken is not false (the daemons "
          "never call the Kubernetes API)")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for v in volumes.values():
        check("hostPath" not in v, f'{where}: volume {v["name"]} is a hostPath')
        if "secret" in v:
            modes = [v["secret"].get("defaultMode")]
            modes += [i["mode"] for i in v["secret"].get("items", [])
                      if "mode" in i]
            for mode in modes:
                # Owner/group read at most; 0644 is the default, so say it.
                check(mode is not None and mode & 0o337 == 0,
                      f'{where}: secret volume {v["name"]}: mode '
                      f'{oct(mode) if mode is not None else "unset (0644)"}'
                      ", want 0440 or tighter")
            if v["secret"]["secretName"] == TLS_SECRET:
                # Without items every key would be there, e.g. a ca.key
                # someone put into the Secret.
                check(v["secret"].get("items"),
                      f'{where}: {TLS_SECRET} mounted whole: list its items')
    if any("secret" in v for v in volumes.values()):
        check(psc.get("fsGroup") == image_gid,
              f"{where}: fsGroup {psc.get('fsGroup')}, want {image_gid} "
              "(the Secret files are root-owned 0440: the group reads them)")

    containers = spec.get("initContainers", []) + spec["containers"]
    for c in containers:
        cwhere = f'{where} container {c["name"]}'
        csc = c.get("securityContext", {})

        def eff(key):
            return csc.get(key, psc.get(key))

        check(eff("runAsNonRoot") is True, f"{cwhere}: runAsNonRoot is not true")
        check(eff("runAsUser") == image_uid,
              f"{cwhere}: runAsUser {eff('runAsUser')}, want the image's "
              f"{image_uid}")
        check(eff("runAsGroup") == image_gid,
              f"{cwhere}: runAsGroup {eff('runAsGroup')}, want the image's "
              f"{image_gid}")
        check((eff("seccompProfile") or {}).get("type") == "RuntimeDefault",
              f"{cwhere}: seccompProfile is not RuntimeDefault")
        check(csc.get("readOnlyRootFilesystem") is True,
              f"{cwhere}: readOnlyRootFilesystem is not true")
        check(csc.get("allowPrivilegeEscalation") is False,
              f"{cwhere}: allowPrivilegeEscalation is not false")
        check(not csc.get("privileged"), f"{cwhere}: privileged")
        caps = csc.get("capabilities", {})
        check("ALL" in caps.get("drop", []),
              f"{cwhere}: capabilities do not drop ALL")
        check(not caps.get("add"), f"{cwhere}: adds capabilities {caps.get('add')}")

        # Mounts: writable ones are scratch or claims; Secrets read-only,
        # never through subPath (its files would not follow updates).
        mounted = {}  # mountPath -> volume
        for vm in c.get("volumeMounts", []):
            v = volumes.get(vm["name"])
            if not check(v, f'{cwhere}: mounts unknown volume {vm["name"]}'):
                continue
            mounted[vm["mountPath"]] = v
            if "secret" in v:
                check(vm.get("readOnly") is True,
                      f'{cwhere}: secret volume {vm["name"]} not mounted '
                      "readOnly")
                check("subPath" not in vm,
                      f'{cwhere}: secret volume {vm["name"]} mounted with '
                      "subPath (updates would not reach the pod)")
            if not vm.get("readOnly"):
                writable = ("emptyDir" in v or (
                    "persistentVolumeClaim" in v
                    and not v["persistentVolumeClaim"].get("readOnly")))
                check(writable, f'{cwhere}: {vm["mountPath"]} is writable but '
                      "neither an emptyDir nor a claim")
        check("emptyDir" in mounted.get("/tmp", {}),
              f"{cwhere}: /tmp is not an emptyDir (the root filesystem is "
              "read-only)")
        secret_files = {}  # path in the container -> (secret, key)
        for path, v in mounted.items():
            if "secret" in v:
                items = v["secret"].get("items")
                if items:
                    for i in items:
                        secret_files[posixpath.join(path, i["path"])] = (
                            v["secret"]["secretName"], i["key"])
        check(not any(k == "ca.key" for _, k in secret_files.values()),
              f"{cwhere}: mounts the CA's private key")

        argv = (c.get("command") or []) + (c.get("args") or [])
        check(argv and argv[0].startswith(BIN_DIR),
              f"{cwhere}: command {argv[:1]} is not one of {BIN_DIR}")
        runs = [("command", argv)]
        for probe in ("readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not check(p, f"{cwhere}: no {probe}"):
                continue
            exec_ = p.get("exec")
            if not check(exec_, f"{cwhere}: {probe} is not an exec probe "
                         "(the kubelet's gRPC probes cannot speak TLS)"):
                continue
            cmd = exec_["command"]
            runs.append((probe, cmd))
            check(cmd[:2] == [BIN_DIR + "trainyard", "health"],
                  f"{cwhere}: {probe} runs {cmd[:2]}, want trainyard health")
            pf = flags_of(cmd)
            check(isinstance(pf.get("tls_ca"), str),
                  f"{cwhere}: {probe} does not check the server against "
                  "--tls_ca")
            if role:
                want = PROBE_SERVICE[(role, probe)]
                check(pf.get("service", "") == want,
                      f"{cwhere}: {probe} checks service "
                      f'"{pf.get("service", "")}", want "{want}"')
        used_secret_files = set()
        for what, cmd in runs:
            commands.append((cwhere, what, cmd))
            f = flags_of(cmd)
            check(f.get("insecure") in (None, "false"),
                  f"{cwhere}: {what} runs --insecure")
            for name in SECRET_FILE_FLAGS:
                if name in f:
                    src = secret_files.get(f[name])
                    if check(src, f"{cwhere}: {what}: --{name}={f[name]} is "
                             "not a file of a mounted Secret"):
                        used_secret_files.add(src)
        if role:
            f = flags_of(argv)
            missing = EXPECTED_FLAGS[role] - set(f)
            check(not missing, f"{cwhere}: lacks --{', --'.join(sorted(missing))}")
            check(set(secret_files.values()) == EXPECTED_SECRET_FILES[role],
                  f"{cwhere}: mounts Secret files "
                  f"{sorted(secret_files.values())}, want exactly "
                  f"{sorted(EXPECTED_SECRET_FILES[role])}")
            check(used_secret_files == EXPECTED_SECRET_FILES[role],
                  f"{cwhere}: flags use Secret files "
                  f"{sorted(used_secret_files)}, want "
                  f"{sorted(EXPECTED_SECRET_FILES[role])}")
        # Every port bound beyond loopback is declared (so the policies
        # below, which cover the declared ports, cover it).
        declared = {p["containerPort"] for p in c.get("ports", [])}
        for name, value in flags_of(argv).items():
            m = re.fullmatch(r"(.*):(\d+)", str(value))
            if name.endswith("listen") and m:
                check(m.group(1) in ("127.0.0.1", "localhost")
                      or int(m.group(2)) in declared,
                      f"{cwhere}: --{name}={value} listens beyond loopback on "
                      "a port it does not declare")
        for b in {posixpath.basename(cmd[0]) for _, cmd in runs if cmd}:
            check(b in image_binaries,
                  f"{cwhere}: runs {b}, which {dockerfile} does not install "
                  f"(it installs {sorted(image_binaries)})")

roles = [r for r, _, _, _ in pods.values()]
check(roles.count("controller") == 1,
      f"{roles.count('controller')} controller workloads, want 1")
check(roles.count("worker") == 2,
      f"{roles.count('worker')} worker workloads, want 2 (CPU and GPU)")

# --- NetworkPolicies. ---
policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
for p in policies:
    check(p["metadata"].get("namespace") == NAMESPACE,
          f'NetworkPolicy/{p["metadata"]["name"]}: not in {NAMESPACE}')
check(any(not (p["spec"].get("podSelector") or {})
          and "Ingress" in p["spec"].get("policyTypes", [])
          and not p["spec"].get("ingress") for p in policies),
      "no default-deny-ingress NetworkPolicy (podSelector {}, policyTypes "
      "[Ingress], no rules)")


def peer_key(peer, where):
    check("ipBlock" not in peer, f"{where}: admits an ipBlock {peer}")
    ns = peer.get("namespaceSelector")
    if ns is None:
        space = "same"
    elif not ns:
        space = "any"
    else:
        space = repr(ns)
    pod = peer.get("podSelector")
    check(pod and pod.get("matchLabels") and not pod.get("matchExpressions"),
          f"{where}: peer {peer} does not select pods by label")
    return (space, sel((pod or {}).get("matchLabels") or {}))


for where, (role, labels, ns, spec) in pods.items():
    port_names = {}
    for c in spec["containers"]:
        for p in c.get("ports", []):
            port_names[p["containerPort"]] = p.get("name")
            port_names[p.get("name")] = p.get("name")
    selecting = [p for p in policies
                 if labels_match(p["spec"].get("podSelector") or {}, labels)
                 and "Ingress" in p["spec"].get("policyTypes", [])]
    check(any(p["spec"].get("podSelector") for p in selecting),
          f"no NetworkPolicy selects the {role} pods of {where} by label")
    admitted = {}  # port name -> {(namespace, labels)}
    for p in selecting:
        for i, rule in enumerate(p["spec"].get("ingress") or []):
            where = f'NetworkPolicy/{p["metadata"]["name"]} ingress[{i}]'
            if not check(rule.get("from"), f"{where}: admits every source"):
                continue
            if not check(rule.get("ports"), f"{where}: admits every port"):
                continue
            for port in rule["ports"]:
                check(port.get("protocol", "TCP") == "TCP" and "endPort" not in port,
                      f"{where}: port {port} is not one TCP port")
                name = port_names.get(port.get("port"))
                if check(name, f"{where}: port {port.get('port')} is not a "
                         f"declared port of the {role}"):
                    for peer in rule["from"]:
                        admitted.setdefault(name, set()).add(peer_key(peer, where))
    want = EXPECTED_INGRESS[role]
    declared = {p.get("name") for c in spec["containers"]
                for p in c.get("ports", [])}
    check(declared == set(want),
          f"{where} ({role}) declares ports {sorted(declared)}, the test "
          f"expects {sorted(want)}")
    check(admitted == want,
          f"NetworkPolicies admit to {where} ({role}): {admitted}; want {want}")

# --- Every flag and command is one the binary knows. ---
helps = {}
def help_of(binary):
    if binary not in helps:
        r = subprocess.run([binaries[binary], "--helpfull"],
                           capture_output=True, text=True)
        helps[binary] = r.stdout + r.stderr
    return helps[binary]

skipped = set()
for cwhere, what, cmd in commands:
    binary = posixpath.basename(cmd[0]) if cmd else ""
    if binary not in binaries:
        skipped.add(binary)
        continue
    text = help_of(binary)
    names = [a for a in cmd[1:] if not a.startswith("-")]
    if names:  # a subcommand, e.g. `trainyard health`
        known = re.search(r"^\s+" + re.escape(names[0]) + r"\b", text, re.M)
        check(known, f"{cwhere}: {what} runs `{binary} {names[0]}`, "
              f"which {binary} does not list")
    for flag in flags_of(cmd[1:]):
        known = re.search(r"(^|\s)--" + re.escape(flag) + r"[ )]", text, re.M)
        check(known, f"{cwhere}: {what} passes --{flag}, which {binary} does "
              "not define")

# --- CPU and GPU workers, their budget and sizing. ---
def container(spec, name):
    return next((c for c in spec["containers"] if c["name"] == name), None)


by_device = {}
for where, (role, labels, ns, spec) in pods.items():
    if role != "worker":
        continue
    check(where.startswith("StatefulSet/"), f"{where}: workers are not a StatefulSet")
    c = container(spec, "worker")
    argv = (c.get("command") or []) + (c.get("args") or [])
    device = flags_of(argv).get("device")
    res = c.get("resources", {})
    gpus = (res.get("limits", {}).get("nvidia.com/gpu"),
            res.get("requests", {}).get("nvidia.com/gpu"))
    if device == "cpu":
        check(gpus == (None, None), f"{where}: a CPU worker asks for GPUs {gpus}")
    elif check(device == "cuda:0", f"{where}: --device={device}, want cpu or cuda:0"):
        check(gpus == (1, 1), f"{where}: GPU worker asks for nvidia.com/gpu "
              f"(limit, request) {gpus}, want (1, 1)")
    check(device not in by_device, f"{where}: a second --device={device} workload")
    by_device[device] = (where, labels, spec)
check(set(by_device) == {"cpu", "cuda:0"},
      f"worker devices {sorted(by_device)}, want cpu and cuda:0")
pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
for device, (where, labels, spec) in by_device.items():
    check(spec.get("terminationGracePeriodSeconds"),
          f"{where}: no terminationGracePeriodSeconds")
    covering = [p for p in pdbs
                if labels_match(p["spec"].get("selector") or {}, labels)]
    check(len(covering) == 1 and covering[0]["apiVersion"] == "policy/v1",
          f"{where}: covered by {len(covering)} policy/v1 PodDisruptionBudgets, want 1")
sizing = next((d for d in docs if d["kind"] == "ConfigMap"
               and d["metadata"]["name"] == "trainyard-sizing"), None)
if check(sizing, "no trainyard-sizing ConfigMap (the sizing variables)") \
        and "cpu" in by_device:
    res = container(by_device["cpu"][2], "worker")["resources"]
    check(str(res["requests"]["cpu"]) == sizing["data"]["worker-cpu"]
          and res["requests"]["memory"] == sizing["data"]["worker-memory"],
          f"CPU worker requests {res['requests']} are not the sizing "
          f"ConfigMap's {sizing['data']}")

# --- Dockerfile.prebuilt: the same runtime image. ---
def runtime_stage(text):
    lines, cont = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        cont += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            lines.append(" ".join(cont.split()))
            cont = ""
    start = max(i for i, l in enumerate(lines) if l.startswith("FROM "))
    return [l for l in lines[start:] if not l.startswith("COPY ")]


prebuilt = os.environ.get("PREBUILT")
if check(prebuilt and os.path.exists(prebuilt), f"no {prebuilt}"):
    a, b = runtime_stage(image), runtime_stage(open(prebuilt).read())
    check(a == b, f"{prebuilt}: its image differs from {dockerfile}'s runtime "
          f"stage (besides COPY): {sorted(set(a) ^ set(b))}")

# --- The test cluster's overlay. ---
overlay = [d for d in yaml.safe_load_all(open(os.environ["OVERLAY"])) if d]
base_objs = {(d["kind"], d["metadata"]["name"]): d for d in docs}
over_objs = {(d["kind"], d["metadata"]["name"]): d for d in overlay}
extra_kinds = {k for k in set(over_objs) - set(base_objs)}
check(all(k == "PersistentVolume" for k, _ in extra_kinds),
      f"the test overlay adds {sorted(extra_kinds)}; want only PersistentVolumes")
for key, obj in over_objs.items():
    if obj["kind"] not in WORKLOADS:
        continue
    where = "overlay " + "/".join(key)
    base = base_objs.get(key)
    if not check(base, f"{where}: not in the base"):
        continue
    _, spec = pod_spec(obj)
    _, bspec = pod_spec(base)
    check(spec.get("hostNetwork") is True, f"{where}: not hostNetwork "
          "(the test cluster has no pod network)")
    for c in spec["containers"]:
        csc = c.get("securityContext", {})
        bc = container(bspec, c["name"])
        check(csc == (bc or {}).get("securityContext"),
              f"{where} container {c['name']}: securityContext differs from the base")
        check(c.get("volumeMounts") == (bc or {}).get("volumeMounts"),
              f"{where} container {c['name']}: volumeMounts differ from the base")
        for probe in ("readinessProbe", "livenessProbe"):
            cmd = " ".join(c.get(probe, {}).get("exec", {}).get("command", []))
            check(BIN_DIR + "trainyard health" in cmd and "--tls_ca=" in cmd,
                  f"{where}: {probe} does not run trainyard health over TLS")
    check(spec.get("securityContext") == bspec.get("securityContext"),
          f"{where}: pod securityContext differs from the base")
    check(spec.get("volumes") == bspec.get("volumes") and
          spec.get("automountServiceAccountToken") is False,
          f"{where}: volumes or service account token differ from the base")

for b in sorted(skipped):
    print(f"SKIPPED flag check for {b}: binary not passed to the test")
print(f"checked {len(pods)} daemons, {len(commands)} commands, "
      f"{len(policies)} NetworkPolicies")

if failures:
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
EOF
echo "PASS"
