"""An in-memory worker channel, for calling worker functions in-process."""

from __future__ import annotations

from tunestudio.events import WarningEvent, parse_event
from tunestudio.worker.channel import Channel


class ListChannel(Channel):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def _send(self, line: str) -> None:
        self.lines.append(line)

    def close(self) -> None:
        pass

    def warnings(self) -> list[str]:
        return [e.message for e in map(parse_event, self.lines) if isinstance(e, WarningEvent)]
