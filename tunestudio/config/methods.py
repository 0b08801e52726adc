"""The training methods, one `MethodSpec` each: what the config, the worker and the page know of a method.

Adding a method means adding an entry here (and its trainer builder in worker/train/methods.py): the validator
reads its formats, options, mapping fields, defaults and checks; the worker picks the trainer family; the
estimate reads its rows per example and whether its loss is fused; the OpenAI fine-tuning API its method type
and the file it trains from; the page (GET /api/web/defaults) shows its label, summary, formats, defaults and
main metric. Each field says what it means (`MethodSpec.help`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

# A check reads a whole JobConfig (config/job.py, which reads this registry: named here as Any, no circle).
JobConfig = Any

__all__ = [
    "ANSWER_REWARDS", "BUILTIN_REWARDS", "METHODS", "METHOD_ALIASES", "METHOD_FORMATS", "METHOD_MAIN_METRIC",
    "METHOD_OPTIONS", "METHOD_SPECS", "OPENAI_TYPES", "MethodSpec", "OpenAIFile", "method_spec", "openai_method",
    "reward_model_folder", "reward_name", "reward_source",
]

# Built-in GRPO reward functions (tunestudio/worker/rewards.py); the first three compare with a row's `answer`.
BUILTIN_REWARDS: tuple[str, ...] = ("exact_match", "contains_answer", "numeric_match", "format_regex", "length_penalty")
ANSWER_REWARDS: tuple[str, ...] = ("exact_match", "contains_answer", "numeric_match")
# A user reward function: path/to/file.py:function (its code runs inside the worker).
USER_REWARD = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")
# A reward model: model:path/to/folder (a reward job's output, or a merged sequence classifier) scores each reply.
MODEL_REWARD = re.compile(r"^model:(?P<path>.+)$")


def reward_name(entry: str) -> str:
    """The name a reward function's metrics are logged under: a built-in's name, the user function's, or
    model_<folder name> for a reward model."""
    if model := MODEL_REWARD.match(entry):
        return "model_" + re.sub(r"\W", "_", model.group("path").rstrip("/").rpartition("/")[2])
    match = USER_REWARD.match(entry)
    return match.group("name") if match else entry


def reward_model_folder(entry: str) -> str | None:
    """The folder of a reward model entry ("model:path/to/folder"); None for any other."""
    match = MODEL_REWARD.match(entry)
    return match.group("path") if match else None


def reward_source(entry: str) -> str | None:
    """The file of a user reward function ("path/to/file.py:function"); None for a built-in or a reward model."""
    match = None if MODEL_REWARD.match(entry) else USER_REWARD.match(entry)
    return match.group("path") if match else None


@dataclass(frozen=True)
class OpenAIFile:
    """How POST /v1/fine_tuning/jobs trains a method: the rows an OpenAI training file holds for it
    (api/fine_tune_data.py: chat or preference rows) and the studio format they are converted to."""

    rows: Literal["chat", "preference"]
    format: str


@dataclass(frozen=True)
class MethodSpec:
    """One training method: every fact the config, the worker, the estimate, the OpenAI API and the page know of
    it, each field with its help (TRL's way: `field(metadata={"help": ...})`; `MethodSpec.help(name)`)."""

    name: str = field(metadata={"help": "JobConfig.method's value."})
    label: str = field(metadata={"help": "The page's name for it."})
    summary: str = field(metadata={"help": "One line the page shows under the label."})
    trainer: Literal["sft", "dpo", "orpo", "kto", "grpo", "reward", "seq2seq"] = field(metadata={
        "help": "The TRL trainer family that builds it (worker/train/methods.py; sft and pretrain both train with "
                "SFTTrainer; reward trains a sequence-classification head with RewardTrainer)."})
    formats: tuple[str, ...] = field(metadata={"help": "The dataset formats it trains on (auto picks one)."})
    options: tuple[str, ...] = field(default=(), metadata={
        "help": "The JobConfig fields that mean something for this method (and perhaps others) only; set for "
                "another method, an error naming both."})
    mappings: tuple[tuple[str, ...], ...] = field(default=(), metadata={
        "help": "What custom_format_mapping may map columns to, as alternatives (each a tuple of the fields that "
                "must all be mapped); empty: columns map to chat roles."})
    optional_mappings: tuple[str, ...] = field(default=(), metadata={"help": "Fields that may be mapped too."})
    defaults: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "JobConfig defaults that depend on the method (applied when the field is not given)."})
    main_metric: str | None = field(default=None, metadata={
        "help": "The metric it is watched by (TRL's name: the CLI's bar, the page's method chart, early stopping "
                "as eval_<name>); None: the loss."})
    aliases: tuple[str, ...] = field(default=(), metadata={"help": "Other spellings of its name."})
    check: Callable[[JobConfig], None] | None = field(default=None, metadata={
        "help": 'Its own rule over a whole config (raises ValueError "field: reason").'})
    rows_per_example: int = field(default=1, metadata={
        "help": "Sequences a batch runs per example: 2 where a pair's chosen and rejected answers run together. "
                "The estimate counts it in a micro-batch's activations and logits, the tokens of a step and each "
                "evaluation's forward pass."})
    modalities: tuple[str, ...] = field(default=("text",), metadata={
        "help": "The kinds of data (JobConfig.modality) it trains; another is refused, naming both."})
    modality_trainers: dict[str, str] = field(default_factory=dict, metadata={
        "help": "The trainer family for a kind of data whose model is not what `trainer` trains (audio: an "
                "encoder-decoder speech model, trained by transformers' Seq2SeqTrainer: seq2seq)."})
    openai_type: str | None = field(default=None, metadata={
        "help": "The OpenAI fine-tuning API's method.type a job of it is shown as (GET /v1/fine_tuning/jobs); "
                "None: its own name."})
    openai_file: OpenAIFile | None = field(default=None, metadata={
        "help": "Set on the method POST /v1/fine_tuning/jobs trains when asked for its openai_type: the rows its "
                "training file holds and the format they become; None: the API does not start it."})

    def trainer_for(self, modality: str) -> str:
        """The trainer family of a job of this method on `modality` data."""
        return self.modality_trainers.get(modality, self.trainer)

    @property
    def openai_kind(self) -> str:
        """The method.type the OpenAI fine-tuning API shows a job of this method as."""
        return self.openai_type or self.name

    @property
    def fused_head(self) -> bool:
        """Whether its loss goes through TRL's fused LM head (SFTTrainer's), which never holds a whole batch's
        logits: the estimate counts a tile of them instead."""
        return self.trainer == "sft"

    @classmethod
    def help(cls, name: str) -> str:
        """A field's help."""
        return next(f.metadata["help"] for f in fields(cls) if f.name == name)

    def public(self) -> dict[str, Any]:
        """What the page reads of the method (GET /api/web/defaults)."""
        return {"name": self.name, "label": self.label, "summary": self.summary, "formats": list(self.formats),
                "defaults": dict(self.defaults), "main_metric": self.main_metric}


