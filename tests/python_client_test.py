"""The Python client package (python/): `pip install ./python` works the
supported way, offline, and the installed package submits, lists, cancels,
watches (across a dropped stream) and waits on jobs of a real cluster,
sends its token, verifies TLS, and raises trainyard errors with the
controller's code and message.

Phase 1, under Debian's /usr/bin/python3 (as Bazel runs it): checks that the
checked-in stubs match proto/*.proto, copies python/ into TEST_TMPDIR and
installs it into a new venv (--system-site-packages, --no-build-isolation,
--no-index: no network), then runs this file again with the venv's python.
Phase 2, in the venv: imports trainyard from the venv and runs the cases.
"""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from concurrent import futures

PHASE_ENV = "PYTHON_CLIENT_TEST_VENV"
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()


def run(argv, timeout, **kwargs):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if out.returncode != 0:
        sys.exit(f"FAIL: {' '.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def install_and_reexec():
    from cluster import ROOT
    python_dir = os.path.join(ROOT, "python")
    # The stubs cannot go stale: regenerate them from proto/ and compare.
    print(run(["/usr/bin/python3", os.path.join(python_dir, "generate_stubs.py"), "--check",
               "--proto_root", ROOT], timeout=60).stdout.strip())
    src = os.path.join(TMP, "src")
    shutil.copytree(python_dir, os.path.join(src, "python"),  # runfiles are symlinks
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = os.path.join(TMP, "venv")
    start = time.time()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], timeout=120)
    out = run([os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation",
               "--no-index", "--no-cache-dir", "./python"], timeout=120, cwd=src, env=env)
    print(out.stdout.strip().splitlines()[-1])
    print(f"PASS pip install ./python into a venv, offline ({time.time() - start:.1f} s)")
    python = os.path.join(venv, "bin", "python")
    os.execve(python, [python, "-u", os.path.abspath(__file__)],
              dict(os.environ, **{PHASE_ENV: "1"}))


if not os.environ.get(PHASE_ENV):
    install_and_reexec()

# ---- Phase 2: the venv's python.

import trainyard  # noqa: E402

assert sys.prefix != sys.base_prefix, "not running in the venv"
assert trainyard.__file__.startswith(sys.prefix), f"trainyard from {trainyard.__file__}"
print(f"imported trainyard {trainyard.__version__} from {os.path.dirname(trainyard.__file__)}")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from cluster import ROOT, Cluster, small_spec  # noqa: E402
from trainyard._proto import trainyard_pb2 as pb, trainyard_pb2_grpc as pb_grpc  # noqa: E402

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def expect_error(cls, fn, *args, **kwargs):
    """Calls fn and returns the trainyard error it must raise: of class cls,
    carrying cls's code, with no grpc exception chained onto it."""
    try:
        fn(*args, **kwargs)
    except trainyard.Error as e:
        assert type(e) is cls, f"{type(e).__name__} ({e}), want {cls.__name__}"
        assert e.code == cls.code, (e.code, cls.code)
        assert str(e) == e.message and e.message, e.message
        context = None if e.__suppress_context__ else e.__context__
        assert e.__cause__ is None and not isinstance(context, grpc.RpcError), \
            "a grpc error is chained onto it"
        return e
    raise AssertionError(f"{fn.__name__}{args} raised nothing, want {cls.__name__}")


