"""A job's status: a value, and the only table that says which moves are legal.

Logic reads the status, never a message. Every change goes through
`transition(old, new)`, which refuses a move the table does not list.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    queued = "queued"
    starting = "starting"
    loading_model = "loading_model"
    loading_dataset = "loading_dataset"
    training = "training"
    saving = "saving"
    completed = "completed"
    stopping = "stopping"
    stopped = "stopped"
    cancelling = "cancelling"
    cancelled = "cancelled"
    failed = "failed"
    interrupted = "interrupted"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_live(self) -> bool:
        return self not in TERMINAL


class IllegalTransition(ValueError):
    def __init__(self, old: JobStatus, new: JobStatus) -> None:
        super().__init__(f"a job cannot go from {old.value} to {new.value}")
        self.old, self.new = old, new


S = JobStatus
TERMINAL = frozenset({S.completed, S.stopped, S.cancelled, S.failed, S.interrupted})
# The worker's phases, in the order a job passes through them.
RUNNING = (S.starting, S.loading_model, S.loading_dataset, S.training, S.saving)
# A job that is still alive can always be stopped, cancelled, fail, or be cut off by a restart.
_ESCAPES = {S.stopping, S.cancelling, S.failed, S.interrupted}


def _later(status: JobStatus) -> set[JobStatus]:
    """The running phases after this one: a worker moves forward and may skip a phase."""
    return set(RUNNING[RUNNING.index(status) + 1 :])


TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.queued: frozenset({S.starting, S.cancelled, S.failed, S.interrupted}),
    S.starting: frozenset({*_later(S.starting), *_ESCAPES}),
    S.loading_model: frozenset({*_later(S.loading_model), *_ESCAPES}),
    S.loading_dataset: frozenset({*_later(S.loading_dataset), *_ESCAPES}),
    S.training: frozenset({*_later(S.training), S.completed, *_ESCAPES}),
    S.saving: frozenset({S.completed, *_ESCAPES}),
    # A stop can race the natural end of training: the job may still complete.
    S.stopping: frozenset({S.stopped, S.cancelled, S.completed, S.cancelling, S.failed, S.interrupted}),
    # ... and so can a cancel: a job that finished or saved before the command arrived keeps that end.
    S.cancelling: frozenset({S.cancelled, S.completed, S.stopped, S.failed, S.interrupted}),
    **{status: frozenset() for status in TERMINAL},
}

RESUMABLE = frozenset({S.stopped, S.interrupted, S.failed})
# What a caller may ask of a job in each status, derived from the table so the two cannot drift apart
# (the API hands these to the page as booleans). A queued job is taken off the queue by a stop or a cancel.
STOPPABLE = frozenset({S.queued} | {s for s, nexts in TRANSITIONS.items() if S.stopping in nexts})
CANCELLABLE = frozenset({S.queued} | {s for s, nexts in TRANSITIONS.items() if S.cancelling in nexts})


def can_transition(old: JobStatus, new: JobStatus) -> bool:
    return new in TRANSITIONS[old]


def transition(old: JobStatus, new: JobStatus) -> JobStatus:
    """Return `new` if the table allows old → new; raise IllegalTransition otherwise."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(old, new)
    return new
