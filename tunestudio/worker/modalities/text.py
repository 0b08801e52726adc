"""Text: a causal language model, its tokenizer and chat template, rows of text or chat (worker/data/).

The training side's modules load when a job asks for them: the chat worker, which only serves, reads
`serving_loaders` and never imports TRL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tunestudio.config import JobConfig

if TYPE_CHECKING:
    import torch

    from tunestudio.worker.data import PreparedData
    from tunestudio.worker.train import Evaluator


class TextModality:
    name = "text"

    def load_processor(self, cfg: JobConfig) -> Any:
        from tunestudio.worker.train import load_tokenizer

        return load_tokenizer(cfg)

    def load_model(self, cfg: JobConfig, compute_dtype: torch.dtype) -> torch.nn.Module:
        from tunestudio.worker.train import load_model

        return load_model(cfg, compute_dtype)

    def prepare_data(self, cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
        from tunestudio.worker.data import prepare

        return prepare(cfg, processor)

    def generate(self, model: torch.nn.Module, processor: Any, prompt: str) -> str:
        from tunestudio.worker.train import generate

        return generate(model, processor, prompt)

    def evaluator(self, held_eval: Any, limit: int, places: Sequence[dict[str, Any]] | None,
                  max_length: int) -> Evaluator | None:
        from tunestudio.worker.train import Evaluator

        return Evaluator.for_job(held_eval, limit, places, max_length)

    def serving_loaders(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoTokenizer, AutoModelForCausalLM
