"""The parts a `JobConfig` is composed of, one pydantic model per concern: here what is trained (model, data,
optimisation, adapters, media, method); config/reporting.py has what a job reports and keeps (logging, outputs,
early stopping). The checks a part of a job needs on its own are in job.py beside JobConfig.

Each field carries what the page shows of it (TRL's way, help on the field): `title` is its label,
`json_schema_extra` its group (vocabulary.FIELD_GROUPS) and, where the page says it otherwise than the
description, its one line of `help`; GET /api/web/defaults sends them (api/routes/web.form_fields).

Pure, like JobConfig: no validator touches the filesystem.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from tunestudio.config.vocabulary import (
    MAX_ROWS,
    MAX_STEPS,
    DpoLoss,
    FormatType,
    LrScheduler,
    MappingTarget,
    Method,
    Modality,
    Optimizer,
    PathText,
    TrainingType,
)


class ModelPart(BaseModel):
    """Which model, how it is loaded."""

    model_name: PathText = Field(
        min_length=1, description="Local model folder or a hub model id.", title="Model",
        json_schema_extra={"group": "model"},
    )
    training_type: TrainingType = Field(
        default=TrainingType.lora, title="Weights to train",
        json_schema_extra={"group": "model", "choice_labels": {  # each choice's label and one line
            "lora": ["LoRA", "small adapters on a frozen model"],
            "qlora": ["QLoRA", "LoRA on 4-bit weights (bitsandbytes; CPU or GPU)"],
            "full": ["Full", "every weight is trained"]}},
    )
    load_in_4bit: bool = Field(
        default=False, description="4-bit weights; true exactly when training_type is qlora.", title="4-bit weights",
        json_schema_extra={"group": "model"},
    )
    max_seq_length: int = Field(
        default=2048, ge=8, le=1_048_576, title="Max sequence length", json_schema_extra={"group": "data"},
    )
    hf_token: SecretStr | None = Field(
        default=None, title="Hub token",
        description="For gated models and datasets; used for this job only, never stored.",
        json_schema_extra={"group": "data"},
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        default="auto", title="Precision", description="auto: bf16 where it pays, else fp32.",
        json_schema_extra={"group": "optimisation"},
    )

    @field_validator("model_name")
    @classmethod
    def _model_name_stripped(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("model_name is empty")
        return value


def unique_datasets(value: list[str]) -> list[str]:
    """local_datasets with no entry twice (compared as written, normalised; no filesystem)."""
    # Each entry's rows are read, so a path listed twice trains on its rows twice (256 copies of a 400-row
    # file made 102,400 rows). Compared as written, normalised ("./a.jsonl" is "a.jsonl"); no filesystem.
    seen: dict[str, str] = {}
    for raw in value:
        key = str(PurePath(raw)) if raw else raw
        if key in seen:
            first = f" (first as {seen[key]!r})" if seen[key] != raw else ""
            raise ValueError(f"{raw!r} is listed twice{first}; list each dataset once (each entry's rows are "
                             "read, so a second entry would train on them twice)")
        seen[key] = raw
    return value


class DataPart(BaseModel):
    """Which rows, in which format, and the held-out split."""

    hf_dataset: PathText | None = Field(
        default=None, title="Hub dataset id", description="Read when the job starts (from the cache or the hub).",
        json_schema_extra={"group": "data"},
    )
    local_datasets: list[PathText] = Field(
        default_factory=list, max_length=256, title="Dataset files", json_schema_extra={"group": "data"},
    )
    format_type: FormatType = Field(default="auto", title="Format", json_schema_extra={"group": "data"})
    subset: str | None = Field(
        default=None, title="Hub subset",
        description="The configuration of a hub dataset that has several (e.g. 'main').",
        json_schema_extra={"group": "data"},
    )
    train_split: str = Field(
        default="train", title="Training split", description="Which split of the dataset to train on.",
        json_schema_extra={"group": "data"},
    )
    eval_split: PathText | None = Field(
        default=None, title="Evaluation split or file", description="A split name (test) or a file (data/val.jsonl).",
        json_schema_extra={"group": "evaluation"},
    )
    eval_steps: float = Field(
        default=0.0, ge=0, le=MAX_STEPS, description="0: no eval; below 1: a fraction of the total steps; else steps.",
        title="Eval every", json_schema_extra={"group": "evaluation"},
    )
    dataset_slice_start: int | None = Field(
        default=None, ge=0, le=MAX_ROWS, description="First row kept (inclusive).", title="First row",
        json_schema_extra={"group": "data", "help": "Keep rows from this one (0-based, inclusive)."},
    )
    dataset_slice_end: int | None = Field(
        default=None, ge=0, le=MAX_ROWS, description="Last row kept (inclusive).", title="Last row",
        json_schema_extra={"group": "data", "help": "Keep rows up to this one (inclusive)."},
    )
    custom_format_mapping: dict[str, MappingTarget] | None = Field(
        default=None, description="Column → chat role (sft), or column → field of the method's format (others).",
        title="Custom format mapping (JSON)", examples=[{"question": "user", "answer": "assistant"}],
        json_schema_extra={"group": "data",
                           "help": 'Which column plays which role, e.g. {"question": "user", "answer": "assistant"}.'},
    )
    dedupe: Literal["off", "exact", "near"] = Field(
        default="off",
        description="Duplicate rows removed before the eval split, the first of each kept: exact (the same after "
                    "normalising whitespace), or near (also rows whose word 3-grams, casefolded and without "
                    "punctuation, overlap by an estimated Jaccard of 0.8 or more: MinHash LSH).",
        title="Remove duplicates",
        json_schema_extra={"group": "data", "help": "Before the eval split: exact (same after normalising "
                                                    "whitespace) or near (also ≥ 0.8 similar word 3-grams); the "
                                                    "first of each is kept. The dataset report counts them."},
    )
    reasoning: Literal["auto", "keep", "mask", "drop"] = Field(
        default="auto",
        description="What becomes of an assistant turn's reasoning (reasoning_content, a thinking field, or "
                    "<think>...</think> opening its content): keep (trained on), mask (in the context, no loss), "
                    "drop (stripped); auto: what the model's chat template does (keep where it renders reasoning, "
                    "as it renders it; drop where it does not).",
        title="Reasoning traces",
        json_schema_extra={"group": "data", "help": "keep: train on the thinking; mask: the model sees it but is "
                                                    "not trained on it; drop: strip it; auto: as the model's chat "
                                                    "template renders it.",
                           "choice_labels": {"auto": ["Auto", "as the chat template renders it"],
                                             "keep": ["Keep", "trained on"],
                                             "mask": ["Mask", "in context, no loss"],
                                             "drop": ["Drop", "stripped"]}},
    )
    eval_fraction: float | None = Field(
        default=None, gt=0, lt=1,
        description="Without eval_split: the share of the rows held out for evaluation (eval_steps > 0), at least "
                    "one, and one left to train; seeded by random_seed. null: 5%, 16 to 128 rows, none under 32.",
        title="Held-out share",
        json_schema_extra={"group": "evaluation",
                           "help": "Without an evaluation split: the share of rows held out (0.1 = 10%). Empty: 5%, "
                                   "16 to 128 rows."},
    )
    held_out_rows: PathText | None = Field(
        default=None,
        description="The held_out.json an earlier job wrote in its output folder: hold out exactly its rows again "
                    "(a resume and a clone do), matched by content; the job fails naming the rows its data no "
                    "longer has. null: a new split, seeded by random_seed. Needs eval_steps > 0 and no eval_split.",
        title="Held-out rows of a job",
        json_schema_extra={"group": "evaluation",
                           "help": "A job's held_out.json: hold out exactly its rows again (Clone to form sets it). "
                                   "Empty: a new seeded split."},
    )

    @field_validator("local_datasets")
    @classmethod
    def _each_dataset_once(cls, value: list[str]) -> list[str]:
        return unique_datasets(value)

    @field_validator("eval_steps")
    @classmethod
    def _whole_steps(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("eval_steps of 1 or more is a number of steps and must be whole")
        return value


class OptimisationPart(BaseModel):
    """The schedule, the optimizer, and the ranks that share the work."""

    num_epochs: float = Field(default=3.0, gt=0, le=10_000, title="Epochs", json_schema_extra={"group": "optimisation"})
    learning_rate: float = Field(
        default=2e-4, gt=0, le=1.0, title="Learning rate", json_schema_extra={"group": "optimisation"},
    )
    batch_size: int = Field(default=2, ge=1, le=65_536, title="Batch size", json_schema_extra={"group": "optimisation"})
    gradient_accumulation_steps: int = Field(
        default=4, ge=1, le=65_536, title="Gradient accumulation", json_schema_extra={"group": "optimisation"},
    )
    warmup_steps: int | None = Field(
        default=None, ge=0, le=MAX_STEPS, title="Warm-up steps",
        description="Steps of rising learning rate at the start.", json_schema_extra={"group": "optimisation"},
    )
    warmup_ratio: float | None = Field(
        default=None, ge=0, lt=1, title="Warm-up ratio", description="Or: the fraction of all steps spent warming up.",
        json_schema_extra={"group": "optimisation"},
    )
    max_steps: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="0: train for num_epochs.", title="Max steps",
        json_schema_extra={"group": "optimisation"},
    )
    save_steps: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="0: no periodic checkpoints.", title="Checkpoint every",
        json_schema_extra={"group": "logging", "help": "Steps between checkpoints; 0: only at a stop and the end."},
    )
    logging_steps: int = Field(
        default=1, ge=1, le=MAX_STEPS, title="Log every (steps)", json_schema_extra={"group": "logging"},
    )
    weight_decay: float = Field(
        default=0.01, ge=0, le=10, title="Weight decay", description="L2-style shrinkage of the weights each step.",
        json_schema_extra={"group": "optimisation"},
    )
    random_seed: int = Field(
        default=3407, ge=0, le=2**32 - 1, title="Random seed", description="The same seed and data give the same run.",
        json_schema_extra={"group": "optimisation"},
    )
    packing: bool = Field(
        default=False, title="Pack short rows",
        description="Join short rows into full-length sequences: faster, same tokens.",
        json_schema_extra={"group": "data"},
    )
    padding_free: bool | Literal["auto"] = Field(
        default="auto",
        description="Batches as one flattened row with position ids instead of padded rows (the loss is the same). "
        "auto: per batch, whichever costs less for this model (always with flash attention).",
        title="Padding-free batches",
        json_schema_extra={"group": "data", "help": "A batch as one row without padding; the loss is the same. "
                                                    "auto: per batch, whichever costs less."},
    )
    optim: Optimizer = Field(
        default="adamw_torch_fused",  # TrainingArguments' default; on full fine-tunes its step is faster
        title="Optimizer", description="The update rule; adamw_torch_fused (the default) is AdamW in one kernel.",
        json_schema_extra={"group": "optimisation"},
    )
    lr_scheduler_type: LrScheduler = Field(
        default="linear", title="LR schedule", description="How the learning rate changes over the run.",
        json_schema_extra={"group": "optimisation"},
    )

    num_processes: int = Field(
        default=1, ge=1, le=256,
        description="Data-parallel ranks; above 1 the job runs under torchrun (gloo on a CPU, nccl on GPUs). "
        "batch_size is per rank: the global batch is batch_size x gradient_accumulation_steps x num_processes.",
        title="Num Processes", json_schema_extra={"group": "other"},
    )



class AdapterPart(BaseModel):
    """LoRA's shape and what is trained."""

    lora_r: int = Field(default=16, ge=1, le=4096, title="LoRA rank (r)", json_schema_extra={"group": "lora"})
    lora_alpha: int = Field(default=16, ge=1, le=65_536, title="LoRA alpha", json_schema_extra={"group": "lora"})
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, title="LoRA dropout", json_schema_extra={"group": "lora"})
    target_modules: list[str] | None = Field(
        default=None, max_length=1024, description="Module names to adapt; unset means every linear layer.",
        title="Target modules (one a line; empty: all linear)",
        json_schema_extra={"group": "lora", "help": "Module names to adapt, one a line; empty: every linear layer."},
    )
    gradient_checkpointing: bool | Literal["auto", "unsloth"] = Field(
        default="auto",
        description="Recompute activations in backward to save memory (slower). auto: on only when the job's "
        "estimated memory would not fit in what the machine has free.",
        title="Activation checkpointing",
        json_schema_extra={"group": "optimisation",
                           "help": "Recompute activations to save memory; slower (3.5× on CPU). auto: on only if "
                                   "the job would not fit."},
    )
    use_rslora: bool = Field(
        default=False, title="Rank-stabilised LoRA", description="Scale adapters by alpha/√r instead of alpha/r.",
        json_schema_extra={"group": "lora"},
    )
    use_loftq: bool = Field(
        default=False, title="LoftQ initialisation",
        description="Start the adapters from a quantisation-aware estimate.", json_schema_extra={"group": "lora"},
    )
    train_on_completions: bool = Field(
        default=False, title="Train on answers only", description="Compute the loss on the completion, not the prompt.",
        json_schema_extra={"group": "data"},
    )



