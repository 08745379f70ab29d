"""Test harness: a real controller and real worker processes on 127.0.0.1.

Used by the cross-process tests in this folder (run by Bazel with Debian's
/usr/bin/python3). Every wait is bounded; every process is killed at exit.
"""
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

RUNFILES = os.environ.get("TEST_SRCDIR", "")
WORKSPACE = os.environ.get("TEST_WORKSPACE", "trainyard")
ROOT = os.path.join(RUNFILES, WORKSPACE) if RUNFILES else os.getcwd()
sys.path.insert(0, ROOT)

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from proto import job_spec_pb2, trainyard_pb2 as pb, trainyard_pb2_grpc as pb_grpc  # noqa: E402

CONTROLLER_BIN = os.path.join(ROOT, "controller", "trainyard-controller")
WORKER_BIN = os.path.join(ROOT, "worker", "trainyard-worker")
CLI_BIN = os.path.join(ROOT, "cli", "trainyard")
PLUGIN_DIR = os.path.join(ROOT, "task_plugins")
TERMINAL = (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED)


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """A controller and workers. Plaintext (--insecure) by default; with
    secure=True the daemons run as `trainyard up` runs them: TLS on the
    controller, worker certificates (mTLS) and a tokens file, made by
    `trainyard certs`. Then `ca_path`, `admin_token` and `add_user` are
    there, and `jobs` calls as the admin."""

    def __init__(self, workers=0, heartbeat_timeout_ms=2000, metrics=False,
                 secure=False, controller_args=(), device="cpu"):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.metrics = metrics  # every daemon serves /metrics
        self.secure = secure
        self.controller_args = list(controller_args)
        self.device = device  # every worker's --device
        self.controller = None
        self.address = None
        self.workers = {}
        self._logs = []
        atexit.register(self.stop)
        if secure:
            self.pki = os.path.join(self.dir, "pki")
            subprocess.run([CLI_BIN, "certs", "--out", self.pki], check=True,
                           capture_output=True, timeout=60)
            self.ca_path = os.path.join(self.pki, "ca.pem")
            self.tokens_path = os.path.join(self.pki, "tokens")
            self.admin_token_path = os.path.join(self.pki, "admin.token")
            self.admin_token = open(self.admin_token_path).read().strip()
        self.start_controller()
        for i in range(workers):
            self.start_worker(f"w{i}")

    def _spawn(self, name, argv):
        log = open(os.path.join(self.dir, f"{name}.log"), "ab")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def start_controller(self, port=0):
        port_file = os.path.join(self.dir, "controller.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        self.controller = self._spawn("controller", [
            CONTROLLER_BIN, f"--listen=127.0.0.1:{port}",
            f"--data_dir={self.dir}/controller", f"--port_file={port_file}",
            "--heartbeat_interval_ms=200",
            f"--heartbeat_timeout_ms={self.heartbeat_timeout_ms}"] +
            self.controller_security_args() + self.controller_args +
            self._metrics_args("controller"))

        def port():
            if self.controller.poll() is not None:
                raise AssertionError("controller exited: " + self.log("controller"))
            try:
                text = open(port_file).read().strip()
                return int(text) if text else None
            except (OSError, ValueError):
                return None
        self.address = f"127.0.0.1:{wait_for(port, 30, 'the controller port')}"
        self.channel = self.make_channel(
            self.admin_token if self.secure else None)
        self.jobs = pb_grpc.JobServiceStub(self.channel)

    def controller_security_args(self):
        if not self.secure:
            return ["--insecure"]
        return [f"--tls_cert={self.pki}/controller.pem",
                f"--tls_key={self.pki}/controller.key",
                f"--tls_ca={self.ca_path}", f"--tokens_file={self.tokens_path}"]

    def worker_security_args(self):
        if not self.secure:
            return ["--insecure"]
        return [f"--tls_cert={self.pki}/worker.pem",
                f"--tls_key={self.pki}/worker.key", f"--tls_ca={self.ca_path}"]

    def make_channel(self, token=None, tls=None):
        """A channel to the controller: TLS with the cluster CA when the
        cluster is secure (tls=False forces plaintext), sending `token` as a
        bearer token on every call when given (over TLS only)."""
        if tls is None:
            tls = self.secure
        if not tls:
            # gRPC sends call credentials only over TLS: `token` is not sent.
            return grpc.insecure_channel(self.address)
        creds = grpc.ssl_channel_credentials(
            root_certificates=open(self.ca_path, "rb").read())
        if token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(self.address, creds)

    def add_user(self, name, role="user"):
        """Adds a user to the tokens file with `trainyard token`; returns the
        token once the controller can know it (it re-reads the file at most
        once a second)."""
        out = subprocess.run([CLI_BIN, "token", f"--user={name}",
                              f"--role={role}",
                              f"--tokens_file={self.tokens_path}"],
                             check=True, capture_output=True, text=True,
                             timeout=30)
        time.sleep(1.2)
        return out.stdout.strip()

    def cli_flags(self, token_file=None):
        """Flags the `trainyard` CLI needs to reach this cluster (as the
        admin by default when secure)."""
        flags = [f"--controller={self.address}"]
        if not self.secure:
            return flags + ["--insecure"]
        return flags + [f"--tls_ca={self.ca_path}",
                        f"--token_file={token_file or self.admin_token_path}"]

    def start_worker(self, name):
        self.workers[name] = self._spawn(name, [
            WORKER_BIN, f"--controller={self.address}", "--listen=127.0.0.1:0",
            f"--name={name}", "--threads=1", f"--plugin_dir={PLUGIN_DIR}",
            f"--device={self.device}"] +
            self.worker_security_args() + self._metrics_args(name))
        return self.workers[name]

    def _metrics_args(self, name):
        if not self.metrics:
            return []
        path = os.path.join(self.dir, f"{name}.metrics_port")
        if os.path.exists(path):
            os.unlink(path)
        return ["--metrics_listen=127.0.0.1:0", f"--metrics_port_file={path}"]

    def metrics_url(self, name):
        """http://127.0.0.1:<port>/metrics of a daemon ("controller" or a
        worker's name), once its port file is written."""
        path = os.path.join(self.dir, f"{name}.metrics_port")

        def port():
            try:
                text = open(path).read().strip()
                return int(text) if text else None
            except (OSError, ValueError):
                return None
        return f"http://127.0.0.1:{wait_for(port, 30, name + ' metrics port')}/metrics"

    def kill_worker(self, name, sig=signal.SIGKILL):
        proc = self.workers.pop(name)
        proc.send_signal(sig)
        proc.wait(timeout=10)

    def kill_controller(self, sig=signal.SIGKILL):
        self.controller.send_signal(sig)
        self.controller.wait(timeout=10)

    def log(self, name):
        try:
            return open(os.path.join(self.dir, f"{name}.log")).read()[-4000:]
        except OSError:
            return ""

    def submit(self, spec, request_id=None, priority=0):
        return self.jobs.SubmitJob(pb.SubmitJobRequest(
            request_id=request_id or str(uuid.uuid4()), spec=spec,
            priority=priority), timeout=30, wait_for_ready=True)

    def get(self, job_id):
        return self.jobs.GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)

    def wait_state(self, job_id, states, timeout=120):
        return wait_for(lambda: (lambda j: j if j.state in states else None)(
            self.get(job_id)), timeout, f"job {job_id} to reach {states}")

    def watch(self, job_id, from_step=0, timeout=120):
        """All events of a job until its terminal state."""
        events = []
        for e in self.jobs.WatchJob(pb.WatchJobRequest(job_id=job_id,
                                                       from_step=from_step),
                                    timeout=timeout):
            events.append(e)
            if e.WhichOneof("event") == "state" and e.state.state in TERMINAL:
                break
        return events

    def stop(self):
        for proc in list(self.workers.values()) + [self.controller]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self.workers = {}


