"""GRPO reward functions: the built-ins, and loading the user's own from `path/to/file.py:function`.

Every reward function is called the way TRL's GRPOTrainer calls it, once per
batch: `prompts` and `completions` (one each per completion), `completion_ids`,
and every other dataset column as a keyword holding one value per completion
(the row's value, repeated for each of its completions), plus TRL's
`trainer_state`, `log_extra` and `log_metric`. Completions reach these functions
as plain text, also for chat datasets (the assistant message's content), so a
reward never needs to know the dataset's shape. A function returns one float
(or None: "does not apply") per completion.

User reward functions are the user's own Python code: loading one executes its
file inside the worker process, with the worker's permissions, exactly as a
training script of theirs would. They are never imported by the parent (server
or CLI); the config only checks their spelling.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunestudio.config import ANSWER_REWARDS, BUILTIN_REWARDS, DataSpec, JobConfig, reward_model_folder, reward_name
from tunestudio.paths import expand
from tunestudio.worker.errors import UserError

RewardFunction = Callable[..., list[float | None]]

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_EDGE_PUNCTUATION = ".,;:!?\"'`()[]{}"


def completion_text(completion: Any) -> str:
    """A completion's text: a string as it is, a conversation's assistant content joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def normalise(text: Any) -> str:
    """For comparing answers: Unicode NFKC, case-folded, whitespace collapsed, edge punctuation dropped."""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    return " ".join(text.split()).strip(_EDGE_PUNCTUATION + " ")


def last_number(text: str) -> float | None:
    """The last number written in `text` (1,234.5 and -3e2 count), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def answer_number(value: Any) -> float | None:
    """A row's `answer` as a number, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return last_number(str(value)) if _NUMBER.fullmatch(str(value).strip()) else None


# --- the built-ins ----------------------------------------------------------------
def exact_match(completions: list[Any], answer: list[Any], **_: Any) -> list[float]:
    """1 when the completion equals the row's answer after normalisation, else 0."""
    return [float(normalise(completion_text(c)) == normalise(a)) for c, a in zip(completions, answer, strict=True)]


def contains_answer(completions: list[Any], answer: list[Any], **_: Any) -> list[float]:
    """1 when the normalised answer appears in the normalised completion, else 0."""
    return [float(normalise(a) in normalise(completion_text(c))) for c, a in zip(completions, answer, strict=True)]


def numeric_match(completions: list[Any], answer: list[Any], **_: Any) -> list[float]:
    """1 when the last number in the completion equals the answer (to 1e-6 relative), else 0."""
    out = []
    for c, a in zip(completions, answer, strict=True):
        got, wanted = last_number(completion_text(c)), answer_number(a)
        out.append(float(got is not None and wanted is not None and math.isclose(got, wanted, rel_tol=1e-6,
                                                                                abs_tol=1e-9)))
    return out


def format_regex(pattern: str) -> RewardFunction:
    compiled = re.compile(pattern, re.DOTALL)

    def format_regex(completions: list[Any], **_: Any) -> list[float]:
        """1 when the completion matches the pattern (re.search), else 0."""
        return [float(compiled.search(completion_text(c)) is not None) for c in completions]

    return format_regex


def length_penalty(max_completion_length: int) -> RewardFunction:
    def length_penalty(completions: list[Any], completion_ids: list[list[int]] | None = None,
                       **_: Any) -> list[float]:
        """-(completion tokens / max_completion_length): 0 for an empty completion, -1 for a full one."""
        if completion_ids is None:  # called outside TRL: count characters against the same budget
            return [-min(len(completion_text(c)) / max_completion_length, 1.0) for c in completions]
        return [-min(len(ids) / max_completion_length, 1.0) for ids in completion_ids]

    return length_penalty


def builtin(name: str, cfg: JobConfig) -> RewardFunction:
    if name == "format_regex":
        return format_regex(cfg.reward_format_pattern or "")
    if name == "length_penalty":
        return length_penalty(cfg.max_completion_length)
    return {"exact_match": exact_match, "contains_answer": contains_answer, "numeric_match": numeric_match}[name]


# --- the user's own -------------------------------------------------------------------
def load_user_function(entry: str) -> RewardFunction:
    """Import `path/to/file.py:function` (this runs the file's code) and wrap it; UserError if it cannot be."""
    path_text, _, name = entry.rpartition(":")
    path = expand(path_text)
    if not path.is_file():
        raise UserError(f"reward_functions: {entry}: there is no file {path_text} "
                        f"(a relative path is read from {Path.cwd()})")
    module_name = "tunestudio_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"reward_functions: {entry}: {path_text} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise UserError(f"reward_functions: {entry}: importing {path_text} failed: {type(exc).__name__}: {exc}") \
            from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"reward_functions: {entry}: {path_text} defines no function {name!r}")
    return _checked(entry, function)


def _checked(entry: str, function: Callable[..., Any]) -> RewardFunction:
    """The user's function with text completions, and its failures and wrong answers named."""

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        texts = [completion_text(c) for c in completions]
        try:
            values = function(prompts=prompts, completions=texts, **kwargs)
        except Exception as exc:
            columns = sorted(k for k in kwargs if k not in ("completion_ids", "trainer_state", "log_extra",
                                                             "log_metric"))
            raise UserError(f"reward function {entry} raised {type(exc).__name__}: {exc} (it is called with "
                            f"prompts, completions, completion_ids and the columns {columns}; accept **kwargs "
                            "for the ones it does not use)") from exc
        try:
            values = list(values)
        except TypeError:
            raise UserError(f"reward function {entry} returned {type(values).__name__}, not a list of numbers") \
                from None
        if len(values) != len(texts):
            raise UserError(f"reward function {entry} returned {len(values)} rewards for {len(texts)} completions")
        out: list[float | None] = []
        for value in values:
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise UserError(f"reward function {entry} returned {value!r}; each reward is a number or None")
            out.append(None if value is None else float(value))
        return out

    reward.__name__ = reward_name(entry)  # TRL logs rewards/<__name__>/mean
    return reward


def build(cfg: JobConfig, model_reward: Callable[[str, str], RewardFunction] | None = None) -> list[RewardFunction]:
    """The job's reward functions, in its order; user files are imported here, inside the worker. A reward model
    (`model:<folder>`) is loaded by `model_reward(entry, folder)` (train/reward_model.py: rewards stand below
    train/)."""
    out = []
    for entry in cfg.reward_functions:
        folder = reward_model_folder(entry)
        if folder is not None:
            if model_reward is None:
                raise UserError(f"reward_functions: {entry}: reward models are not loaded here")
            out.append(model_reward(entry, folder))
        else:
            out.append(builtin(entry, cfg) if entry in BUILTIN_REWARDS else load_user_function(entry))
    return out


def needs_answer(cfg: JobConfig | DataSpec) -> list[str]:
    """The job's reward functions that compare with each row's `answer` column."""
    return [e for e in cfg.reward_functions if e in ANSWER_REWARDS]