class SeedMediaPart(BaseModel):
    """The seed's vision and audio fields: they name the job's kind of data (`modality`, worker/modalities/)."""

    is_dataset_image: bool = Field(
        default=False, title="Image dataset",
        description="The rows hold images and the model is a vision-language model (auto-detected from the data "
                    "when left off; set, a dataset without images is refused).",
        json_schema_extra={"group": "media"},
    )
    finetune_vision_layers: bool = Field(
        default=True, title="Train vision layers",
        description="Image jobs: adapters (or, full, training) on the vision tower and its projector.",
        json_schema_extra={"group": "media"},
    )
    finetune_language_layers: bool = Field(
        default=True, title="Train language layers",
        description="Image jobs: adapters (or, full, training) on the language model.",
        json_schema_extra={"group": "media"},
    )
    image_splitting: bool = Field(
        default=False, title="Split large images",
        description="Image jobs: let the processor cut a large image into tiles plus a global view (Idefics3/"
                    "SmolVLM: hundreds to a thousand tokens an image); off, each image is one view.",
        json_schema_extra={"group": "media"},
    )
    max_image_size: int | None = Field(
        default=None, ge=28, le=4096, title="Longest image side (px)",
        description="Image jobs: images are resized to at most this many pixels on their longest side (Qwen2-VL's "
                    "family: at most its square in pixels); empty: the vision tower's own input size.",
        json_schema_extra={"group": "media"},
    )
    is_dataset_audio: bool = Field(
        default=False, title="Audio dataset",
        description="Speech to text: the rows are recordings with their transcripts, and the model a speech "
                    "encoder-decoder (Whisper's family: AutoModelForSpeechSeq2Seq and its processor).",
        json_schema_extra={"group": "media"},
    )
    audio_language: str | None = Field(
        default=None, min_length=2, max_length=32, pattern=r"^[A-Za-z][A-Za-z -]*$", title="Spoken language",
        description="Audio jobs: the language of the recordings, as Whisper names it (en, fr, english, ...); empty: "
                    "English for a multilingual model.",
        json_schema_extra={"group": "media"},
    )
    audio_task: Literal["transcribe", "translate"] = Field(
        default="transcribe", title="Speech task",
        description="Audio jobs: transcribe (text in the spoken language) or translate (English text).",
        json_schema_extra={"group": "media"},
    )
    finetune_attention_modules: bool = Field(
        default=True, title="Adapt attention layers", description="Put adapters on the attention projections.",
        json_schema_extra={"group": "lora"},
    )
    finetune_mlp_modules: bool = Field(
        default=True, title="Adapt MLP layers", description="Put adapters on the feed-forward layers.",
        json_schema_extra={"group": "lora"},
    )

    @property
    def modality(self) -> Modality:
        """The job's kind of data, from the seed's flags: the worker's modality object of that name runs it."""
        return "image" if self.is_dataset_image else "audio" if self.is_dataset_audio else "text"


