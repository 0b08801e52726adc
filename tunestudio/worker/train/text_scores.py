"""The text metrics of the held-out evaluation (worker/train/evaluation.py): exact match, token F1, ROUGE-L of an
answer against its reference, each 0..1."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any


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
