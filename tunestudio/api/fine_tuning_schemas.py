"""The request and response bodies of OpenAI's fine-tuning jobs API (/v1/fine_tuning/jobs): what a create asks
for, and the job object every route answers with. api/fine_tuning.py turns one into a JobConfig and a studio job
into the other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tunestudio.api.errors import ApiError
from tunestudio.config import MethodSpec, OpenAIFile, openai_method

OpenAIStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"]


# --- the request: hyperparameters and method ---------------------------------------------------------------
Auto = Literal["auto"]


class HyperparametersIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_epochs: Auto | Annotated[int, Field(ge=1, le=10_000)] | None = None
    batch_size: Auto | Annotated[int, Field(ge=1, le=65_536)] | None = None
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=5000)] | None = None
    beta: Auto | Annotated[float, Field(gt=0, le=100)] | None = None


class MethodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hyperparameters: HyperparametersIn | None = None


class MethodIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["supervised", "dpo"]  # OpenAI's words; the methods they train: config.OPENAI_TYPES
    supervised: MethodConfig | None = None
    dpo: MethodConfig | None = None


class CreateJob(BaseModel):
    """POST /v1/fine_tuning/jobs. `integrations` are refused (none runs here); `metadata` is not kept."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=1000)
    training_file: str = Field(min_length=1, max_length=300)
    validation_file: str | None = Field(default=None, max_length=300)
    suffix: str | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    method: MethodIn | None = None
    hyperparameters: HyperparametersIn | None = None
    integrations: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None

    @property
    def kind(self) -> Literal["supervised", "dpo"]:
        return self.method.type if self.method else "supervised"

    @property
    def trains(self) -> tuple[MethodSpec, OpenAIFile]:
        """The studio method this request's method type trains, and the rows and format of its files."""
        return openai_method(self.kind)

    def hyper(self) -> HyperparametersIn:
        """The hyperparameters asked for: the method's, or the older top-level ones (not both)."""
        inner = getattr(self.method, self.kind) if self.method else None
        given = inner.hyperparameters if inner is not None else None
        if given is not None and self.hyperparameters is not None:
            raise ApiError(400, "invalid_request", "give hyperparameters in method (method."
                           f"{self.kind}.hyperparameters) or at the top level, not both", field="hyperparameters")
        return given or self.hyperparameters or HyperparametersIn()


# --- the job object ------------------------------------------------------------------------------------------
class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class Hyperparameters(BaseModel):
    n_epochs: int | float
    batch_size: int
    learning_rate_multiplier: float
    beta: float | None = None


class MethodSettings(BaseModel):
    hyperparameters: Hyperparameters


class MethodOut(BaseModel):
    type: str
    supervised: MethodSettings | None = None
    dpo: MethodSettings | None = None


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None
    model: str
    fine_tuned_model: str | None
    organization_id: str = "tunestudio"
    status: OpenAIStatus
    error: JobError | None
    hyperparameters: Hyperparameters
    method: MethodOut
    training_file: str
    validation_file: str | None
    result_files: list[str]
    trained_tokens: int | None
    seed: int
    user_provided_suffix: str | None
    estimated_finish: int | None
    integrations: list[Any] = Field(default_factory=list)
    metadata: dict[str, str] | None = None


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool
