"""Secure by default, refused properly: a cluster run as `trainyard up` runs
it (TLS, worker certificates, tokens), attacked: missing and wrong tokens,
another user's job, a plaintext client, workers without the cluster's
certificate, spec paths leaving the data folder, strangers on the data
plane.
Every refusal is checked for its code, its message, and that nothing
changed."""
import os
import socket
import struct
import subprocess
import time

import grpc

from cluster import (CLI_BIN, PLUGIN_DIR, TERMINAL, WORKER_BIN, Cluster, pb,
                     pb_grpc, small_spec, spec_from_json, wait_for)

data_root = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "jobdata")
os.makedirs(data_root, exist_ok=True)
cluster = Cluster(workers=2, secure=True,
                  controller_args=[f"--job_data_dir={data_root}",
                                   f"--plugin_dir={PLUGIN_DIR}"])
wait_for(lambda: len(cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers) == 2, 30, "2 workers")
alice = cluster.add_user("alice")
bob = cluster.add_user("bob")
as_alice = pb_grpc.JobServiceStub(cluster.make_channel(alice))
as_bob = pb_grpc.JobServiceStub(cluster.make_channel(bob))
anonymous = pb_grpc.JobServiceStub(cluster.make_channel(None))
wrong = pb_grpc.JobServiceStub(cluster.make_channel("ty_" + "0" * 64))


def refused(call, code, *needles):
    try:
        call()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        for n in needles:
            assert n in e.details(), (n, e.details())
        assert len(e.details()) < 1024, len(e.details())
        return e.details()
    raise AssertionError(f"expected {code}, the call succeeded")


def all_jobs():
    return {j.job_id: (j.state, j.reason, j.owner)
            for j in cluster.jobs.ListJobs(pb.ListJobsRequest(page_size=1000),
                                           timeout=10).jobs}


# Alice's long job: the thing under attack.
spec = spec_from_json(small_spec(stages=2, steps=1000000, name="alices"))
job = as_alice.SubmitJob(pb.SubmitJobRequest(request_id="alice-1", spec=spec),
                         timeout=30)
assert job.owner == "alice", job.owner
wait_for(lambda: cluster.get(job.job_id).state == pb.RUNNING, 60, "running")
before = all_jobs()

# 1. No token, a wrong token: UNAUTHENTICATED, saying what to do.
for stub, what in ((anonymous, "no token"), (wrong, "not recognised")):
    for call in (lambda s=stub: s.ListJobs(pb.ListJobsRequest(), timeout=10),
                 lambda s=stub: s.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10),
                 lambda s=stub: s.CancelJob(pb.CancelJobRequest(job_id=job.job_id,
                                                                reason="mallory"), timeout=10),
                 lambda s=stub: s.SubmitJob(pb.SubmitJobRequest(request_id="m", spec=spec),
                                            timeout=10),
                 lambda s=stub: s.ListWorkers(pb.ListWorkersRequest(), timeout=10),
                 lambda s=stub: next(iter(s.WatchJob(pb.WatchJobRequest(job_id=job.job_id),
                                                     timeout=10)))):
        refused(call, grpc.StatusCode.UNAUTHENTICATED, what, "TRAINYARD_TOKEN")
print("ok: no token / wrong token -> UNAUTHENTICATED on every JobService call")

# 2. Another user's job: bob cannot see, watch or cancel alice's job, does
# not list it, and alice's request id gets bob his own job.
refused(lambda: as_bob.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10),
        grpc.StatusCode.PERMISSION_DENIED, job.job_id, "belongs to another user")
refused(lambda: as_bob.CancelJob(pb.CancelJobRequest(job_id=job.job_id,
                                                     reason="mallory was here"),
                                 timeout=10),
        grpc.StatusCode.PERMISSION_DENIED, "only its owner or an admin may cancel")
refused(lambda: next(iter(as_bob.WatchJob(pb.WatchJobRequest(job_id=job.job_id),
                                          timeout=10))),
        grpc.StatusCode.PERMISSION_DENIED, "watch")
assert all_jobs() == before, (all_jobs(), before)
assert job.job_id not in [j.job_id for j in as_bob.ListJobs(
    pb.ListJobsRequest(), timeout=10).jobs]
small = spec_from_json(small_spec(stages=1, steps=2, name="bobs"))
bobs = as_bob.SubmitJob(pb.SubmitJobRequest(request_id="alice-1", spec=small),
                        timeout=30)
assert bobs.job_id != job.job_id and bobs.owner == "bob", bobs
again = as_alice.SubmitJob(pb.SubmitJobRequest(request_id="alice-1", spec=spec),
                           timeout=30)
assert again.job_id == job.job_id, "alice's retry must return her own job"
assert [j.job_id for j in as_bob.ListJobs(pb.ListJobsRequest(), timeout=10).jobs] \
    == [bobs.job_id]