def _check_kto(cfg: JobConfig) -> None:
    if cfg.batch_size < 2:
        raise ValueError("batch_size: method 'kto' needs a batch_size of at least 2 (its KL estimate pairs each "
                         "row with another row of the same batch)")


def _check_grpo(cfg: JobConfig) -> None:
    entries = cfg.reward_functions
    if not entries:
        raise ValueError("reward_functions: method 'grpo' needs at least one reward function: a built-in ("
                         f"{', '.join(BUILTIN_REWARDS)}), path/to/file.py:function or model:path/to/reward-model")
    for entry in entries:
        if entry not in BUILTIN_REWARDS and not USER_REWARD.match(entry) and not MODEL_REWARD.match(entry):
            raise ValueError(f"reward_functions: {entry!r} is neither a built-in ({', '.join(BUILTIN_REWARDS)}), "
                             "path/to/file.py:function nor model:path/to/reward-model (a reward job's output)")
    names = [reward_name(e) for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"reward_functions: {', '.join(twice)} named twice (each reward is logged by its name)")
    if cfg.reward_weights is not None and len(cfg.reward_weights) != len(entries):
        raise ValueError(f"reward_weights: {len(cfg.reward_weights)} weights for {len(entries)} reward functions")
    if "format_regex" in entries:
        if not cfg.reward_format_pattern:
            raise ValueError("reward_format_pattern: reward function format_regex needs a pattern")
        try:
            re.compile(cfg.reward_format_pattern)
        except re.error as exc:
            raise ValueError(f"reward_format_pattern: not a regular expression: {exc}") from None
    elif cfg.reward_format_pattern:
        raise ValueError("reward_format_pattern: applies to reward function format_regex, which is not in "
                         "reward_functions")
    if (cfg.batch_size * cfg.gradient_accumulation_steps) % cfg.num_generations:
        raise ValueError(
            f"num_generations: batch_size × gradient_accumulation_steps "
            f"({cfg.batch_size * cfg.gradient_accumulation_steps}) must be a multiple of num_generations "
            f"({cfg.num_generations}) for method 'grpo' (each prompt's completions share one batch)")


def _check_reward(cfg: JobConfig) -> None:
    if cfg.sample_prompts:
        raise ValueError("sample_prompts: method 'reward' trains a score head, which writes no replies; its held-out "
                         "pairs are scored before and after instead")


