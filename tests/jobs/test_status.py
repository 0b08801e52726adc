from __future__ import annotations

from itertools import pairwise

import pytest

from tunestudio.jobs.status import TERMINAL, TRANSITIONS, IllegalTransition, JobStatus, transition

S = JobStatus


def test_the_happy_path_is_legal() -> None:
    path = [S.queued, S.starting, S.loading_model, S.loading_dataset, S.training, S.saving, S.completed]
    for old, new in pairwise(path):
        assert transition(old, new) is new


@pytest.mark.parametrize(
    ("old", "new"),
    [(S.completed, S.training), (S.failed, S.queued), (S.queued, S.training), (S.training, S.loading_model),
     (S.stopped, S.stopping), (S.cancelled, S.completed), (S.queued, S.completed), (S.saving, S.queued),
     (S.interrupted, S.training), (S.cancelling, S.stopping)],
)
def test_illegal_transitions_are_refused(old: JobStatus, new: JobStatus) -> None:
    with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
        transition(old, new)


def test_terminal_statuses_lead_nowhere_and_live_ones_can_always_end() -> None:
    for status in JobStatus:
        if status in TERMINAL:
            assert TRANSITIONS[status] == frozenset()
        else:
            assert {S.failed, S.interrupted} <= TRANSITIONS[status], status