class MethodPart(BaseModel):
    """The training method (methods.METHOD_SPECS) and the options of some methods only."""

    method: Method = Field(
        default="sft",
        description="sft: supervised fine-tuning; dpo / orpo / kto: preference tuning; grpo: reinforcement "
                    "learning with reward functions; pretrain: continued pretraining on plain text.",
        title="Training method", json_schema_extra={"group": "method"},
    )
    beta: float = Field(
        default=0.1, gt=0, le=100,
        description="DPO, KTO: how far the model may move from where it started (higher: less); "
                    "ORPO: the weight of the odds-ratio term (λ).",
        title="Beta (β)", json_schema_extra={"group": "method"},
    )
    dpo_loss_type: DpoLoss = Field(
        default="sigmoid", description="DPO: the loss (sigmoid is the paper's).", title="DPO loss",
        json_schema_extra={"group": "method"},
    )
    desirable_weight: float = Field(
        default=1.0, gt=0, le=100, description="KTO: weight of desirable rows' loss.", title="Desirable rows' weight",
        json_schema_extra={"group": "method"},
    )
    undesirable_weight: float = Field(
        default=1.0, gt=0, le=100, description="KTO: weight of undesirable rows' loss.",
        title="Undesirable rows' weight", json_schema_extra={"group": "method"},
    )
    num_generations: int = Field(
        default=4, ge=2, le=256,
        description="GRPO: completions per prompt; batch_size × gradient_accumulation_steps must be a multiple.",
        title="Completions per prompt", json_schema_extra={"group": "method"},
    )
    max_completion_length: int = Field(
        default=128, ge=1, le=131_072, description="GRPO: most tokens generated per completion.",
        title="Max completion length", json_schema_extra={"group": "method"},
    )
    generation_temperature: float = Field(
        default=1.0, gt=0, le=10, description="GRPO: sampling temperature.", title="Sampling temperature",
        json_schema_extra={"group": "method"},
    )
    kl_beta: float = Field(
        default=0.0, ge=0, le=100, description="GRPO: KL penalty against the starting model; 0 loads no reference.",
        title="KL penalty (β)", json_schema_extra={"group": "method"},
    )
    reward_functions: list[PathText] = Field(
        default_factory=list, max_length=16,
        description="GRPO: built-in names (exact_match, contains_answer, numeric_match, format_regex, "
                    "length_penalty) or path/to/file.py:function (your code, run inside the worker).",
        title="Reward functions (one a line)", json_schema_extra={"group": "method"},
    )
    reward_weights: list[Annotated[float, Field(ge=-1000, le=1000)]] | None = Field(
        default=None, max_length=16, description="GRPO: one weight per reward function; unset: 1 each.",
        title="Reward weights (one a line)", json_schema_extra={"group": "method"},
    )
    reward_format_pattern: str | None = Field(
        default=None, max_length=2000,
        description="GRPO: the regular expression format_regex rewards (re.search; anchor with ^...$).",
        title="Format pattern (regex)", json_schema_extra={"group": "method"},
    )
