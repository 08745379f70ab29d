"""Job states and the typed events Client.watch() yields.

Each event is a frozen dataclass built from one trainyard.v1.JobEvent (its
`raw` field, left out of repr and ==, for what the dataclass does not copy,
e.g. a step's per-stage timings in raw.step.stages).
"""
import dataclasses
import enum
from typing import Dict, Optional, Tuple

from ._proto import trainyard_pb2

# trainyard.v1.JobState as a Python enum: members compare equal to the ints
# in a Job's `state` field (job.state == JobState.SUCCEEDED).
JobState = enum.IntEnum(
    "JobState", [(v.name, v.number) for v in trainyard_pb2.JobState.DESCRIPTOR.values],
    module=__name__)
JobState.__doc__ = "trainyard.v1.JobState (proto/trainyard.proto)."

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


def job_state(value):
    """A JobState from a JobState, an int or a name ("running", "RUNNING")."""
    if isinstance(value, str):
        try:
            return JobState[value.upper()]
        except KeyError:
            raise ValueError(f"unknown job state {value!r}: one of "
                             f"{', '.join(s.name for s in JobState if s)}") from None
    return JobState(value)


_RAW = dict(default=None, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """A completed training step (1-based) and its metrics."""
    step: int
    loss: float
    lr: float
    grad_norm: float
    samples_per_sec: float
    metrics: Dict[str, float]  # the task plugin's, e.g. {"accuracy": 0.93}
    raw: Optional[trainyard_pb2.JobEvent] = dataclasses.field(**_RAW)


@dataclasses.dataclass(frozen=True)
class EvalEvent:
    """An evaluation run after step `step`."""
    step: int
    loss: float
    samples: int
    metrics: Dict[str, float]
    raw: Optional[trainyard_pb2.JobEvent] = dataclasses.field(**_RAW)


@dataclasses.dataclass(frozen=True)
class StateEvent:
    """The job's state: the current one first, then every change."""
    state: JobState
    reason: str
    raw: Optional[trainyard_pb2.JobEvent] = dataclasses.field(**_RAW)

    @property
    def terminal(self):
        """SUCCEEDED, FAILED or CANCELLED: the last event of a watch."""
        return self.state in TERMINAL_STATES


@dataclasses.dataclass(frozen=True)
class NoteEvent:
    """Something the stages reported about how the job runs, e.g. its
    transport ("every stage is on cpu: using TCP")."""
    step: int  # steps completed when it was noted
    stage: int
    text: str
    raw: Optional[trainyard_pb2.JobEvent] = dataclasses.field(**_RAW)


@dataclasses.dataclass(frozen=True)
class RecoveryEvent:
    """An automatic restart: the job resumed after `resume_step` on a new
    gang of workers (steps after it are recomputed, not published again)."""
    attempt: int  # 1-based
    cause: str
    resume_step: int
    detected_step: int
    workers: Tuple[str, ...]
    from_snapshot: bool
    reschedule_s: float
    restore_s: float
    warmup_s: float
    step: int  # steps completed when recorded
    raw: Optional[trainyard_pb2.JobEvent] = dataclasses.field(**_RAW)


@dataclasses.dataclass(frozen=True)
class ProgressEvent:
    """An inference job wrote an output shard: its rows written so far (over
    every replica), their rate in this run and the seconds left (-1 when
    unknown)."""
    rows_done: int
    rows_total: int
    shards_done: int
    shards_total: int
    rows_per_sec: float
    eta_seconds: float
    raw: Optional[trainyard_pb2.JobEvent] = dataclasses.field(**_RAW)


def from_proto(ev):
    """The typed event for a trainyard.v1.JobEvent; None for a kind this
    version does not know."""
    kind = ev.WhichOneof("event")
    if kind == "step":
        s = ev.step
        return StepEvent(s.step, s.loss, s.lr, s.grad_norm, s.samples_per_sec,
                         dict(s.metrics), raw=ev)
    if kind == "eval":
        e = ev.eval
        return EvalEvent(e.step, e.loss, e.samples, dict(e.metrics), raw=ev)
    if kind == "state":
        try:
            state = JobState(ev.state.state)
        except ValueError:  # a state newer than this client
            state = ev.state.state
        return StateEvent(state, ev.state.reason, raw=ev)
    if kind == "note":
        n = ev.note
        return NoteEvent(n.step, n.stage, n.text, raw=ev)
    if kind == "recovery":
        r = ev.recovery
        return RecoveryEvent(r.attempt, r.cause, r.resume_step, r.detected_step,
                             tuple(r.workers), r.from_snapshot, r.reschedule_s,
                             r.restore_s, r.warmup_s, r.step, raw=ev)
    if kind == "progress":
        p = ev.progress
        return ProgressEvent(p.rows_done, p.rows_total, p.shards_done, p.shards_total,
                             p.rows_per_sec, p.eta_seconds, raw=ev)
    return None
