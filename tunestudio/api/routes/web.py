"""/api/web/*: what the web page needs beyond the job API: its defaults, the form's fields, a dataset preview.

The form is built from `JobConfig`'s own schema, so its defaults and limits are
the ones the API enforces (defaults live in one place).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tunestudio import paths
from tunestudio.api.deps import SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.config import (
    FIELD_GROUPS,
    METHOD_FORMATS,
    METHOD_OPTIONS,
    METHOD_SPECS,
    SECRET_FIELDS,
    DataSpec,
    FormatType,
    JobConfig,
    MappingTarget,
    Method,
    format_validation_error,
    summary,
)
from tunestudio.settings import BUNDLED_DATASETS, EMBEDDED_MODEL, Settings

router = APIRouter(prefix="/api/web", tags=["web page"])

BUNDLED_DATASET = BUNDLED_DATASETS / "alpaca.jsonl"


class FormField(BaseModel):
    """One JobConfig field, as a form control needs it."""

    name: str
    kind: str  # integer | number | boolean | string | secret | choice | list | mapping
    default: Any = None
    required: bool = False
    nullable: bool = False
    choices: list[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    description: str | None = None
    title: str = Field(description="The page's label for it (its Field's title).")
    group: str = Field(default="other", description="Where the page puts it: a key of `groups`.")
    help: str | None = Field(default=None, description="The page's one line of help: its own, or the description.")
    placeholder: str | None = Field(default=None, description="An example shown in the empty control (its first).")
    choice_labels: dict[str, list[str]] | None = Field(
        default=None, description="A choice's label and one line, by its value (training_type).")
    hidden: bool = Field(default=False, description="Not shown: a field the page has no use for yet.")
    methods: list[str] | None = Field(default=None, description="The training methods it applies to; None: all.")


class Defaults(BaseModel):
    model_name: str = Field(description="The embedded tiny model's folder; empty while it is not built.")
    model_ready: bool = Field(description="Whether that folder holds a built model.")
    model_hint: str
    dataset: str = Field(description="The bundled dataset (absolute path); empty when it is not there.")
    dataset_roots: list[str] = Field(description="Where a job's datasets may live (the bundled ones always).")
    fields: list[FormField]
    groups: list[tuple[str, str]] = Field(
        description="The groups a field names, [key, title], in the order the form's Advanced section shows them.")
    method_formats: dict[str, list[str]] = Field(description="The dataset formats each training method reads.")
    methods: list[dict[str, Any]] = Field(
        description="Each training method as config.METHOD_SPECS has it: name, label, summary, formats, the "
                    "defaults that depend on it, its main metric.")


class PreviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    local_datasets: list[str] = Field(default_factory=list, max_length=64)
    hf_dataset: str | None = None
    method: Method = "sft"
    format_type: FormatType = "auto"
    custom_format_mapping: dict[str, MappingTarget] | None = None
    reward_functions: list[str] = Field(default_factory=list, max_length=16,
                                        description="GRPO: the rows must hold what these compare with.")
    train_split: str = "train"
    rows: int = Field(default=5, ge=1, le=50)


def _shown(name: str) -> dict[str, Any]:
    """What the page shows of a field, as the field itself says it (config/parts.py: title, group, help, examples).
    Read from the field, not the JSON schema, which sorts an example's keys."""
    info = JobConfig.model_fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    example = info.examples[0] if info.examples else None
    return {"title": info.title or name, "group": extra.get("group", "other"),
            "help": extra.get("help") or info.description, "choice_labels": extra.get("choice_labels"),
            "hidden": bool(extra.get("hidden")),
            "placeholder": None if example is None else example if isinstance(example, str) else json.dumps(example)}


