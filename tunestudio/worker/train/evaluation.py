"""Judging a job on held-out rows: what the base model and the trained one answer, and how close each is.

Up to `eval_generate_rows` rows of the eval split are answered greedily before
training (the base model) and after it (the result). On the assistant replies:

- exact match: the answer equals the reference after whitespace and case
  normalisation (lower case, runs of whitespace as one space, ends stripped);
- token F1: the harmonic mean of precision and recall of the normalised
  answer's whitespace tokens against the reference's (counted as multisets);
- ROUGE-L: the F-measure of the longest common subsequence of tokens, as the
  `rouge-score` package computes it (its tokenizer: lower case, runs of
  [a-z0-9]);

each a mean over the rows, 0..1. The eval loss (and perplexity, its exp) over
the whole eval split come from the trainer's own evaluation.

Row by row (`row_losses`): the loss of each of the first max(SCORED_ROWS,
eval_generate_rows) held-out rows, before and after, is the mean cross-entropy
per token of its reference reply given its prompt (the whole text for a plain
text row), teacher-forced, with the model in eval mode, in left-padded batches; a row's answers and
metrics come with it where it was answered. They are written to the job's
EVAL_ROWS_FILE (`write_rows`), which GET /api/jobs/{id}/rows pages through,
worst first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tunestudio.events import BeforeAfter, EvalExample, Evaluation
from tunestudio.worker.train import tool_scores
from tunestudio.worker.train.text_scores import METRICS, score

SHOWN_EXAMPLES = 5  # rows the job's record keeps for people to read
MAX_NEW_TOKENS = 256  # the longest answer generated for one row
BATCH = 8
SCORED_ROWS = 256  # held-out rows whose loss is measured one by one (at least; all the answered rows too)
Progress = Callable[[int, int], None]  # (done, total), as worker/phases.py's Steps.counter takes it


# --- held-out rows ----------------------------------------------------------------------
@dataclass(frozen=True)
class EvalRow:
    prompt: Any  # a list of chat messages, plain prompt text, or None: a plain text row (its text is the reference)
    reference: str
    place: dict[str, Any] | None = None  # {file, line}: where the row is in the data
    tools: list[dict[str, Any]] | None = None  # the row's tools (OpenAI's form), rendered with its prompt
    reply: dict[str, Any] | None = None  # a tool row's reference turn (calls, or an answer): its calls are scored

    @property
    def calls(self) -> list[tool_scores.Call] | None:
        """The reference's calls ([] for an answer) of a tool row; None for another row."""
        return None if self.reply is None else tool_scores.calls_of(self.reply)

    @property
    def shown(self) -> str:
        """The prompt as a person reads it: the last user turn, or the plain text."""
        if self.prompt is None:
            return ""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m["content"] for m in self.prompt if m.get("role") == "user"]
        return users[-1] if users else str(self.prompt[-1].get("content", ""))


def _content(turns: Any) -> str | None:
    if isinstance(turns, str):
        return turns
    if isinstance(turns, list) and turns and isinstance(turns[-1], dict):
        return str(turns[-1].get("content", ""))
    return None


def eval_rows(examples: Iterable[dict[str, Any]], limit: int, places: Sequence[dict[str, Any]] | None = None,
              text: bool = False) -> list[EvalRow]:
    """The first `limit` examples that have a prompt and a reference reply (and, with `text`, plain text rows,
    whose text is their reference); places: each example's {file, line}, in the examples' order."""
    out: list[EvalRow] = []
    for i, example in enumerate(examples):
        if len(out) >= limit:
            break
        place = places[i] if places is not None and i < len(places) else None
        if "messages" in example:
            messages = example["messages"]
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
            if last:
                reply, tools = messages[last], example.get("tools") or None
                tool_row = bool(tools or reply.get("tool_calls"))
                out.append(EvalRow(messages[:last], str(reply.get("content") or ""), place, tools,
                                   reply if tool_row else None))
            continue
        reply = example.get("completion", example.get("chosen"))
        reference = _content(reply)
        if "prompt" in example and reference is not None:
            out.append(EvalRow(example["prompt"], reference, place))
        elif text and isinstance(example.get("text"), str) and "prompt" not in example:
            out.append(EvalRow(None, example["text"], place))
    return out


