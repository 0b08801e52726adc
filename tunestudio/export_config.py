"""`ExportConfig`: what one export of a finished job should produce. Pure data, no I/O.

Targets:
- `merged`: the base model with the adapter merged in (a full fine-tune: the
  model itself), as safetensors with its tokenizer and chat template, in `dtype`.
- `gguf`: one GGUF file in `quantization`, with an Ollama `Modelfile` beside it.
- `gguf-lora`: the adapter alone as a GGUF LoRA (`quantization` f32/f16/bf16/q8_0).
- `hub`: the merged model or the adapter (`hub_content`) pushed to `repo`.

The hub token is a secret: it is never part of `public_dict()`, so it is never
stored, logged or shown; the worker receives it through its separate channel.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from tunestudio.config.vocabulary import PathText

__all__ = [
    "EXPORT_SECRET_FIELDS",
    "GGUF_QUANTIZATIONS",
    "ExportConfig",
    "ExportDtype",
    "ExportOptions",
    "ExportTarget",
    "hub_repo_problem",
]

ExportTarget = Literal["merged", "gguf", "gguf-lora", "hub"]
ExportDtype = Literal["fp32", "bf16", "fp16"]
# f16/bf16/q8_0 (and f32) come from llama.cpp's Python converter; q4_k_m needs its llama-quantize binary.
GGUF_QUANTIZATIONS = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
LORA_QUANTIZATIONS = ("f32", "f16", "bf16", "q8_0")
EXPORT_SECRET_FIELDS = ("hf_token",)
# One part of a hub repository id (the hub's rule, huggingface_hub's validate_repo_id): 1-96 ASCII letters, digits,
# '-', '_' and '.', neither '.' nor '-' first or last.
_HUB_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?")


def hub_repo_problem(repo: str) -> str | None:
    """Why `repo` is not a hub repository id ('name' or 'owner/name'), or None when it is one."""
    parts = repo.split("/")
    if len(parts) > 2:
        return "a repository is 'name' or 'owner/name', with at most one '/'"
    if not all(_HUB_PART.fullmatch(part) for part in parts):
        return ("each part of 'owner/name' is 1 to 96 letters, digits, '-', '_' or '.', and does not start or end "
                "with '.' or '-'")
    if ".." in repo or "--" in repo:
        return "'..' and '--' are not allowed"
    if repo.endswith(".git"):
        return "a name may not end in '.git'"
    return None


class ExportOptions(BaseModel):
    """What a user asks for: the export's target and its settings (the API's request body, the CLI's options)."""

    model_config = ConfigDict(extra="forbid")

    target: ExportTarget
    quantization: str | None = Field(default=None, description="gguf: f32, f16, bf16, q8_0, q4_k_m (default f16).")
    dtype: ExportDtype = Field(default="fp32", description="merged (and hub merged): the saved weights' type.")
    output_dir: PathText | None = Field(
        default=None, description="Where the files go; default: inside the job's output.")
    checkpoint: PathText | None = Field(
        default=None, description="A checkpoint-N folder (inside the job's output, or a path) instead of the end."
    )
    repo: str | None = Field(default=None, description="hub: the repository, 'name' or 'owner/name'.")
    private: bool = True
    hub_content: Literal["adapter", "merged"] = Field(
        default="adapter", description="hub: push the adapter (small) or the merged model."
    )
    hf_token: SecretStr | None = Field(default=None, description="hub: a token with write access; never stored.")

    @model_validator(mode="after")
    def _target_fields(self) -> ExportOptions:
        allowed: dict[str, tuple[str, ...]] = {"gguf": GGUF_QUANTIZATIONS, "gguf-lora": LORA_QUANTIZATIONS}
        if self.quantization is not None:
            if self.target not in allowed:
                raise ValueError(f"quantization applies to gguf and gguf-lora, not to {self.target}")
            if self.quantization not in allowed[self.target]:
                raise ValueError(
                    f"quantization {self.quantization!r} is not one of {', '.join(allowed[self.target])} "
                    f"for {self.target}"
                )
        if self.target == "hub":
            if not self.repo:
                raise ValueError("repo: the hub target needs a repository name ('name' or 'owner/name')")
            if (problem := hub_repo_problem(self.repo)) is not None:
                raise ValueError(f"repo {self.repo!r}: {problem} (the hub's rule for 'owner/name')")
        elif self.repo is not None:
            raise ValueError(f"repo applies to the hub target only, not to {self.target}")
        return self


class ExportConfig(ExportOptions):
    """The options plus what the manager fills in: the job they export and its output folder."""

    source_job_id: str | None = Field(default=None, description="The job whose result is exported (for the record).")
    source_dir: PathText = Field(min_length=1, description="The finished job's output folder.")

    @property
    def resolved_quantization(self) -> str | None:
        if self.target in ("gguf", "gguf-lora"):
            return self.quantization or "f16"
        return None

    def resolved_output_dir(self) -> str:
        """Where the export's files go: `output_dir`, else `<source_dir>/exports/<target>[-<quantization>]`."""
        if self.output_dir:
            return self.output_dir
        name = self.target if self.target != "merged" else f"merged-{self.dtype}"
        if self.resolved_quantization:
            name += f"-{self.resolved_quantization}"
        return f"{self.source_dir.rstrip('/')}/exports/{name}"

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data without the token (safe to store or show)."""
        return self.model_dump(mode="json", exclude=set(EXPORT_SECRET_FIELDS))

    def secrets(self) -> dict[str, str]:
        return {"hf_token": self.hf_token.get_secret_value()} if self.hf_token is not None else {}

    @classmethod
    def from_parts(cls, public: dict[str, Any], secrets: dict[str, str] | None = None) -> ExportConfig:
        return cls.model_validate({**public, **(secrets or {})})