def form_fields() -> list[FormField]:
    schema = JobConfig.model_json_schema()
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema["properties"].items():
        options = [defs[o["$ref"].rsplit("/", 1)[1]] if "$ref" in o else o for o in prop.get("anyOf", [prop])]
        if "$ref" in prop:
            options = [defs[prop["$ref"].rsplit("/", 1)[1]]]
        nullable = any(o.get("type") == "null" for o in options)
        options = [o for o in options if o.get("type") != "null"]
        main = options[0] if options else {}
        choices = None
        if name in SECRET_FIELDS:
            kind = "secret"
        elif len(options) > 1 or "enum" in main or "const" in main:
            kind = "choice"
            choices = [v for o in options for v in ([False, True] if o.get("type") == "boolean"
                                                    else o.get("enum", [o["const"]] if "const" in o else []))]
        else:
            kind = {"array": "list", "object": "mapping"}.get(main.get("type", "string"), main.get("type", "string"))
        out.append(FormField(
            name=name, kind=kind, default=JobConfig.model_fields[name].get_default(call_default_factory=True),
            required=name in required, nullable=nullable, choices=choices,
            minimum=main.get("minimum"), maximum=main.get("maximum"),
            exclusive_minimum=main.get("exclusiveMinimum"), exclusive_maximum=main.get("exclusiveMaximum"),
            description=prop.get("description"), **_shown(name),
            methods=list(METHOD_OPTIONS[name]) if name in METHOD_OPTIONS else None,
        ))
    return out


@router.get("/defaults", response_model=Defaults)
def defaults(settings: SettingsDep) -> Defaults:
    """The page's starting values: the tiny model, the bundled dataset, and every JobConfig field.

    Both are readable by any job wherever the server runs (settings.EMBEDDED_MODEL, BUNDLED_DATASETS); what is
    not there is not filled in, so the form never starts with a value the server refuses.
    """
    ready = (EMBEDDED_MODEL / "config.json").is_file()
    return Defaults(
        model_name=str(EMBEDDED_MODEL) if ready else "", model_ready=ready,
        model_hint="" if ready else f"build it first: tunestudio make-tiny-model {EMBEDDED_MODEL} (or make run)",
        dataset=str(BUNDLED_DATASET) if BUNDLED_DATASET.is_file() else "",
        dataset_roots=[str(r) for r in [*settings.allowed_dataset_roots(), BUNDLED_DATASETS]],
        fields=form_fields(),
        groups=list(FIELD_GROUPS.items()),
        method_formats={m: list(f) for m, f in METHOD_FORMATS.items()},
        methods=[spec.public() for spec in METHOD_SPECS.values()],
    )


@router.post("/preview")
async def preview(settings: SettingsDep, body: Annotated[PreviewRequest, Body()]) -> dict[str, Any]:
    """The first rows of a local dataset, raw and as the chosen (or detected) format reads them.

    Hub datasets are not previewed: that would download them; the job reads them when it starts.
    Async so that a preview waiting for its turn holds no thread: a flood of previews cannot stall the
    routes that run in the thread pool (beyond a short queue, a preview is a 429 at once).
    """
    if body.hf_dataset and not body.local_datasets:
        return {"error": None, "unavailable": "the preview reads local files; a hub dataset is read when the job "
                                              "starts", "rows": []}
    from starlette.concurrency import run_in_threadpool

    from tunestudio.api.preview import PreviewBusy, PreviewTimeout, preview_rows_async

    config = await run_in_threadpool(_preview_config, settings, body)  # it asks the filesystem
    try:
        return await preview_rows_async(config.model_dump(mode="json"), body.rows)
    except PreviewBusy as exc:
        raise ApiError(429, "busy", str(exc)) from None
    except PreviewTimeout as exc:
        raise ApiError(504, "timeout", str(exc)) from None


def _preview_config(settings: Settings, body: PreviewRequest) -> DataSpec:
    """The data part of a job the preview reads: validated as a job's is (no model or schedule is needed), its
    files confined and resolved like a job's (errors are 422s naming the field)."""
    # Each file once; a hub dataset beside local files is not read (that would download it).
    fields = body.model_dump(exclude={"rows", "hf_dataset"}, exclude_none=True)
    fields["local_datasets"] = list(dict.fromkeys(body.local_datasets))
    try:
        spec = DataSpec.model_validate(fields)
    except ValidationError as exc:
        errors = format_validation_error(exc)
        raise ApiError(422, "invalid_request", summary(errors), errors=errors) from None
    paths.confine_datasets(spec.local_datasets, settings.roots())  # PathRefused: a 422 naming the field
    return spec.model_copy(update={"local_datasets": paths.resolve_datasets(spec.local_datasets)})
