"""The errors the client raises: every one is a trainyard.Error.

Expected failures (a bad spec, a job that does not exist, a missing or
unknown token, another user's job, an unreachable controller) raise the
subclass for their gRPC status code, carrying the code and the server's
message unchanged; the grpc exception is not chained onto them.
"""
import grpc


class Error(Exception):
    """A Trainyard call failed.

    code: the grpc.StatusCode; for a check the client makes itself (a spec
      file that does not parse, a CA file that cannot be read) the code the
      controller would have answered; None for JobFailed.
    message: what went wrong, as the controller said it (str(error) is it).
    request_id: set on an error from submit() whose outcome is unknown
      (UNAVAILABLE, DEADLINE_EXCEEDED): submit again with this request_id to
      get the job the controller may have stored, never a second one.
    """

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.request_id = None

    def __str__(self):
        return self.message


class InvalidArgument(Error):
    """A bad spec (every problem with its field path), request or setting."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(Error):
    """No such job."""
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(Error):
    """E.g. cancelling a job that has already ended."""
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(Error):
    """No token, or one the controller does not know."""
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(Error):
    """The token's user may not do this (e.g. another user's job)."""
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(Error):
    """The controller could not be reached (or is shutting down)."""
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(Error):
    """A call, or a wait() or watch() with a timeout, ran out of time."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class JobFailed(Error):
    """wait(): the job ended FAILED or CANCELLED.

    job: the final trainyard.Job; state: its JobState; reason: why, as the
    controller recorded it (e.g. "cancelled by request: ...").
    """

    def __init__(self, job):
        from .events import JobState
        self.job = job
        self.state = JobState(job.state)
        self.reason = job.reason
        message = f"job {job.job_id} {self.state.name}"
        super().__init__(f"{message}: {job.reason}" if job.reason else message)


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, FailedPrecondition,
                                      Unauthenticated, PermissionDenied, Unavailable,
                                      DeadlineExceeded)}


def from_rpc_error(err, address):
    """The trainyard.Error for a grpc.RpcError from a call to `address`."""
    code = err.code()
    message = err.details() or code.name
    if code == grpc.StatusCode.UNAVAILABLE:
        message = f"cannot reach the controller at {address}: {message}"
    cls = _BY_CODE.get(code)
    return cls(message) if cls is not None else Error(message, code)
