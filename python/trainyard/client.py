"""Client: the controller's JobService (proto/trainyard.proto) from Python."""
import os
import time
import uuid

import grpc

from . import errors
from ._proto import trainyard_pb2 as pb
from ._proto import trainyard_pb2_grpc as pb_grpc
from .errors import DeadlineExceeded, InvalidArgument, JobFailed, Unavailable
from .events import TERMINAL_STATES, JobState, EvalEvent, NoteEvent, ProgressEvent, \
    RecoveryEvent, StateEvent, StepEvent, from_proto, job_state
from .spec import load_spec

DEFAULT_ADDRESS = "127.0.0.1:7070"

# Submit attempts on UNAVAILABLE (same request id) and the pauses between
# them: about 3 s in all, enough to ride out a controller restart, short
# enough that a controller that is not there is reported soon.
_SUBMIT_BACKOFF_S = (0.2, 0.4, 0.8, 1.6)
# Stream errors after which watch() reconnects (as the CLI does): the
# connection dropped, the controller restarted or cancelled the stream.
_RECONNECT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL})


class Client:
    """A connection to a Trainyard controller.

    One gRPC channel, opened lazily; thread-safe (several threads may call
    and watch at once); close() it, or use `with trainyard.Client(...) as c`.
    Every call sends `authorization: Bearer <token>` when there is a token.
    Failures raise trainyard.Error subclasses (trainyard/errors.py).
    """

    def __init__(self, address=None, *, token=None, tls=None, server_name=None,
                 timeout=30.0):
        """address: host:port; None = $TRAINYARD_CONTROLLER, else 127.0.0.1:7070.
        token: the bearer token. None = $TRAINYARD_TOKEN if set, else the
          contents (stripped) of the file named by $TRAINYARD_TOKEN_FILE if set,
          else none. "" = none, whatever the environment says. Never sent
          over plaintext (tls=False): a plaintext controller checks none.
        tls: None = TLS, verified with the CA PEM file named by $TRAINYARD_CA if
          set, else with the system's roots; True = TLS with the system's roots;
          a path = TLS verified with that CA PEM file; False = plaintext (only
          explicitly, like the CLI's --insecure).
        server_name: the name to verify the controller's certificate against,
          when it is not the host in `address` (grpc.ssl_target_name_override).
        timeout: seconds for each unary call (submit, get, list, cancel).
        Raises InvalidArgument for a token or CA file it cannot use.
        """
        self.address = address or os.environ.get("TRAINYARD_CONTROLLER") or DEFAULT_ADDRESS
        self._timeout = timeout
        # Never over plaintext: a plaintext controller checks no token, and a
        # token sent in the clear goes to whoever answers.
        token = _resolve_token(token) if tls is not False else ""
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        credentials = _channel_credentials(tls)
        options = [
            # Keepalive pings notice a controller that vanished without closing
            # the connection (a watch would otherwise wait forever); the
            # controller accepts them every 5 s or slower.
            ("grpc.keepalive_time_ms", 10000),
            ("grpc.keepalive_timeout_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Reconnect soon after a dropped connection (default: 1 s, up to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 5000),
            # A page of jobs carries their specs.
            ("grpc.max_receive_message_length", 64 << 20),
        ]
        if server_name:
            if credentials is None:
                raise InvalidArgument("server_name needs TLS, and tls=False was given")
            options.append(("grpc.ssl_target_name_override", server_name))
        if credentials is None:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        self._stub = pb_grpc.JobServiceStub(self._channel)

    def close(self):
        """Closes the channel; watches in progress end with an error."""
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- Calls.

    def submit(self, spec, *, priority=0, request_id=None, base_dir=None):
        """Submits a job and returns it (a trainyard.Job, QUEUED or RUNNING).

        spec: a path to a proto3 JSON spec file (relative paths in it resolve
          against its folder, as with `trainyard submit`), a dict in the same
          form, or a JobSpec. base_dir: resolve the spec's relative paths
          against this folder instead (dict and JobSpec: by default they are
          sent as given and the workers resolve them against their --data_dir).
        priority: higher runs first.
        request_id: the idempotency key; default a fresh one. UNAVAILABLE is
          retried (about 3 s) with the same id, so the controller stores the
          job once. When the outcome stays unknown (UNAVAILABLE or
          DEADLINE_EXCEEDED) the error's request_id says what to submit again
          with.
        Raises InvalidArgument for a spec that does not parse locally or that
        the controller refuses (its message lists every problem with its
        field path).
        """
        req = pb.SubmitJobRequest(request_id=request_id or _new_request_id(),
                                  spec=load_spec(spec, base_dir), priority=priority)
        for pause in _SUBMIT_BACKOFF_S + (None,):
            try:
                return self._stub.SubmitJob(req, timeout=self._timeout,
                                            metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and pause is not None:
                    time.sleep(pause)
                    continue
                err = self._error(e)
                if e.code() in (grpc.StatusCode.UNAVAILABLE,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
                    err.request_id = req.request_id
                raise err from None

    def get(self, job_id):
        """The job (a trainyard.Job: state, reason, spec, last metrics, ...).
        Raises NotFound for a job that does not exist."""
        return self._unary(self._stub.GetJob, pb.GetJobRequest(job_id=job_id))

    def list(self, states=None, *, page_size=100):
        """Every job, newest first, as a list of trainyard.Job, reading every
        page. states: only jobs in these states (JobState values, ints or
        names such as "RUNNING"); None or empty = all."""
        try:
            wanted = [job_state(s) for s in (states or ())]
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        jobs, token = [], ""
        while True:
            resp = self._unary(self._stub.ListJobs, pb.ListJobsRequest(
                states=wanted, page_size=page_size, page_token=token))
            jobs.extend(resp.jobs)
            token = resp.next_page_token
            if not token:
                return jobs

    def cancel(self, job_id, reason=""):
        """Cancels a QUEUED, RUNNING or RECOVERING job and returns it
        (CANCELLED, reason "cancelled by request: <reason>"). Raises
        FailedPrecondition for a job that has already ended, NotFound."""
        return self._unary(self._stub.CancelJob,
                           pb.CancelJobRequest(job_id=job_id, reason=reason))

    def watch(self, job_id, *, from_step=0, timeout=None, reconnect_for=30.0):
        """Yields the job's events: the current StateEvent, every StepEvent
        and EvalEvent from step `from_step` on (replayed, then live), and
        NoteEvent, RecoveryEvent, ProgressEvent (an inference job's rows
        written, each count once) and StateEvent as they happen; the last
        one is the terminal StateEvent (SUCCEEDED, FAILED or CANCELLED).

        A dropped stream (lost connection, restarted controller) is resumed
        from the last step seen, so every step is yielded once, in order.
        Raises Unavailable after reconnect_for seconds without reaching the
        controller, DeadlineExceeded when the job has not ended within
        `timeout` seconds (None = no limit), NotFound, Unauthenticated,
        PermissionDenied. Stopping early (break) closes the stream.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_step = last_eval = from_step - 1
        last_recovery = 0
        last_rows = 0
        last_state = None
        notes_seen = set()
        give_up = time.monotonic() + reconnect_for
        last_error = "not connected"
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise DeadlineExceeded(
                    f"job {job_id} did not end within {timeout:g} s")
            if now >= give_up:
                raise Unavailable(
                    f"cannot reach the controller at {self.address} (tried for "
                    f"{reconnect_for:g} s): {last_error}")
            # Wait a little for a connection rather than failing at once; if
            # none comes, the call below fails and says why.
            ready = grpc.channel_ready_future(self._channel)
            try:
                ready.result(timeout=max(0.01, min(0.5, give_up - now)))
            except grpc.FutureTimeoutError:
                pass
            finally:
                ready.cancel()
            # Resume at the older of the two cursors (the eval after step N
            # carries step N); what was seen already is dropped below.
            req = pb.WatchJobRequest(job_id=job_id,
                                     from_step=max(0, min(last_step, last_eval) + 1))
            call = self._stub.WatchJob(
                req, metadata=self._metadata,
                timeout=None if deadline is None else max(0.01, deadline - now))
            try:
                for raw in call:
                    give_up = time.monotonic() + reconnect_for  # it is alive
                    event = from_proto(raw)
                    if isinstance(event, StepEvent):
                        if event.step <= last_step:
                            continue
                        last_step = event.step
                    elif isinstance(event, EvalEvent):
                        if event.step <= last_eval:
                            continue
                        last_eval = event.step
                    elif isinstance(event, NoteEvent):
                        key = (event.step, event.stage, event.text)
                        if key in notes_seen:
                            continue
                        notes_seen.add(key)
                    elif isinstance(event, RecoveryEvent):
                        if event.attempt <= last_recovery:
                            continue
                        last_recovery = event.attempt
                    elif isinstance(event, ProgressEvent):
                        if event.rows_done <= last_rows:
                            continue
                        last_rows = event.rows_done
                    elif isinstance(event, StateEvent):
                        if event.state == last_state:
                            continue
                        last_state = event.state
                    elif event is None:
                        continue
                    yield event
                    if isinstance(event, StateEvent) and event.terminal:
                        return
                last_error = "the stream ended before the job did"
            except grpc.RpcError as e:
                if (e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None
                        and time.monotonic() >= deadline):
                    raise DeadlineExceeded(
                        f"job {job_id} did not end within {timeout:g} s") from None
                if e.code() not in _RECONNECT_CODES:
                    raise self._error(e) from None
                last_error = e.details() or e.code().name
            finally:
                call.cancel()
            time.sleep(0.1)

    def wait(self, job_id, timeout=None):
        """Waits for the job to end and returns it (a trainyard.Job) when it
        SUCCEEDED. Raises JobFailed (with .state, .reason, .job) when it ended
        FAILED or CANCELLED, DeadlineExceeded after `timeout` seconds (None =
        no limit), and what watch() raises."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(job_id)
        while job.state not in TERMINAL_STATES:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"job {job_id} did not end within {timeout:g} s "
                                       f"(it is {JobState(job.state).name})")
            try:
                # From the next step on: only its state changes matter here.
                for event in self.watch(job_id, from_step=job.steps_completed + 1,
                                        timeout=remaining):
                    if isinstance(event, StateEvent) and event.terminal:
                        break
            except DeadlineExceeded:
                job = self.get(job_id)
                continue  # raises above unless it ended just now
            job = self.get(job_id)
        if job.state != JobState.SUCCEEDED:
            raise JobFailed(job)
        return job

    # ---- Helpers.

    def _unary(self, method, request):
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, rpc_error):
        return errors.from_rpc_error(rpc_error, self.address)


def _new_request_id():
    return "req-" + uuid.uuid4().hex


def _resolve_token(token):
    if token is None:
        token = os.environ.get("TRAINYARD_TOKEN", "").strip()
        path = os.environ.get("TRAINYARD_TOKEN_FILE", "")
        if not token and path:
            try:
                with open(path) as f:
                    token = f.read().strip()
            except OSError as e:
                raise InvalidArgument(
                    f"$TRAINYARD_TOKEN_FILE {path}: cannot read it: {e.strerror}") from None
            if not token:
                raise InvalidArgument(f"$TRAINYARD_TOKEN_FILE {path}: the file is empty")
    if token and not all(0x20 < ord(c) < 0x7f for c in token):
        raise InvalidArgument("token: must be printable ASCII without spaces")
    return token


def _channel_credentials(tls):
    """grpc.ChannelCredentials for `tls` (see Client), or None for plaintext."""
    if tls is False:
        return None
    if tls is None:
        tls = os.environ.get("TRAINYARD_CA") or True
    if tls is True:
        return grpc.ssl_channel_credentials()
    if not isinstance(tls, (str, os.PathLike)):
        raise TypeError(f"tls must be None, True, False or a CA file path, not {tls!r}")
    path = os.fspath(tls)
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:
        raise InvalidArgument(f"CA file {path}: cannot read it: {e.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise InvalidArgument(f"CA file {path}: no PEM certificate in it")
    return grpc.ssl_channel_credentials(root_certificates=pem)