# --- generation ----------------------------------------------------------------------------
def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def generate_answers(model: Any, tokenizer: Any, rows: Sequence[EvalRow], should_stop: Any = None,
                     progress: Progress | None = None) -> list[str] | None:
    """Greedy answers to each row's prompt, in batches (left-padded); None if `should_stop()` said so between them.
    progress(done, total): rows answered, after each batch."""
    import torch

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # a batch's answers all start at the same column
    device = next(model.parameters()).device
    answers: list[str] = []
    try:
        for start in range(0, len(rows), BATCH):
            if should_stop is not None and should_stop():
                return None
            batch = rows[start : start + BATCH]
            if isinstance(batch[0].prompt, str):
                inputs = tokenizer([r.prompt for r in batch], return_tensors="pt", padding=True)
            elif any(r.tools for r in batch):  # each row's own tools: the template renders them with its prompt
                texts = [tool_scores.chat_text(tokenizer, r.prompt, r.tools, True) for r in batch]
                inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            else:
                inputs = tokenizer.apply_chat_template([r.prompt for r in batch], add_generation_prompt=True,
                                                       return_tensors="pt", return_dict=True, padding=True)
            longest = max(len(tokenizer(r.reference, add_special_tokens=False)["input_ids"]) for r in batch)
            inputs = {k: v.to(device) for k, v in inputs.items()}
            with torch.no_grad():
                output = model.generate(
                    **inputs,
                    max_new_tokens=min(MAX_NEW_TOKENS, 2 * longest + 8),
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=_eos_ids(model, tokenizer),
                )
            width = inputs["input_ids"].shape[1]
            answers += [tokenizer.decode(seq[width:], skip_special_tokens=True).strip() for seq in output]
            if progress is not None:
                progress(len(answers), len(rows))
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()
    return answers


# --- the loss of each row ----------------------------------------------------------------------
def _token_ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def _chat_ids(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool,
              tools: list[dict[str, Any]] | None = None) -> list[int]:
    return _token_ids(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                                    add_generation_prompt=generation_prompt))


