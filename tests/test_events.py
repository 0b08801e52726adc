from __future__ import annotations

import pytest
from pydantic import ValidationError

from tunestudio.events import Completed, Progress, Stop, parse_command, parse_event


def test_events_round_trip_through_json() -> None:
    event = Progress(seq=3, step=5, total_steps=10, loss=1.5, learning_rate=1e-3)
    again = parse_event(event.model_dump_json())
    assert again == event and isinstance(again, Progress)
    done = parse_event(Completed(seq=4, output_dir="/x", stopped=True).model_dump_json())
    assert isinstance(done, Completed) and done.stopped and done.saved


@pytest.mark.parametrize(
    "raw",
    ['{"kind": "progress"}', '{"kind": "nope", "seq": 1}', "not json", '{"kind": "phase", "seq": 1, "phase": "x"}',
     '{"kind": "log", "seq": -1, "message": "m"}', '{"kind": "log", "seq": 1, "message": "m", "extra": 1}'],
)
def test_malformed_events_raise_validation_errors(raw: str) -> None:
    with pytest.raises(ValidationError):
        parse_event(raw)


def test_stop_command() -> None:
    assert parse_command('{"kind": "stop", "save": false}') == Stop(save=False)
    assert parse_command('{"kind": "stop"}').save is True
