"""A dataset's rows as the readers give them (`sources`, `parquet`, `hub_rows`): one `Row` at a time, in
`Stream`s read as they are asked for and as often as they are iterated, or in lists (`Rows`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any


@dataclass
class Row:
    source: str
    number: int  # 1-based: the line (JSONL, CSV) or the position (JSON list, Parquet, hub)
    data: dict[str, Any] | None
    problem: str | None = None  # set when the row could not be read

    def where(self) -> str:
        return f"dataset {self.source} row {self.number}"


@dataclass
class Rows:
    """The rows to train on, and the explicit eval rows if an eval split was named."""

    train: list[Row]
    eval: list[Row] | None
    description: str  # what was read, for the user


@dataclass(frozen=True)
class Stream:
    """Rows read as they are asked for, from parts (files, or a `datasets` split) in order, as often as it is
    iterated. `start`..`end` (both inclusive, row numbers from 0) is the window it yields, as `slice_rows` cuts
    a list."""

    parts: tuple[Callable[[], Iterator[Row]], ...]
    start: int = 0
    end: int | None = None

    def __iter__(self) -> Iterator[Row]:
        n = 0
        for part in self.parts:
            for row in part():
                if self.end is not None and n > self.end:
                    return
                if n >= self.start:
                    yield row
                n += 1

    def window(self, start: int | None, end: int | None) -> Stream:
        """The rows start..end of this (unwindowed) stream; the end clamps to the last row, as `slice_rows`."""
        first = max(start or 0, 0)
        return replace(self, start=first, end=None if end is None else max(end, first))

    def firsts(self) -> list[Row]:
        """Of each part, its first row and its first readable row inside the window: what tells the format."""
        out: list[Row] = []
        n = 0
        whole = self.start == 0 and self.end is None  # else later parts' places need every row counted
        for part in self.parts:
            head = readable = None
            for row in part():
                if self.end is not None and n > self.end:
                    return out
                if n >= self.start:
                    if head is None:
                        head = row
                        out.append(row)
                    if readable is None and row.data is not None:
                        readable = row
                        if row is not head:
                            out.append(row)
                n += 1
                if whole and readable is not None:
                    break
        return out


def firsts(rows: Iterable[Row]) -> list[Row]:
    """The rows that tell a format (of each source, its first and first readable rows): all of a list's rows."""
    return rows.firsts() if isinstance(rows, Stream) else list(rows)


@dataclass(frozen=True)
class Opened:
    """A dataset's splits as streams (nothing read yet but what tells a hub dataset's splits apart)."""

    train: Stream
    eval: Stream | None
    description: str  # what is read, for the user
    empty: str  # the error when the training rows turn out to be none