assert {job.job_id, bobs.job_id} <= set(all_jobs()), "the admin sees every job"
print("ok: another user's job -> PERMISSION_DENIED for get/watch/cancel; "
      "lists and request ids are per user; the admin sees all")

# 3. A plaintext client against the TLS port: refused, and the CLI says why.
plain = pb_grpc.JobServiceStub(grpc.insecure_channel(cluster.address))
refused(lambda: plain.ListJobs(pb.ListJobsRequest(), timeout=5),
        grpc.StatusCode.UNAVAILABLE)
out = subprocess.run([CLI_BIN, "list", f"--controller={cluster.address}",
                      "--insecure", f"--token_file={cluster.admin_token_path}"],
                     capture_output=True, text=True, timeout=60)
assert out.returncode == 3, (out.returncode, out.stderr)
assert "a controller with TLS refuses it" in out.stderr, out.stderr
out = subprocess.run([CLI_BIN, "list", f"--controller={cluster.address}",
                      f"--tls_ca={cluster.ca_path}"],
                     capture_output=True, text=True, timeout=60,
                     env={k: v for k, v in os.environ.items()
                          if not k.startswith("TRAINYARD_")})
assert out.returncode == 4 and "UNAUTHENTICATED" in out.stderr, out.stderr
print("ok: plaintext client -> UNAVAILABLE; CLI without a token -> exit 4")

# 4. Workers without the cluster's certificate cannot register or get work.
workers_before = {w.worker_id for w in cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers}
other = os.path.join(cluster.dir, "other-pki")
subprocess.run([CLI_BIN, "certs", "--out", other], check=True,
               capture_output=True, timeout=60)
log = open(os.path.join(cluster.dir, "rogue.log"), "wb")
rogue = subprocess.Popen([WORKER_BIN, f"--controller={cluster.address}",
                          "--name=rogue", "--threads=1",
                          f"--tls_cert={other}/worker.pem",
                          f"--tls_key={other}/worker.key",
                          f"--tls_ca={cluster.ca_path}"],
                         stdout=log, stderr=subprocess.STDOUT)
# A TLS client with no certificate at all, speaking WorkerService itself.
tls_only = grpc.secure_channel(cluster.address, grpc.ssl_channel_credentials(
    root_certificates=open(cluster.ca_path, "rb").read()))
connect = tls_only.stream_stream(
    "/trainyard.v1.WorkerService/Connect",
    request_serializer=pb.WorkerMessage.SerializeToString,
    response_deserializer=pb.ControllerMessage.FromString)
hello = pb.WorkerMessage()
hello.register.name = "fake"
hello.register.capabilities.device = "cpu"
hello.register.capabilities.peer_address = "127.0.0.1:1"
refused(lambda: next(iter(connect(iter([hello]), timeout=10))),
        grpc.StatusCode.UNAUTHENTICATED, "client certificate signed by the cluster CA")
time.sleep(3)
assert rogue.poll() is None, "the rogue worker keeps retrying, it does not crash"
rogue.kill()
rogue.wait(timeout=10)
workers_after = {w.worker_id for w in cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers}
assert workers_after == workers_before, (
    workers_before, workers_after, cluster.log("controller"))
rogue_log = open(os.path.join(cluster.dir, "rogue.log"), errors="replace").read()
assert "registered" not in rogue_log.lower().replace("unregistered", ""), rogue_log[-2000:]
print("ok: a worker with another CA's certificate, or none, cannot register")

