"""The dataset report's pass over a split's rows: each row read from the stream, converted and measured as
training would, a chunk of CHUNK rows at a time, and only what the report needs of it kept (`Tally`): counts,
the first refused rows, and per usable row, in arrays, its place, content hash, MinHash signature, token
length and whether it was cut. A row's text is not kept: the few the report quotes are read again
(`Reader.texts`). So a million short rows take a few hundred megabytes, not a Python object each.

Token lengths are what the trainer tokenises: a conversation through the chat template (as TRL's
`apply_chat_template`), plain text with the tokenizer's special tokens and EOS appended (as TRL's SFT does);
for the preference, unpaired and prompt-only formats, the longest sequence a row makes (prompt with chosen or
rejected; prompt with completion; the prompt alone). A fast tokenizer counts a batch without offsets
(`encode_batch_fast`), the ids being the same.
"""

from __future__ import annotations

import itertools
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunestudio.worker.data import dedupe, minhash
from tunestudio.worker.data.chat_mask import template_form
from tunestudio.worker.data.formats import Converter, RowProblem
from tunestudio.worker.data.held_out import row_key
from tunestudio.worker.data.rows import Row
from tunestudio.worker.data.templates import clip_example

CHUNK = 512  # rows converted and tokenised at once
LISTED_REFUSED = 100  # refused rows listed (all are counted)


@dataclass
class Seen:
    """One row of the chunk in hand, as training would see it: its converted example, or why it is refused."""

    row: Row
    example: dict[str, Any] | None = None
    reason: str | None = None
    clipped: bool = False
    tokens: int | None = None  # the longest sequence it makes
    prompt: int | None = None  # tokens before its first trained token, when the row reaches max_seq_length
    kind: str | None = None  # what is wrong with a refused row's tool calls, when that is it (RowProblem.kind)
    reasoning: int = 0  # tokens of its assistant turns' reasoning (with a tokenizer)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, (list, dict)) and not value)


class Tally:
    """What the report keeps of one split's rows. `keys`: also each usable row's `row_key` (to hold out the rows
    an earlier job's record names)."""

    def __init__(self, keys: bool = False) -> None:
        self.rows = 0
        self.refused_count = 0
        self.refused: list[dict[str, Any]] = []  # the first LISTED_REFUSED, in order
        self.files: list[str] = []
        self._file_ids: dict[str, int] = {}
        self.file, self.line = array("q"), array("q")  # each usable row's place
        self.hashes, self.tokens, self.clipped = array("Q"), array("q"), array("b")
        self.signed = minhash.Signed()
        self.keys: list[str] | None = [] if keys else None
        self.present: Counter[str] = Counter()  # columns: rows holding it, and rows where it is empty
        self.blank: Counter[str] = Counter()
        self.turns: Counter[str] = Counter()  # roles of the usable rows' conversations: turns, and empty ones
        self.empty_turns: Counter[str] = Counter()
        self.tool = ToolTally()

    @property
    def usable(self) -> int:
        return len(self.hashes)

    def where(self, i: int) -> dict[str, Any]:
        return {"file": self.files[self.file[i]], "line": self.line[i]}

    def count_columns(self, rows: list[Row]) -> None:
        for row in rows:
            for name, value in (row.data or {}).items():
                self.present[name] += 1
                self.blank[name] += _empty(value)

    def add(self, chunk: list[Seen]) -> None:
        texts = []
        for seen in chunk:
            if seen.reason is not None:
                self.tool.bad[seen.kind] += seen.kind is not None
                self.refused_count += 1
                if len(self.refused) < LISTED_REFUSED:
                    self.refused.append({"file": seen.row.source, "line": seen.row.number, "reason": seen.reason})
                continue
            example = seen.example or {}
            file = self._file_ids.get(seen.row.source)
            if file is None:
                file = self._file_ids[seen.row.source] = len(self.files)
                self.files.append(seen.row.source)
            self.file.append(file)
            self.line.append(seen.row.number)
            self.hashes.append(dedupe.content_hash(example))
            self.tokens.append(seen.tokens or 0)
            self.clipped.append(seen.clipped)
            if self.keys is not None:
                self.keys.append(row_key(seen.row.data))
            texts.append(dedupe.text_of(example))
            self._count_turns(example)
            self.tool.add(example, seen.reasoning)
        self.signed.append(*minhash.signatures(texts))

    def _count_turns(self, example: dict[str, Any]) -> None:
        for value in example.values():
            if isinstance(value, list):
                for turn in value:
                    if isinstance(turn, dict) and "role" in turn:
                        self.turns[turn["role"]] += 1
                        self.empty_turns[turn["role"]] += _empty(turn.get("content"))

    def array(self, name: str) -> np.ndarray:
        """One of the per-row arrays (file, line, hashes, tokens, clipped) as numpy, without a copy."""
        kept = getattr(self, name)
        dtype = {"Q": np.uint64, "q": np.int64, "b": np.int8}[kept.typecode]
        return np.frombuffer(kept, dtype) if len(kept) else np.zeros(0, dtype)