@contextlib.contextmanager
def environment(**values):
    """Sets (or, with None, removes) environment variables for a block."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


NO_AUTH_ENV = dict(TRAINYARD_TOKEN=None, TRAINYARD_TOKEN_FILE=None, TRAINYARD_CA=None)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


class Proxy:
    """A TCP proxy on 127.0.0.1 to `upstream` (host:port) that can cut every
    open connection (drop()), or, once, forward a request that contains
    `marker` but swallow the reply and close that connection (mute_once())."""

    def __init__(self, upstream):
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self.marker_seen = 0
        self._marker = None
        self._mute_next = False
        self._lock = threading.Lock()
        self._open = []
        threading.Thread(target=self._accept, daemon=True).start()

    def mute_once(self, marker):
        self._marker, self._mute_next = marker, True

    def drop(self):
        with self._lock:
            socks, self._open = self._open, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self):
        self._listener.close()
        self.drop()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                return
            conn = {"muted": False, "socks": (client, upstream)}
            with self._lock:
                self.connections += 1
                self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, conn, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, conn, False),
                             daemon=True).start()

    def _pump(self, src, dst, conn, outbound):
        tail = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if outbound and self._marker and self._marker in tail + data:
                    self.marker_seen += 1
                    if self._mute_next:
                        self._mute_next = False
                        conn["muted"] = True
                        threading.Timer(0.5, self._close, args=(conn,)).start()
                tail = data[-64:]
                if not outbound and conn["muted"]:
                    continue
                dst.sendall(data)
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn):
        for s in conn["socks"]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


# ---- Against a real plaintext cluster.

cluster = Cluster(workers=2)
client = trainyard.Client(cluster.address, tls=False, token="")
work = tempfile.mkdtemp(dir=TMP)


@case
def example_script_submits_and_watches_to_succeeded():
    spec_path = write(os.path.join(work, "example", "job.json"),
                      json.dumps(small_spec(stages=2, steps=8, name="from-python")))
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples/python_client/submit_and_watch.py"),
         "--controller", cluster.address, "--insecure", "--spec", spec_path],
        capture_output=True, text=True, timeout=120)
    print(out.stdout[-1500:], out.stderr[-1500:])
    assert out.returncode == 0, out.returncode
    lines = out.stdout.splitlines()
    assert [l.split()[1] for l in lines if l.startswith("step ")] == [str(i) for i in range(1, 9)]
    assert lines[-1].startswith("state SUCCEEDED"), lines[-1]
    assert all(l.count("loss=") == 1 for l in lines if l.startswith("step ")), lines[2]


@case
def submit_file_resolves_paths_against_its_folder():
    # Data files named relative to the spec, and no in_features: the client
    # makes the paths absolute and reads the width from the .npy header, as
    # `trainyard submit` does (the controller refuses a spec without it).
    rng = np.random.default_rng(3)
    data = os.path.join(work, "npyjob", "data")
    os.makedirs(data)
    features = rng.normal(size=(256, 8)).astype(np.float32)
    np.save(os.path.join(data, "features.npy"), features)
    np.save(os.path.join(data, "labels.npy"),
            (features[:, 0] > 0).astype(np.int64) + (features[:, 1] > 0))
    spec = {"name": "npy-relative", "steps": 4, "seed": 5,
            "model": {"blocks": [{"outFeatures": 16, "ffnHiddenSize": 16},
                                 {"outFeatures": 3, "ffnHiddenSize": 8}]},
            "parallelism": {"stages": 2, "microbatches": 2},
            "optimizer": {"lr": 0.01}, "task": {"plugin": "cross_entropy"},
            "data": {"train": {"npy": {"features": "data/features.npy",
                                       "targets": "data/labels.npy"}},
                     "batchSize": 32}}
    path = write(os.path.join(work, "npyjob", "job.json"), json.dumps(spec))
    job = client.submit(os.path.relpath(path))
    stored = client.get(job.job_id).spec
    assert stored.data.train.npy.features == os.path.join(data, "features.npy"), stored.data
    assert stored.model.blocks[0].in_features == 8, stored.model.blocks[0]
    final = client.wait(job.job_id, timeout=60)
    assert final.state == trainyard.JobState.SUCCEEDED and final.steps_completed == 4, final


@case
def watch_reconnects_and_yields_each_step_once():
    # A job far too long to end during the test, so the stream is live when
    # the proxy cuts it; cancelled once the watch has reconnected.
    proxy = Proxy(cluster.address)
    via_proxy = trainyard.Client(proxy.address, tls=False, token="")
    job = via_proxy.submit(small_spec(stages=2, steps=100000, name="watch-drop",
                                      samples=2048, features=64, batch=128))
    events = []
    for ev in via_proxy.watch(job.job_id, timeout=60, reconnect_for=20):
        events.append(ev)
        if isinstance(ev, trainyard.StepEvent) and ev.step == 6:
            proxy.drop()  # after the eval at step 4: resumes from step 5
        if isinstance(ev, trainyard.StepEvent) and ev.step == 50:
            client.cancel(job.job_id, "watched enough")
    proxy.close()
    got = [e.step for e in events if isinstance(e, trainyard.StepEvent)]
    assert got == list(range(1, len(got) + 1)) and len(got) >= 50, got
    evals = [e.step for e in events if isinstance(e, trainyard.EvalEvent)]
    assert evals == sorted(set(evals)) and 4 in evals and 8 in evals, evals
    assert proxy.connections >= 2, f"no reconnect ({proxy.connections} connection)"
    states = [e for e in events if isinstance(e, trainyard.StateEvent)]
    assert [e.state for e in states] == [trainyard.JobState.RUNNING,
                                         trainyard.JobState.CANCELLED], states
    assert states[-1] is events[-1] and states[-1].terminal
    assert states[-1].reason == "cancelled by request: watched enough", states[-1]
    assert all(isinstance(e.metrics, dict) for e in events if isinstance(e, trainyard.StepEvent))
    print(f"{len(got)} steps once each over {proxy.connections} connections")


@case
def submit_retries_unavailable_with_the_same_request_id():
    # The first attempt reaches the controller but its reply is lost (the
    # connection closes): the retry must send the same request id, so the
    # controller returns the job it stored instead of a second one.
    proxy = Proxy(cluster.address)
    via_proxy = trainyard.Client(proxy.address, tls=False, token="")
    name = f"retried-{uuid.uuid4().hex[:8]}"
    proxy.mute_once(name.encode())
    job = via_proxy.submit(small_spec(stages=2, steps=2, name=name))
    proxy.close()
    assert proxy.marker_seen == 2, f"the spec was sent {proxy.marker_seen} times, want 2"
    same = [j for j in client.list() if j.spec.name == name]
    assert [j.job_id for j in same] == [job.job_id], same
    assert job.request_id.startswith("req-"), job.request_id
    client.wait(job.job_id, timeout=60)

    # A fresh id per submit: the same spec twice is two jobs; an explicit
    # request id twice is one.
    a = client.submit(small_spec(stages=2, steps=2, name="twice"))
    b = client.submit(small_spec(stages=2, steps=2, name="twice"))
    assert a.job_id != b.job_id and a.request_id != b.request_id
    c = client.submit(small_spec(stages=2, steps=2, name="twice"), request_id=a.request_id)
    assert c.job_id == a.job_id
    for j in (a, b):
        client.wait(j.job_id, timeout=60)


@case
def cancel_then_wait_raises_job_failed():
    job = client.submit(small_spec(stages=2, steps=100000, name="to-cancel"))
    expect_error(trainyard.DeadlineExceeded, client.wait, job.job_id, timeout=1)
    cancelled = client.cancel(job.job_id, "no longer needed")
    assert cancelled.state == trainyard.JobState.CANCELLED, cancelled
    e = expect_error(trainyard.JobFailed, client.wait, job.job_id, timeout=30)
    assert e.code is None and e.state == trainyard.JobState.CANCELLED, e.state
    assert e.reason == "cancelled by request: no longer needed", e.reason
    assert e.job.job_id == job.job_id
    e = expect_error(trainyard.FailedPrecondition, client.cancel, job.job_id)
    assert e.message.startswith(f"job {job.job_id} is already CANCELLED"), e.message


@case
def list_reads_every_page():
    every = client.list()
    assert len(every) >= 6, len(every)
    paged = client.list(page_size=1)
    assert [j.job_id for j in paged] == [j.job_id for j in every]
    assert [j.create_time_ms for j in every] == sorted((j.create_time_ms for j in every),
                                                       reverse=True), "not newest first"
    cancelled = client.list(states=["CANCELLED"], page_size=2)
    assert cancelled and all(j.state == trainyard.JobState.CANCELLED for j in cancelled)
    done = client.list(states=[trainyard.JobState.SUCCEEDED, "cancelled"], page_size=2)
    assert len(done) == len(every), (len(done), len(every))
    expect_error(trainyard.InvalidArgument, client.list, states=["DONE"])


@case
def errors_carry_the_code_and_the_controllers_message():
    e = expect_error(trainyard.NotFound, client.get, "job-that-does-not-exist")
    assert "job-that-does-not-exist" in e.message and "not found" in e.message, e.message
    bad = small_spec(stages=2)
    bad["steps"] = 0
    e = expect_error(trainyard.InvalidArgument, client.submit, bad)
    assert "steps" in e.message, e.message
    e = expect_error(trainyard.InvalidArgument, client.submit, {"name": "x", "stepz": 3})
    assert "stepz" in e.message, e.message
    e = expect_error(trainyard.InvalidArgument, client.submit, os.path.join(work, "none.json"))
    assert "none.json" in e.message, e.message
    # Nothing listens: submit gives up after its retries, saying how to retry.
    with socket.create_server(("127.0.0.1", 0)) as s:
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    start = time.time()
    e = expect_error(trainyard.Unavailable, trainyard.Client(closed, tls=False).submit,
                     small_spec(stages=2))
    assert time.time() - start < 15, time.time() - start
    assert e.request_id and e.request_id.startswith("req-"), e.request_id
    assert closed in e.message, e.message


# ---- Against an in-process JobService: what the client sends, and TLS.

DENIED = "job j-1 belongs to user alice; ask an admin (role admin) to act on it"
NO_TOKEN = "no bearer token: set $TRAINYARD_TOKEN or $TRAINYARD_TOKEN_FILE"


class EchoJobs(pb_grpc.JobServiceServicer):
    """GetJob answers with the authorization metadata it got as the job's
    reason; job "deny" is PERMISSION_DENIED, "needs-token" without a token
    UNAUTHENTICATED."""

    def GetJob(self, request, context):
        auth = dict(context.invocation_metadata()).get("authorization", "<none>")
        if request.job_id == "deny":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, DENIED)
        if request.job_id == "needs-token" and auth == "<none>":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, NO_TOKEN)
        return pb.Job(job_id=request.job_id, reason=auth)


def make_certs(folder):
    """A CA and a server certificate for the name controller.test only."""
    os.makedirs(folder)

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True,
                       timeout=30)

    def read(name):
        with open(os.path.join(folder, name), "rb") as f:
            return f.read()

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=trainyard test CA")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=controller.test")
    write(os.path.join(folder, "ext.cnf"), "subjectAltName=DNS:controller.test\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return os.path.join(folder, "ca.pem"), read("server.key"), read("server.pem")


echo_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
pb_grpc.add_JobServiceServicer_to_server(EchoJobs(), echo_server)
ECHO_PLAIN = f"127.0.0.1:{echo_server.add_insecure_port('127.0.0.1:0')}"
CA, server_key, server_cert = make_certs(os.path.join(TMP, "certs"))
ECHO_TLS = "127.0.0.1:%d" % echo_server.add_secure_port(
    "127.0.0.1:0", grpc.ssl_server_credentials([(server_key, server_cert)]))
echo_server.start()


def sent_authorization(**client_args):
    return trainyard.Client(client_args.pop("address", ECHO_PLAIN), **client_args,
                            timeout=10).get("who").reason


def sent_over_tls(**client_args):
    """The authorization a TLS client (the test CA) sent."""
    return sent_authorization(address=ECHO_TLS, tls=CA, server_name="controller.test",
                              **client_args)


@case
def token_is_sent_as_bearer_metadata():
    token_file = write(os.path.join(work, "token"), "file-token\n")
    with environment(**NO_AUTH_ENV):
        assert sent_over_tls() == "<none>"
        assert sent_over_tls(token="t-1") == "Bearer t-1"
        with environment(TRAINYARD_TOKEN_FILE=token_file):
            assert sent_over_tls() == "Bearer file-token"
            with environment(TRAINYARD_TOKEN="env-token"):
                assert sent_over_tls() == "Bearer env-token"
                assert sent_over_tls(token="t-2") == "Bearer t-2"
                assert sent_over_tls(token="") == "<none>"
                # Never over plaintext: whoever answers would get it.
                assert sent_authorization(tls=False) == "<none>"
                assert sent_authorization(tls=False, token="t-3") == "<none>"
        with environment(TRAINYARD_TOKEN_FILE=os.path.join(work, "no-token-file")):
            e = expect_error(trainyard.InvalidArgument, trainyard.Client, ECHO_TLS, tls=CA,
                             server_name="controller.test")
            assert "no-token-file" in e.message, e.message


@case
def tls_verifies_the_controller_with_the_given_ca():
    with environment(**NO_AUTH_ENV):
        assert sent_authorization(address=ECHO_TLS, tls=CA, server_name="controller.test",
                                  token="t-3") == "Bearer t-3"
        with environment(TRAINYARD_CA=CA):  # tls=None: $TRAINYARD_CA
            assert sent_authorization(address=ECHO_TLS, server_name="controller.test") == \
                "<none>"
        # The certificate names controller.test, not 127.0.0.1.
        expect_error(trainyard.Unavailable, sent_authorization, address=ECHO_TLS, tls=CA)
        # tls=None without $TRAINYARD_CA: the system's roots do not know our CA.
        expect_error(trainyard.Unavailable, sent_authorization, address=ECHO_TLS,
                     server_name="controller.test")
        expect_error(trainyard.Unavailable, sent_authorization, address=ECHO_TLS, tls=False)
        e = expect_error(trainyard.InvalidArgument, trainyard.Client, ECHO_TLS,
                         tls=os.path.join(work, "no-ca.pem"))
        assert "no-ca.pem" in e.message, e.message
        expect_error(trainyard.InvalidArgument, trainyard.Client, ECHO_PLAIN, tls=False,
                     server_name="controller.test")


@case
def auth_errors_surface_the_controllers_message_unchanged():
    with environment(**NO_AUTH_ENV):
        c = trainyard.Client(ECHO_TLS, tls=CA, server_name="controller.test", token="bob")
        e = expect_error(trainyard.PermissionDenied, c.get, "deny")
        assert e.message == DENIED, e.message
        e = expect_error(trainyard.Unauthenticated, trainyard.Client(ECHO_PLAIN, tls=False).get,
                         "needs-token")
        assert e.message == NO_TOKEN, e.message


# ---- Against a real secure cluster (TLS, tokens): tests/cluster.py's
# Cluster(secure=True), ca_path, admin_token, add_user(name, role) -> token.

SECURE = {}


def secure_cluster():
    """The secure cluster and what its cases share, started on first use."""
    if not SECURE:
        cluster.stop()  # two workers at a time on 2 cores
        SECURE["cluster"] = Cluster(workers=2, secure=True)
        SECURE["alice"] = SECURE["cluster"].add_user("alice")
        SECURE["bob"] = SECURE["cluster"].add_user("bob")
    return SECURE["cluster"]


@case
def secure_user_submits_watches_and_waits_to_succeeded():
    secure = secure_cluster()
    with environment(**NO_AUTH_ENV):
        alice = trainyard.Client(secure.address, token=SECURE["alice"], tls=secure.ca_path)
        job = alice.submit(small_spec(stages=2, steps=6, name="secure"))
        steps = [e.step for e in alice.watch(job.job_id, timeout=60)
                 if isinstance(e, trainyard.StepEvent)]
        assert steps == list(range(1, 7)), steps
        assert alice.wait(job.job_id, timeout=60).state == trainyard.JobState.SUCCEEDED
        assert job.job_id in [j.job_id for j in alice.list()]
        SECURE["job_id"] = job.job_id
        # Token and CA from the environment, as the defaults say.
        token_file = write(os.path.join(work, "alice.token"), SECURE["alice"] + "\n")
        with environment(TRAINYARD_TOKEN_FILE=token_file, TRAINYARD_CA=secure.ca_path):
            assert trainyard.Client(secure.address).get(job.job_id).job_id == job.job_id


@case
def secure_example_script_takes_token_and_ca():
    secure = secure_cluster()
    spec_path = write(os.path.join(work, "secure-example", "job.json"),
                      json.dumps(small_spec(stages=2, steps=3, name="secure-example")))
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples/python_client/submit_and_watch.py"),
         "--controller", secure.address, "--tls_ca", secure.ca_path,
         "--token", SECURE["alice"], "--spec", spec_path],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k not in NO_AUTH_ENV})
    assert out.returncode == 0, (out.returncode, out.stdout[-1000:], out.stderr[-1000:])
    assert out.stdout.splitlines()[-1].startswith("state SUCCEEDED"), out.stdout[-500:]


@case
def secure_another_users_job_is_permission_denied():
    secure = secure_cluster()
    with environment(**NO_AUTH_ENV):
        bob = trainyard.Client(secure.address, token=SECURE["bob"], tls=secure.ca_path)
        expect_error(trainyard.PermissionDenied, bob.get, SECURE["job_id"])
        expect_error(trainyard.PermissionDenied, bob.cancel, SECURE["job_id"])


@case
def secure_no_token_is_unauthenticated():
    secure = secure_cluster()
    with environment(**NO_AUTH_ENV):
        nobody = trainyard.Client(secure.address, token="", tls=secure.ca_path)
        expect_error(trainyard.Unauthenticated, nobody.get, SECURE["job_id"])
        expect_error(trainyard.Unauthenticated, nobody.list)
        # Plaintext to a TLS controller: refused at once, not a hang.
        plain = trainyard.Client(secure.address, token=SECURE["alice"], tls=False)
        expect_error(trainyard.Unavailable, plain.get, SECURE["job_id"])


passed, failed = 0, []
start = time.time()
for fn in CASES:
    t = time.time()
    try:
        fn()
    except Exception:  # report every case, then fail
        traceback.print_exc()
        failed.append(fn.__name__)
        print(f"FAIL {fn.__name__} ({time.time() - t:.1f} s)", flush=True)
        continue
    passed += 1
    print(f"PASS {fn.__name__} ({time.time() - t:.1f} s)", flush=True)
echo_server.stop(0)
cluster.stop()
if SECURE:
    SECURE["cluster"].stop()
if failed:
    print("failed:", ", ".join(failed))
    print("\n--- controller log ---\n" + cluster.log("controller"))
print(f"python_client_test: {passed} passed, {len(failed)} failed "
      f"({time.time() - start:.1f} s)")
sys.exit(1 if failed else 0)