def spec_from_json(obj):
    spec = job_spec_pb2.JobSpec()
    json_format.ParseDict(obj, spec)
    return spec


def small_spec(stages=4, steps=12, plugin="cross_entropy", name="small",
               samples=512, features=16, batch=32, microbatches=4):
    """A quick classification job on synthetic blobs, one block per stage."""
    blocks = [{"outFeatures": 24, "ffnHiddenSize": 32, "norm": "layernorm"}
              for _ in range(stages - 1)]
    blocks.append({"outFeatures": 5, "ffnHiddenSize": 16})
    return {
        "name": name, "steps": steps, "seed": 11,
        "model": {"blocks": blocks},
        "parallelism": {"stages": stages, "microbatches": microbatches,
                        "schedule": "1f1b"},
        "optimizer": {"type": "adamw", "lr": 0.003, "clipGrad": 1.0},
        "task": {"plugin": plugin},
        "data": {"train": {"synthetic": {"kind": "gaussian_blobs",
                                         "numSamples": samples,
                                         "numFeatures": features,
                                         "numOutputs": 5, "noise": 1.0}},
                 "evalFraction": 0.125, "evalEvery": 4,
                 "batchSize": batch, "shuffle": True},
    }


def steps_of(events):
    return [e.step for e in events if e.WhichOneof("event") == "step"]


def wide_spec(name, steps, batch=128, recovery=None, checkpoint=None,
              eval_every=0):
    """The recovery tests' and benchmark's 4-stage job: three 256-768-256
    LayerNorm blocks and a small head (4.7 MB of state per wide stage), 1F1B
    with 4 microbatches, on 4096 synthetic gaussian blobs of 256 features."""
    wide = {"outFeatures": 256, "ffnHiddenSize": 768, "norm": "layernorm"}
    data = {"train": {"synthetic": {"kind": "gaussian_blobs",
                                    "numSamples": 4096, "numFeatures": 256,
                                    "numOutputs": 5, "noise": 1.0}},
            "batchSize": batch, "shuffle": True}
    if eval_every:
        data.update(evalFraction=0.125, evalEvery=eval_every)
    spec = {
        "name": name, "steps": steps, "seed": 7,
        "model": {"blocks": [wide, wide, wide,
                             {"outFeatures": 5, "ffnHiddenSize": 64}]},
        "parallelism": {"stages": 4, "microbatches": 4, "schedule": "1f1b"},
        "optimizer": {"type": "adamw", "lr": 0.002, "clipGrad": 1.0},
        "task": {"plugin": "cross_entropy"},
        "data": data,
    }
    if recovery is not None:
        spec["recovery"] = recovery
    if checkpoint is not None:
        spec["checkpoint"] = checkpoint
    return spec