_PAIRS = ("prompt", "chosen", "rejected")
_SEQUENCE_OPTIONS = ("packing", "padding_free")
_REWARD_OPTIONS = ("num_generations", "max_completion_length", "generation_temperature", "kl_beta",
                   "reward_functions", "reward_weights", "reward_format_pattern")

METHOD_SPECS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("sft", "SFT", "supervised fine-tuning on examples", "sft",
               formats=("alpaca", "sharegpt", "messages", "prompt_completion", "text"),
               options=(*_SEQUENCE_OPTIONS, "train_on_completions"), aliases=("supervised",),
               modalities=("text", "image", "audio"), modality_trainers={"audio": "seq2seq"},
               openai_type="supervised", openai_file=OpenAIFile("chat", "messages")),
    MethodSpec("dpo", "DPO", "preference pairs: chosen over rejected", "dpo", formats=("preference",),
               modalities=("text", "image"),
               options=("beta", "dpo_loss_type"), mappings=(_PAIRS,), main_metric="rewards/margins",
               rows_per_example=2, openai_type="dpo", openai_file=OpenAIFile("preference", "preference")),
    MethodSpec("orpo", "ORPO", "preference pairs, no reference model", "orpo", formats=("preference",),
               options=("beta",), mappings=(_PAIRS,), main_metric="rewards/margins", rows_per_example=2),
    # TRL's KTOTrainer splits each preference pair into a desirable and an undesirable row, each its own example
    MethodSpec("kto", "KTO", "replies labelled good or bad", "kto", formats=("unpaired", "preference"),
               options=("beta", "desirable_weight", "undesirable_weight"),
               mappings=(("prompt", "completion", "label"), _PAIRS), main_metric="rewards/margins",
               check=_check_kto),
    MethodSpec("grpo", "GRPO", "reward functions score sampled replies", "grpo", formats=("prompt_only",),
               options=_REWARD_OPTIONS, mappings=(("prompt",),), optional_mappings=("answer",),
               main_metric="reward", check=_check_grpo, openai_type="reinforcement"),
    MethodSpec("pretrain", "Pretrain", "continued pretraining on plain text", "sft", formats=("text",),
               options=_SEQUENCE_OPTIONS, mappings=(("text",),), defaults={"packing": True},
               aliases=("continued_pretraining", "pretraining", "cpt"), openai_type="supervised"),
    # TRL's RewardTrainer: a score head on the base (num_labels=1), trained so chosen scores above rejected; it
    # logs accuracy (the share of pairs so ordered) and margin
    MethodSpec("reward", "Reward model", "preference pairs: score chosen above rejected", "reward",
               formats=("preference",), mappings=(_PAIRS,), main_metric="accuracy", rows_per_example=2,
               aliases=("reward_model", "rm"), check=_check_reward),
)}

METHOD_ALIASES = {alias: spec.name for spec in METHOD_SPECS.values() for alias in spec.aliases}

# Views of the registry, by the names other modules have read them by.
METHODS: tuple[str, ...] = tuple(METHOD_SPECS)
# The dataset formats each method trains on ("auto" picks one from the columns).
METHOD_FORMATS: dict[str, tuple[str, ...]] = {name: spec.formats for name, spec in METHOD_SPECS.items()}
# JobConfig options that mean something for some methods only. Setting one (to other than its default)
# for another method is a validation error naming both.
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {}
for _spec in METHOD_SPECS.values():
    for _option in _spec.options:
        METHOD_OPTIONS.setdefault(_option, ())
        METHOD_OPTIONS[_option] += (_spec.name,)
# The metric each method is watched by (CLI progress bar, the page's method chart); sft/pretrain: the loss.
METHOD_MAIN_METRIC: dict[str, str] = {n: s.main_metric for n, s in METHOD_SPECS.items() if s.main_metric}


def method_spec(name: str) -> MethodSpec:
    return METHOD_SPECS[name]


# The OpenAI fine-tuning API's method types that POST /v1/fine_tuning/jobs starts (MethodSpec.openai_file).
OPENAI_TYPES: tuple[str, ...] = tuple(s.openai_kind for s in METHOD_SPECS.values() if s.openai_file is not None)


def openai_method(openai_type: str) -> tuple[MethodSpec, OpenAIFile]:
    """The method a POST /v1/fine_tuning/jobs of this method.type trains, and the file it trains from (KeyError:
    a type the API does not start)."""
    for spec in METHOD_SPECS.values():
        if spec.openai_file is not None and spec.openai_kind == openai_type:
            return spec, spec.openai_file
    raise KeyError(openai_type)
