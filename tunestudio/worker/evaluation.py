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
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tunestudio.events import BeforeAfter, EvalExample, Evaluation

SHOWN_EXAMPLES = 5  # rows the job's record keeps for people to read
MAX_NEW_TOKENS = 256  # the longest answer generated for one row
BATCH = 8
Progress = Callable[[int, int], None]  # (done, total), as worker/phases.py's Steps.counter takes it


# --- metrics ------------------------------------------------------------------------
def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalise(prediction) == normalise(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD-style F1 over whitespace tokens; two empty texts agree (1.0), one empty text scores 0."""
    pred, ref = normalise(prediction).split(), normalise(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


_ROUGE: Any = None


def rouge_l(prediction: str, reference: str) -> float:
    global _ROUGE
    if _ROUGE is None:
        from rouge_score import rouge_scorer

        _ROUGE = rouge_scorer.RougeScorer(["rougeL"])
    return float(_ROUGE.score(reference, prediction)["rougeL"].fmeasure)


METRICS = {"exact_match": exact_match, "token_f1": token_f1, "rouge_l": rouge_l}


def score(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Each text metric's mean over the rows; {} for no rows."""
    if not references:
        return {}
    return {name: sum(fn(p, r) for p, r in zip(predictions, references, strict=True)) / len(references)
            for name, fn in METRICS.items()}


# --- held-out rows ----------------------------------------------------------------------
@dataclass(frozen=True)
class EvalRow:
    prompt: Any  # a list of chat messages, or plain prompt text
    reference: str

    @property
    def shown(self) -> str:
        """The prompt as a person reads it: the last user turn, or the plain text."""
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


def eval_rows(examples: Iterable[dict[str, Any]], limit: int) -> list[EvalRow]:
    """The first `limit` examples that have a prompt and a reference reply (plain text rows have neither)."""
    out: list[EvalRow] = []
    for example in examples:
        if len(out) >= limit:
            break
        if "messages" in example:
            messages = example["messages"]
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
            if last:
                out.append(EvalRow(messages[:last], str(messages[last]["content"])))
            continue
        reply = example.get("completion", example.get("chosen"))
        reference = _content(reply)
        if "prompt" in example and reference is not None:
            out.append(EvalRow(example["prompt"], reference))
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


# --- before and after --------------------------------------------------------------------
class Evaluator:
    """Answers the held-out rows with the base model, then with the result, and compares both."""

    def __init__(self, rows: list[EvalRow]) -> None:
        self.rows = rows
        self.before: list[str] | None = None
        self.loss_before: float | None = None

    @classmethod
    def for_job(cls, eval_examples: Iterable[dict[str, Any]] | None, limit: int) -> Evaluator | None:
        """None when there is nothing to judge: no eval split."""
        if eval_examples is None:
            return None
        return cls(eval_rows(eval_examples, limit) if limit > 0 else [])

    def answer_before(self, model: Any, tokenizer: Any, loss: float | None, should_stop: Any = None,
                      progress: Progress | None = None) -> bool:
        """The base model's answers; False if a stop arrived meanwhile."""
        self.loss_before = loss
        self.before = generate_answers(model, tokenizer, self.rows, should_stop, progress) if self.rows else []
        return self.before is not None

    def result(self, model: Any, tokenizer: Any, loss_after: float | None,
               progress: Progress | None = None) -> Evaluation:
        after = generate_answers(model, tokenizer, self.rows, progress=progress) if self.rows else []
        assert after is not None and self.before is not None
        references = [r.reference for r in self.rows]
        first, last = score(self.before, references), score(after, references)
        metrics = {name: BeforeAfter(before=first[name], after=last[name]) for name in first}
        metrics["eval_loss"] = BeforeAfter(before=self.loss_before, after=loss_after)
        metrics["perplexity"] = BeforeAfter(before=_perplexity(self.loss_before), after=_perplexity(loss_after))
        examples = [EvalExample(prompt=r.shown, reference=r.reference, before=b, after=a)
                    for r, b, a in list(zip(self.rows, self.before, after, strict=True))[:SHOWN_EXAMPLES]]
        return Evaluation(rows=len(self.rows), metrics=metrics, examples=examples)


def _perplexity(loss: float | None) -> float | None:
    if loss is None or not math.isfinite(loss):
        return None
    return math.exp(min(loss, 700.0))  # beyond that exp overflows a float