class ToolTally:
    """The usable rows' tools, calls and reasoning, and the refused rows by what was wrong with their calls."""

    def __init__(self) -> None:
        self.tools = array("q")  # per row with tools: how many
        self.calls = array("q")  # per conversation with calls: how many
        self.reasoning_turns = 0
        self.reasoning_tokens = 0
        self.bad: Counter[str] = Counter()  # refused rows by RowProblem.kind

    def add(self, example: dict[str, Any], reasoning_tokens: int) -> None:
        if example.get("tools"):
            self.tools.append(len(example["tools"]))
        turns = [m for v in example.values() if isinstance(v, list) for m in v if isinstance(m, dict)]
        calls = sum(len(m.get("tool_calls", ())) for m in turns)
        if calls:
            self.calls.append(calls)
        self.reasoning_turns += sum(1 for m in turns if m.get("reasoning_content"))
        self.reasoning_tokens += reasoning_tokens

    def report(self, tokens: int | None) -> dict[str, Any]:
        """What the dataset report says of them; `tokens`: all the usable rows' tokens (None: no tokenizer)."""
        def spread(counts: array) -> dict[str, Any]:
            return {"rows": len(counts), "mean": round(sum(counts) / len(counts), 2) if counts else 0,
                    "max": max(counts, default=0)}

        return {"tools_per_row": spread(self.tools), "calls_per_conversation": spread(self.calls),
                "undeclared_call_rows": self.bad["undeclared"], "arguments_not_json_rows": self.bad["arguments"],
                "unanswered_tool_result_rows": self.bad["call_id"], "bad_tool_schema_rows": self.bad["schema"],
                "reasoning_turns": self.reasoning_turns,
                "reasoning_tokens": self.reasoning_tokens if tokens is not None else None,
                "reasoning_share": round(self.reasoning_tokens / tokens, 4) if tokens else None}


