"""A reward model's held-out evaluation: the base's score head and the result's, on the same held-out pairs.

Each pair's prompt + chosen and prompt + rejected are scored as TRL's RewardTrainer scores them (a conversation
through the chat template, plain text with EOS appended); accuracy is the share of pairs whose chosen answer
scores above the rejected one (ties count as wrong: an untrained head that scores everything alike is at 0, a
random one about 0.5), margin the mean of chosen minus rejected. The job's evaluation table shows both, before
and after, as for any other method (worker/main.py asks `for_job` in place of the text Evaluator).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunestudio.events import BeforeAfter, EvalExample, Evaluation

PAIRS = 256  # held-out pairs scored (at least; eval_generate_rows if more)
SHOWN_EXAMPLES = 5
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Pair:
    prompt: Any  # a conversation (list of messages), plain text, or None (chosen/rejected hold the whole text)
    chosen: Any
    rejected: Any

    def shown(self) -> str:
        return _text(self.prompt) if self.prompt is not None else ""


def _text(turns: Any) -> str:
    if isinstance(turns, list):
        return "\n".join(str(m.get("content") or "") for m in turns if isinstance(m, dict))
    return str(turns or "")


def pairs_of(examples: Iterable[dict[str, Any]], limit: int) -> list[Pair]:
    out: list[Pair] = []
    for example in examples:
        if len(out) >= limit:
            break
        if example.get("chosen") is not None and example.get("rejected") is not None:
            out.append(Pair(example.get("prompt"), example["chosen"], example["rejected"]))
    return out


def scored_ids(tokenizer: Any, prompt: Any, answer: Any) -> list[int]:
    """The tokens RewardTrainer scores for one answer (its tokenize_fn and add_eos)."""
    if isinstance(answer, list):  # conversational
        messages = (prompt or []) + answer
        encoded = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    text = (prompt or "") + answer
    if tokenizer.eos_token and not text.endswith(tokenizer.eos_token):
        text += tokenizer.eos_token
    return list(tokenizer(text)["input_ids"])


def score_pairs(model: Any, tokenizer: Any, pairs: Sequence[Pair], max_length: int, should_stop: Any = None,
                progress: Progress | None = None) -> list[tuple[float, float]] | None:
    """(chosen score, rejected score) of each pair, one sequence at a time (no padding to get wrong); None if
    should_stop() said so between pairs."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    scores: list[tuple[float, float]] = []
    try:
        for i, pair in enumerate(pairs):
            if should_stop is not None and should_stop():
                return None
            both = []
            for answer in (pair.chosen, pair.rejected):
                ids = scored_ids(tokenizer, pair.prompt, answer)[-max_length:]
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids], device=device)).logits
                both.append(float(logits.reshape(-1)[0]))
            scores.append((both[0], both[1]))
            if progress is not None:
                progress(i + 1, len(pairs))
    finally:
        if was_training:
            model.train()
    return scores


def summary(scores: Sequence[tuple[float, float]]) -> dict[str, float | None]:
    """accuracy (chosen scored strictly above rejected) and mean margin; None when there are no pairs."""
    if not scores:
        return {"accuracy": None, "margin": None}
    return {"accuracy": sum(c > r for c, r in scores) / len(scores),
            "margin": sum(c - r for c, r in scores) / len(scores)}


class RewardEvaluator:
    """Scores the held-out pairs with the base model's head, then with the result's, and compares them."""

    def __init__(self, rows: list[Pair], max_length: int) -> None:
        self.rows = rows
        self.max_length = max_length
        self.before: list[tuple[float, float]] = []
        self.loss_before: float | None = None

    @classmethod
    def for_job(cls, eval_examples: Iterable[dict[str, Any]] | None, limit: int,
                max_length: int) -> RewardEvaluator | None:
        """None when there is nothing to judge: no eval split."""
        if eval_examples is None:
            return None
        return cls(pairs_of(eval_examples, max(PAIRS, limit)), max_length)

    def answer_before(self, model: Any, tokenizer: Any, loss: float | None, should_stop: Any = None,
                      progress: Progress | None = None) -> bool:
        """The base model's scores; False if a stop arrived meanwhile."""
        self.loss_before = loss
        scores = score_pairs(model, tokenizer, self.rows, self.max_length, should_stop, progress)
        if scores is None:
            return False
        self.before = scores
        return True

    def result(self, model: Any, tokenizer: Any, loss_after: float | None, progress: Progress | None = None,
               rows_file: Path | None = None) -> Evaluation:
        """The comparison (no rows file: a pair's two scores are in the examples shown)."""
        after = score_pairs(model, tokenizer, self.rows, self.max_length, progress=progress) or []
        first, last = summary(self.before), summary(after)
        metrics = {name: BeforeAfter(before=first[name], after=last[name]) for name in first}
        metrics["eval_loss"] = BeforeAfter(before=self.loss_before, after=loss_after)
        examples = [EvalExample(prompt=p.shown(), reference=_text(p.chosen),
                                before=f"chosen {b[0]:.3f}, rejected {b[1]:.3f}",
                                after=f"chosen {a[0]:.3f}, rejected {a[1]:.3f}")
                    for p, b, a in list(zip(self.rows, self.before, after, strict=False))[:SHOWN_EXAMPLES]]
        return Evaluation(rows=len(after), metrics=metrics, examples=examples)