def row_tokens(tokenizer: Any, row: EvalRow) -> tuple[list[int], list[int]]:
    """(prompt tokens, reference tokens) as the trainer sees the row: a conversation through the chat template
    (the reply is what the template adds after the generation prompt), plain text with EOS after the reply."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if row.prompt is None:
        return [], _token_ids(tokenizer(row.reference)) + eos
    if isinstance(row.prompt, str):
        prompt = _token_ids(tokenizer(row.prompt))
        full = _token_ids(tokenizer(row.prompt + row.reference)) + eos
    else:
        prompt = _chat_ids(tokenizer, row.prompt, True, row.tools)
        reply = row.reply or {"role": "assistant", "content": row.reference}
        full = _chat_ids(tokenizer, [*row.prompt, reply], False, row.tools)
    if full[: len(prompt)] != prompt:  # a tokenizer that merges across the seam: the reply on its own
        full = prompt + _token_ids(tokenizer(row.reference, add_special_tokens=False)) + eos
    return prompt, full[len(prompt):]


LOSS_BATCH = 8  # rows scored in one forward pass
LOGITS_BUDGET = 1 << 27  # logits one pass may make (512 MiB in fp32): fewer rows per pass for long replies


def row_losses(model: Any, tokenizer: Any, rows: Sequence[EvalRow], max_length: int,
               should_stop: Any = None) -> list[float | None] | None:
    """Each row's mean cross-entropy per reference token given its prompt (cut to max_length tokens, as training
    cuts it); None for a row with no reference token left; None for all if `should_stop()` said so between passes.

    Rows go in batches, left-padded so that every row's reference ends at the last column: the pass keeps only
    the logits of the last (longest reference + 1) positions (`logits_to_keep`), never a long prompt's.
    """
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    losses: list[float | None] = [None] * len(rows)
    scored: list[tuple[int, list[int], int]] = []  # (row, its tokens, how many of them are predicted)
    for i, row in enumerate(rows):
        prompt, reference = row_tokens(tokenizer, row)
        ids = (prompt + reference)[:max_length]
        k = len(ids) - max(len(prompt), 1)  # a text row's first token is given, not predicted
        if k > 0:
            scored.append((i, ids, k))

    def score_batch(batch: list[tuple[int, list[int], int]]) -> None:
        width = max(len(ids) for _, ids, _ in batch)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        inputs = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids, _ in batch], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids, _ in batch], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
        keep = max(k for _, _, k in batch) + 1
        with torch.no_grad():
            try:
                logits = model(input_ids=inputs, attention_mask=mask, position_ids=positions,
                               logits_to_keep=keep).logits
            except TypeError:  # a model without logits_to_keep
                logits = model(input_ids=inputs, attention_mask=mask, position_ids=positions).logits
        for j, (i, _, k) in enumerate(batch):
            losses[i] = float(F.cross_entropy(logits[j, -(k + 1):-1].float(), inputs[j, -k:]).item())

    try:
        batch: list[tuple[int, list[int], int]] = []
        for item in scored:
            keep = max([k for _, _, k in batch] + [item[2]]) + 1
            if batch and (len(batch) >= LOSS_BATCH or (len(batch) + 1) * keep * vocab > LOGITS_BUDGET):
                if should_stop is not None and should_stop():
                    return None
                score_batch(batch)
                batch = []
            batch.append(item)
        if batch:
            if should_stop is not None and should_stop():
                return None
            score_batch(batch)
    finally:
        if was_training:
            model.train()
    return losses


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# --- before and after --------------------------------------------------------------------
class Evaluator:
    """Answers the held-out rows with the base model, then with the result, and compares both; measures each
    scored row's loss under both."""

    def __init__(self, rows: list[EvalRow], scored: list[EvalRow] | None = None, max_length: int = 2048) -> None:
        self.rows = rows  # answered by both models
        self.scored = scored if scored is not None else rows  # their loss measured one by one (rows among them)
        self.max_length = max_length
        self.before: list[str] | None = None
        self.loss_before: float | None = None
        self.row_loss_before: list[float | None] = []
        self.tools_before: list[dict[str, float | None] | None] = []

    @classmethod
    def for_job(cls, eval_examples: Iterable[dict[str, Any]] | None, limit: int,
                places: Sequence[dict[str, Any]] | None = None, max_length: int = 2048) -> Evaluator | None:
        """None when there is nothing to judge: no eval split. places: each eval example's {file, line}."""
        if eval_examples is None:
            return None
        scored = eval_rows(eval_examples, max(SCORED_ROWS, limit), places, text=True)
        answered = [r for r in scored if r.prompt is not None][:limit] if limit > 0 else []
        return cls(answered, scored, max_length)

    def answer_before(self, model: Any, tokenizer: Any, loss: float | None, should_stop: Any = None,
                      progress: Progress | None = None) -> bool:
        """The base model's answers and row losses; False if a stop arrived meanwhile."""
        self._render_calls(tokenizer)
        self.loss_before = loss
        self.before = generate_answers(model, tokenizer, self.rows, should_stop, progress) if self.rows else []
        if self.before is None:
            return False
        self.tools_before = self._score_calls(tokenizer, self.before)
        losses = row_losses(model, tokenizer, self.scored, self.max_length, should_stop)
        self.row_loss_before = losses or []
        return losses is not None

    def result(self, model: Any, tokenizer: Any, loss_after: float | None,
               progress: Progress | None = None, rows_file: Path | None = None) -> Evaluation:
        """The comparison; with rows_file, every scored row (write_rows) goes there."""
        after = generate_answers(model, tokenizer, self.rows, progress=progress) if self.rows else []
        assert after is not None and self.before is not None
        references = [r.reference for r in self.rows]
        tools_after = self._score_calls(tokenizer, after)
        first = {**score(self.before, references), **tool_scores.mean_scores([t for t in self.tools_before if t])}
        last = {**score(after, references), **tool_scores.mean_scores([t for t in tools_after if t])}
        metrics = {name: BeforeAfter(before=first.get(name), after=last.get(name)) for name in {**first, **last}}
        metrics["eval_loss"] = BeforeAfter(before=self.loss_before, after=loss_after)
        metrics["perplexity"] = BeforeAfter(before=perplexity(self.loss_before), after=perplexity(loss_after))
        examples = [EvalExample(prompt=r.shown, reference=r.reference, before=b, after=a)
                    for r, b, a in list(zip(self.rows, self.before, after, strict=True))[:SHOWN_EXAMPLES]]
        written = None
        if rows_file is not None and self.scored:
            losses = row_losses(model, tokenizer, self.scored, self.max_length) or []
            tools = [name for name in tool_scores.TOOL_METRICS if name in metrics]
            write_rows(rows_file, self.table(after, losses, tools_after), [*METRICS, *tools])
            written = str(rows_file)
        return Evaluation(rows=len(self.rows), metrics=metrics, examples=examples, rows_file=written,
                          scored_rows=len(self.scored) if written else 0)

    def _render_calls(self, tokenizer: Any) -> None:
        """A reference that calls tools reads as the chat template writes the calls (the text metrics compare the
        model's output with it, and people read it); the rows keep their identities' correspondence."""
        rendered = {}
        for row in self.scored:
            if row.reply is not None and row.reply.get("tool_calls") and isinstance(row.prompt, list):
                text = tool_scores.reply_text(tokenizer, row.prompt, row.reply, row.tools)
                if text is not None:
                    rendered[id(row)] = replace(row, reference=text)
        self.scored = [rendered.get(id(r), r) for r in self.scored]
        self.rows = [rendered.get(id(r), r) for r in self.rows]

    def _score_calls(self, tokenizer: Any, answers: Sequence[str]) -> list[dict[str, float | None] | None]:
        """Each answered row's tool-call figures (tool_scores), None for a row that is not a tool row."""
        read = tool_scores.reader_for(getattr(tokenizer, "chat_template", None))
        return [None if row.calls is None else tool_scores.score_calls(read(answer), row.calls)
                for row, answer in zip(self.rows, answers, strict=True)]

    def table(self, after: Sequence[str], losses: Sequence[float | None],
              tools_after: Sequence[dict[str, float | None] | None] = ()) -> list[dict[str, Any]]:
        """One record per scored row, in the held-out rows' order: where it is, its prompt (as shown, and a chat
        row's whole conversation before its reference) and reference, its loss before and after, and, where it was
        answered, both answers and each metric of the answer after (a tool row's tool-call figures too)."""
        answered = {id(r): i for i, r in enumerate(self.rows)}
        before_losses = list(self.row_loss_before) + [None] * (len(self.scored) - len(self.row_loss_before))
        table = []
        for n, (row, loss, loss_before) in enumerate(zip(self.scored, losses, before_losses, strict=True)):
            record: dict[str, Any] = {
                "index": n, **(row.place or {"file": None, "line": None}),
                "prompt": row.shown, "reference": row.reference,
                # the whole conversation before the reference (system and earlier turns): what a judge asks again
                "messages": row.prompt if isinstance(row.prompt, list) else None,
                "loss": _finite(loss), "loss_before": _finite(loss_before),
                "answer": None, "answer_before": None,
            }
            i = answered.get(id(row))
            if i is not None and self.before is not None:
                record["answer"], record["answer_before"] = after[i], self.before[i]
                for name, fn in METRICS.items():
                    record[name] = fn(after[i], row.reference)
                    record[f"{name}_before"] = fn(self.before[i], row.reference)
                for figures, suffix in ((_at(tools_after, i), ""), (_at(self.tools_before, i), "_before")):
                    record.update({f"{name}{suffix}": value for name, value in (figures or {}).items()})
            table.append(record)
        return table


def _at(items: Sequence[Any], i: int) -> Any:
    return items[i] if i < len(items) else None


def write_rows(path: Path, table: list[dict[str, Any]], metrics: Sequence[str] = tuple(METRICS)) -> None:
    """The rows' records as EVAL_ROWS_FILE: {"loss": what loss means, "metrics": [...], "rows": [...]}."""
    body = {"loss": "mean cross-entropy per token of the reference reply given the prompt (teacher-forced)",
            "metrics": list(metrics), "rows": table}
    path.write_text(json.dumps(body, ensure_ascii=False) + "\n", encoding="utf-8")


def perplexity(loss: float | None) -> float | None:
    if loss is None or not math.isfinite(loss):
        return None
    return math.exp(min(loss, 700.0))  # beyond that exp overflows a float