def _batched(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    it = iter(rows)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


@dataclass
class Reader:
    """How the report sees a row: the format's converter, the job's fix of conversations, the text budget, and
    the tokenizer that measures it (None: no lengths)."""

    convert: Converter
    fix: Any
    budget: int
    tokenizer: Any
    max_seq_length: int

    def read(self, rows: Iterable[Row], tally: Tally, columns: bool = False) -> Tally:
        for chunk in _batched(rows, CHUNK):
            tally.rows += len(chunk)
            if columns:
                tally.count_columns(chunk)
            seen = [self.see(row) for row in chunk]
            if self.tokenizer is not None:
                measured = [s for s in seen if s.example is not None]
                _measure(measured, self.tokenizer, self.max_seq_length)
                _measure_reasoning(measured, self.tokenizer)
                for s in measured:
                    if s.prompt is not None and s.prompt >= self.max_seq_length:
                        s.reason = (f"has a prompt of {s.prompt} tokens, which fills max_seq_length "
                                    f"{self.max_seq_length} and leaves no completion token to train on")
            tally.add(seen)
        return tally

    def see(self, row: Row) -> Seen:
        if row.data is None:
            return Seen(row, reason=row.problem)
        try:
            example = self.convert(row.data)
            if self.fix is not None:
                example = self.fix(example)
        except RowProblem as exc:
            return Seen(row, reason=str(exc), kind=exc.kind)
        example, clipped = clip_example(example, self.budget)
        return Seen(row, example, clipped=clipped)

    def texts(self, rows: Iterable[Row], wanted: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The text (`dedupe.text_of`) of the rows at the places wanted, read again; reading stops at the last."""
        found: dict[tuple[str, int], str] = {}
        for row in rows:
            if len(found) == len(wanted):
                break
            if (place := (row.source, row.number)) in wanted:
                found[place] = dedupe.text_of(self.see(row).example or {})
        return found


# --- token lengths ---------------------------------------------------------------------
def _pieces(example: dict[str, Any], eos: str) -> tuple[list[tuple[str, Any]], tuple[str, Any] | None]:
    """(the sequences the row makes, of which the longest counts; its prompt), each as (how, what):
    "text" is tokenised as a string, "chat" and "ask" through the chat template (ask: with the generation
    prompt)."""
    prompt = example.get("prompt")
    tools = example.get("tools")
    if "messages" in example:
        messages = example["messages"]
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), 0)
        return [("chat", (messages, tools))], (("ask", (messages[:first], tools)) if first else None)
    if isinstance(prompt, list):
        asks = [("chat", (prompt + example[k], tools)) for k in ("completion", "chosen", "rejected")
                if isinstance(example.get(k), list)]
        return asks or [("ask", (prompt, tools))], ("ask", (prompt, tools))
    if isinstance(prompt, str):
        tails = [example[k] for k in ("completion", "chosen", "rejected") if isinstance(example.get(k), str)]
        if "completion" in example and "label" not in example:  # SFT: TRL appends EOS to the completion
            tails = [t if t.endswith(eos) else t + eos for t in tails]
        return [("text", prompt + t) for t in tails] or [("text", prompt)], ("text", prompt)
    text = example.get("text", "")
    return [("text", text if text.endswith(eos) else text + eos)], None


def _measure(seen: list[Seen], tokenizer: Any, max_seq_length: int) -> None:
    """Each row's length, tokenised as one batch; and the prompt's length of each row that reaches
    max_seq_length (a shorter row's prompt cannot fill it)."""
    eos = tokenizer.eos_token or ""
    planned = [(s, *_pieces(s.example or {}, eos)) for s in seen]
    jobs: dict[str, list[Any]] = {"text": [], "chat": [], "ask": []}
    spots = [[(how, _put(jobs, how, what)) for how, what in full] for _, full, _ in planned]
    counted = {how: _count(tokenizer, how, items) for how, items in jobs.items()}
    for (s, _, _), places in zip(planned, spots, strict=True):
        s.tokens = max(counted[how][i] for how, i in places)
    long = [(s, prompt) for s, _, prompt in planned if prompt is not None and (s.tokens or 0) >= max_seq_length]
    jobs = {"text": [], "chat": [], "ask": []}
    places = [(prompt[0], _put(jobs, *prompt)) for _, prompt in long]
    counted = {how: _count(tokenizer, how, items) for how, items in jobs.items()}
    for (s, _), (how, i) in zip(long, places, strict=True):
        s.prompt = counted[how][i]


def _measure_reasoning(seen: list[Seen], tokenizer: Any) -> None:
    """Each row's reasoning tokens (its assistant turns' reasoning_content, tokenised as one batch)."""
    owners, texts = [], []
    for s in seen:
        for value in (s.example or {}).values():
            if isinstance(value, list):
                for m in value:
                    if isinstance(m, dict) and m.get("reasoning_content"):
                        owners.append(s)
                        texts.append(m["reasoning_content"])
    for s, n in zip(owners, _lengths(tokenizer, texts, special=False) if texts else [], strict=True):
        s.reasoning += n


def _put(jobs: dict[str, list[Any]], how: str, what: Any) -> int:
    jobs[how].append(what)
    return len(jobs[how]) - 1


def _count(tokenizer: Any, how: str, items: list[Any]) -> list[int]:
    if not items:
        return []
    if how == "text":
        return _lengths(tokenizer, items, special=True)
    plain = [messages for messages, tools in items if not tools and not _has_calls(messages)]
    if len(plain) == len(items):  # one call for the batch
        rendered = tokenizer.apply_chat_template(plain, add_generation_prompt=how == "ask", tokenize=False)
    else:  # tools differ row by row; calls as the template takes them (chat_mask.template_form)
        rendered = [tokenizer.apply_chat_template([template_form(m) for m in messages], tools=tools or None,
                                                  add_generation_prompt=how == "ask", tokenize=False)
                    for messages, tools in items]
    return _lengths(tokenizer, rendered, special=False)  # as apply_chat_template(tokenize=True) encodes it


def _has_calls(messages: list[dict[str, Any]]) -> bool:
    return any("tool_calls" in m or "weight" in m for m in messages)


def _lengths(tokenizer: Any, texts: list[str], special: bool) -> list[int]:
    """How many ids the tokenizer gives each text: a fast tokenizer's Rust backend, without offsets, when its
    state is the one the tokenizer's own call sets (no truncation or padding, special tokens as it splits them);
    else the tokenizer's call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is not None and hasattr(backend, "encode_batch_fast") and backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))):
        return [len(encoding) for encoding in backend.encode_batch_fast(texts, add_special_tokens=special)]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]
