"""Trainyard's Python client: submit, inspect, cancel and watch training,
inference and evaluation jobs on a Trainyard controller (gRPC JobService,
proto/trainyard.proto), and read an inference job's outputs.

    import trainyard
    c = trainyard.Client("127.0.0.1:7070")  # TLS and token from the environment
    job = c.submit("examples/digits.json")
    for ev in c.watch(job.job_id):
        print(ev)
    final = c.wait(job.job_id)  # raises trainyard.JobFailed unless SUCCEEDED

See python/README.md.
"""
from ._proto.job_spec_pb2 import JobSpec
from ._proto.trainyard_pb2 import Job
from .client import DEFAULT_ADDRESS, Client
from .errors import (DeadlineExceeded, Error, FailedPrecondition, InvalidArgument, JobFailed,
                     NotFound, PermissionDenied, Unauthenticated, Unavailable)
from .events import (TERMINAL_STATES, EvalEvent, JobState, NoteEvent, ProgressEvent,
                     RecoveryEvent, StateEvent, StepEvent)
from .outputs import read_outputs
from .spec import load_spec

__version__ = "0.1.0"

__all__ = [
    "Client", "DEFAULT_ADDRESS", "Job", "JobSpec", "JobState", "TERMINAL_STATES", "load_spec",
    "StepEvent", "EvalEvent", "StateEvent", "NoteEvent", "RecoveryEvent", "ProgressEvent",
    "read_outputs",
    "Error", "InvalidArgument", "NotFound", "FailedPrecondition", "Unauthenticated",
    "PermissionDenied", "Unavailable", "DeadlineExceeded", "JobFailed",
]
