"""`ReportSpec`: what the dataset report reads of a job (`tunestudio data inspect`, `POST /api/datasets/report`).

The report reads the rows as a job does, so it takes the job's own fields (their bounds and defaults are the
parts', config/parts.py) and the job's own checks (`check_rows`, `check_options`, and DataSpec's on the
method and format); a model only when token lengths are wanted. Pure, like JobConfig: no filesystem.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from tunestudio.config.job import DataSpec, check_options, check_rows
from tunestudio.config.parts import AdapterPart, DataPart, ModelPart, OptimisationPart, SeedMediaPart
from tunestudio.config.vocabulary import PathText

__all__ = ["ReportSpec"]


class ReportSpec(DataSpec):
    """The rows a job would read (local files, or a `datasets` dataset: hf_dataset), how it slices, measures,
    deduplicates and splits them. `held_out` stands for a job that evaluates (eval_steps > 0): without an
    eval_split, it holds rows out, which eval_fraction sizes or held_out_rows names. No model_name: no token
    lengths (no tokenizer is loaded). Rows with images are read as an image job reads them (detected, as a job
    detects them); a model then measures them with its processor."""

    hf_dataset: str | None = DataPart.model_fields["hf_dataset"]
    subset: str | None = DataPart.model_fields["subset"]
    model_name: PathText | None = Field(default=None, min_length=1, description="The tokenizer that measures the "
                                        "rows (a local model folder or a hub id); unset: no token lengths.")
    max_seq_length: int = ModelPart.model_fields["max_seq_length"]
    eval_split: PathText | None = Field(default=None, description="An eval file (a path) or a split name (among "
                                        "the local files, or of hf_dataset), as JobConfig's.")
    held_out: bool = Field(default=False, description="Without eval_split: the rows a job with eval_steps > 0 holds "
                                                      "out (seeded by random_seed).")
    eval_fraction: float | None = DataPart.model_fields["eval_fraction"]
    held_out_rows: str | None = DataPart.model_fields["held_out_rows"]
    random_seed: int = OptimisationPart.model_fields["random_seed"]
    dataset_slice_start: int | None = DataPart.model_fields["dataset_slice_start"]
    dataset_slice_end: int | None = DataPart.model_fields["dataset_slice_end"]
    train_on_completions: bool = AdapterPart.model_fields["train_on_completions"]
    dedupe: Literal["off", "exact", "near"] = DataPart.model_fields["dedupe"]
    reasoning: Literal["auto", "keep", "mask", "drop"] = DataPart.model_fields["reasoning"]
    # image data: how the model's processor sizes the images, so their tokens are counted as the job's
    image_splitting: bool = SeedMediaPart.model_fields["image_splitting"]
    max_image_size: int | None = SeedMediaPart.model_fields["max_image_size"]
    # No secret travels with a report: a gated tokenizer or dataset is read with the environment's hub login
    # (HF_TOKEN, `hf auth login`), as huggingface_hub does when no token is passed.
    hf_token: ClassVar[None] = None

    @field_validator("model_name")
    @classmethod
    def _model_name_stripped(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("model_name is empty; leave it unset for a report without token lengths")
        return value.strip() if value is not None else None

    @model_validator(mode="after")
    def _as_a_job(self) -> ReportSpec:
        check_options(self, self.method)
        check_rows(self, holds_out=self.held_out, to_hold_out="set held_out (as a job with eval_steps above 0)")
        return self