# 5. A spec path that leaves the data folder is refused at submit, naming
# the field; nothing is stored.
for path, field in (("../outside.npy", "data.train.npy.features"),
                    ("/etc/passwd", "data.train.npy.features")):
    bad = small_spec(stages=1, steps=1, name="escape")
    bad["data"]["train"] = {"npy": {"features": path, "targets": "y.npy"}}
    bad["model"]["blocks"][0]["inFeatures"] = 4
    n = len(all_jobs())
    msg = refused(lambda: as_alice.SubmitJob(pb.SubmitJobRequest(
        request_id=f"esc-{path}", spec=spec_from_json(bad)), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT, field, "outside the data folder",
        "--job_data_dir")
    assert "root:" not in msg, msg
    assert len(all_jobs()) == n
print("ok: spec paths outside --job_data_dir -> INVALID_ARGUMENT naming the field")

# 5b. The plugin's config is checked at submit (validate_config), and only
# real plugins can be named.
for config, needle in (({"label_smoothing": 2.0}, "task.config.label_smoothing"),
                       ({"no_such_key": 1}, "no_such_key")):
    bad = small_spec(stages=1, steps=1, name="badconfig")
    bad["task"]["config"] = config
    n = len(all_jobs())
    refused(lambda: as_alice.SubmitJob(pb.SubmitJobRequest(
        request_id=f"cfg-{needle}", spec=spec_from_json(bad)), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT, needle)
    assert len(all_jobs()) == n
bad = small_spec(stages=1, steps=1, name="noplugin")
bad["task"]["plugin"] = "no_such_plugin"
refused(lambda: as_alice.SubmitJob(pb.SubmitJobRequest(
    request_id="noplugin", spec=spec_from_json(bad)), timeout=30),
    grpc.StatusCode.INVALID_ARGUMENT, "task.plugin")
print("ok: a bad task.config or plugin -> INVALID_ARGUMENT at submit")


# 5c. Request bytes that do not parse: a task.config nested past protobuf's
# recursion limit (wire bytes written by hand), and a truncated message.
# Authentication first (UNAUTHENTICATED without a token), then
# INVALID_ARGUMENT saying why; nothing is stored.
def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def field(number, payload):  # a length-delimited field
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def nested_struct(depth):  # {"a": {"a": ... {"a": 1.0}}}
    value = (field(5, nested_struct(depth - 1)) if depth > 1
             else b"\x11" + struct.pack("<d", 1.0))  # Value.number_value
    return field(1, field(1, b"a") + field(2, value))  # Struct.fields entry


deep = (field(1, b"deep") +  # SubmitJobRequest.request_id
        field(2, field(5, field(2, nested_struct(150)))))  # spec.task.config


def raw(channel, method, payload):
    return channel.unary_unary(f"/trainyard.v1.JobService/{method}")(
        payload, timeout=10)


n = len(all_jobs())
refused(lambda: raw(cluster.make_channel(None), "SubmitJob", deep),
        grpc.StatusCode.UNAUTHENTICATED)
refused(lambda: raw(cluster.make_channel(alice), "SubmitJob", deep),
        grpc.StatusCode.INVALID_ARGUMENT,
        "SubmitJob: the request is not a valid trainyard.v1.SubmitJobRequest:"
        " nested deeper than protobuf's recursion limit (100)")
refused(lambda: raw(cluster.make_channel(alice), "GetJob", b"\x0a\x64xy"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "GetJob: the request is not a valid trainyard.v1.GetJobRequest:"
        " malformed protobuf (4 bytes)")
assert len(all_jobs()) == n
print("ok: unparseable request bytes -> INVALID_ARGUMENT saying why, after "
      "authentication")

# The job under attack was changed by none of the above; alice ends it.
as_alice.CancelJob(pb.CancelJobRequest(job_id=job.job_id, reason="done"), timeout=10)
final = cluster.wait_state(job.job_id, TERMINAL)
assert final.reason == "cancelled by alice: done", final.reason


# 6. The data plane: a stranger who knows the job id (ids are sequential)
# dials the stage ports as "rank 1" before the job starts and answers the
# challenge without the job's secret. It is rejected before any frame, and
# the job runs bitwise as an unattacked one.
def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def listener_message(sock):
    magic, code, length, _ = struct.unpack("<IIHH", recv_exact(sock, 12))
    assert magic == 0x41485954, hex(magic)
    return code, recv_exact(sock, length)


def losses(job_id):
    return {e.step.step: e.step.loss for e in cluster.watch(job_id, timeout=120)
            if e.WhichOneof("event") == "step"}


short = spec_from_json(small_spec(stages=2, steps=20, name="dataplane"))
reference = as_alice.SubmitJob(pb.SubmitJobRequest(request_id="dp-ref", spec=short),
                               timeout=30)
want = losses(reference.job_id)
next_id = "job-%d" % (int(reference.job_id.split("-")[1]) + 1)
peers = [w.capabilities.peer_address for w in cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers]
attackers = []
for peer in peers:
    host, port = peer.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    job_bytes = next_id.encode()
    sock.sendall(struct.pack("<IHHii", 0x53485954, 3, len(job_bytes), 1, 0) +
                 os.urandom(32) + job_bytes)
    attackers.append(sock)
attacked = as_alice.SubmitJob(pb.SubmitJobRequest(request_id="dp-attacked", spec=short),
                              timeout=30)
assert attacked.job_id == next_id, (attacked.job_id, next_id)
outcomes = []
for sock in attackers:
    code, body = listener_message(sock)
    if code == 2:  # the challenge: this worker runs rank 0; answer it badly
        sock.sendall(struct.pack("<I", 0x50485954) + os.urandom(32))
        code, body = listener_message(sock)
    outcomes.append((code, body.decode(errors="replace")))
    sock.close()
print("data-plane answers:", outcomes)
assert any(code == 1 and "data-plane authentication failed" in text
           for code, text in outcomes), outcomes
assert all(code == 1 for code, _ in outcomes), outcomes
got = losses(attacked.job_id)
assert cluster.get(attacked.job_id).state == pb.SUCCEEDED
assert got == want, "the attacked job must train bitwise as the reference"
print("ok: a data-plane connection without the job secret is rejected; the job "
      "is bitwise unaffected")
print("PASS")
