"""A trained reward model put to use: scoring (prompt, answer) pairs for `/v1/rewards` (serve/scoring.py) and as a
GRPO reward (`model:path/to/folder` in reward_functions, worker/rewards.build).

The folder is a reward job's output (its LoRA adapter with the score head it trained, `modules_to_save`) or a
merged sequence classifier (the job's `merged` export, or any `...ForSequenceClassification` with one label). An
adapter is merged into its base once, at load. Each answer is scored exactly as the job's own evaluation and TRL's
RewardTrainer score it (reward_eval.scored_ids: a conversation through the chat template, text with EOS), one
sequence at a time, so no padding can shift which token is read.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from tunestudio.paths import expand
from tunestudio.worker.errors import UserError
from tunestudio.worker.rewards import RewardFunction, completion_text
from tunestudio.worker.train.model import from_pretrained
from tunestudio.worker.train.reward_eval import scored_ids


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class RewardModel:
    """A loaded reward model: `score(prompt, answer)` is its scalar for the answer to the prompt."""

    def __init__(self, folder: str | Path, base_model: str | None = None, max_length: int = 2048) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = expand(folder)
        adapter = _read(path / "adapter_config.json")
        job = _read(path / "job_config.json") or _read(path.parent / "job_config.json")
        if not adapter and not (path / "config.json").is_file():
            raise UserError(f"reward model {folder}: neither an adapter (adapter_config.json) nor a model "
                            "(config.json) is in this folder")
        if job.get("method") not in (None, "reward") or (adapter and adapter.get("task_type") not in (None, "SEQ_CLS")):
            raise UserError(f"reward model {folder}: this is a {job.get('method') or adapter.get('task_type')} model, "
                            "not a reward model (train one with method: reward)")
        if adapter:
            from peft import PeftModel

            base = base_model or job.get("model_name") or adapter.get("base_model_name_or_path")
            if not base:
                raise UserError(f"reward model {folder}: the adapter does not say which base model it belongs to")
            model = from_pretrained(AutoModelForSequenceClassification, str(base), "model", dtype=torch.float32,
                                    num_labels=1)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
            tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else expand(str(base))
        else:
            architectures = _read(path / "config.json").get("architectures") or []
            if not job and not any(str(a).endswith("ForSequenceClassification") for a in architectures):
                raise UserError(f"reward model {folder}: a {', '.join(map(str, architectures)) or 'model'}, not a "
                                "sequence classifier (train a reward model with method: reward)")
            model = from_pretrained(AutoModelForSequenceClassification, str(path), "model", dtype=torch.float32)
            if model.config.num_labels != 1:
                raise UserError(f"reward model {folder}: its head has {model.config.num_labels} outputs; a reward "
                                "model has one")
            tokenizer_dir = path
        self.tokenizer = from_pretrained(AutoTokenizer, str(tokenizer_dir), "tokenizer")
        self.model = model.eval()
        self.max_length = int(job.get("max_seq_length") or max_length)
        self.folder = str(path)

    def score(self, prompt: Any, answer: Any) -> float:
        """The score of `answer` (text, or assistant turns) to `prompt` (text, turns, or None)."""
        import torch

        if isinstance(prompt, list) and isinstance(answer, str):
            answer = [{"role": "assistant", "content": answer}]
        ids = scored_ids(self.tokenizer, prompt, answer)[-self.max_length:]
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids], device=next(self.model.parameters()).device)).logits
        return float(logits.reshape(-1)[0])


def reward_function(entry: str, folder: str) -> RewardFunction:
    """`model:<folder>` as a GRPO reward: each completion's score by the reward model (loaded once, here)."""
    from tunestudio.config import reward_name

    scorer = RewardModel(folder)

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        return [scorer.score(p, completion_text(c)) for p, c in zip(prompts, completions, strict=True)]

    reward.__name__ = reward_name(entry)  # TRL logs rewards/<__name__>/mean
    return reward
