"""Reading and writing a job file, and validation errors as the user sees them: [{field, message}] and one line."""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tunestudio.config.job import JobConfig
from tunestudio.config.vocabulary import SECRET_FIELDS

__all__ = ["NAME_MAX", "ConfigError", "dump_config", "field_errors", "format_validation_error", "job_file_fields",
           "job_name", "load_config", "load_job_file", "parse_config_text", "summary"]


NAME_MAX = 200  # a job's name (RenameRequest's bound)


class ConfigError(ValueError):
    """A config file could not be read or did not validate; the message is for the user."""


def format_validation_error(error: ValidationError) -> list[dict[str, str]]:
    """Field errors as [{field, message}], the shape every front end shows."""
    return field_errors(error.errors(include_url=False), _model_named(error.title))


def _model_named(title: str) -> type[BaseModel] | None:
    """The tunestudio model a ValidationError of `Model.model_validate` came from (its title is the class's
    name); None when no single one has that name."""
    found, todo = [], list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__name__ == title and cls.__module__.startswith("tunestudio."):
            found.append(cls)
    return found[0] if len(set(found)) == 1 else None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: `X`, `X | None`, `list[X]`, `dict[str, X]`..."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _names_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The field names (and aliases) of the part of `model` that `loc` names: a nested model's fields for
    ("early_stopping",); list indexes, dict keys and union tags on the way are passed over."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is not None:
            inner = _models_in(field.annotation)
            if not inner:
                return []
            model = inner[0]
    return [name for key, field in model.model_fields.items() for name in (key, field.alias) if name]


def _did_you_mean(item: dict[str, Any], model: type[BaseModel] | None) -> str:
    """For a field the model does not have: " (did you mean `NAME`?)" when a field of that part is close."""
    loc = item.get("loc") or ()
    if model is None or item.get("type") != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], _names_at(model, loc[:-1]), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def field_errors(items: Iterable[Any], model: type[BaseModel] | None = None) -> list[dict[str, str]]:
    """[{field, message}] from pydantic's error items (a dict each, with "loc" and "msg"); a field `model` (the
    model validated) does not have gets the closest name it has ("did you mean `learning_rate`?")."""
    out = []
    for item in items:
        field = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ") + _did_you_mean(item, model)
        if not field:  # whole-model checks name their field first: "field: reason" (or "field.part: reason")
            head, _, rest = message.partition(":")
            if rest and all(part.isidentifier() for part in head.split(".")):
                field, message = head, rest.strip()
        out.append({"field": field, "message": message})
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> JobConfig:
    """Read a YAML or JSON job file and validate it (its job's `name`, if any, is read and left aside).

    Raises ConfigError with one line per bad field.
    """
    return load_job_file(path, overrides)[0]


def load_job_file(path: str | Path, overrides: dict[str, Any] | None = None) -> tuple[JobConfig, str | None]:
    """A YAML or JSON job file's config and its job's name (None when it has none), as `tunestudio train` reads it.

    Raises ConfigError with one line per bad field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config {path} is not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a mapping of field: value")
    name = job_name(data)
    data.update(overrides or {})
    try:
        return JobConfig.model_validate(data), name
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path}:\n  " + summary(format_validation_error(exc), "\n  ", "(config)")) \
            from None


def job_name(data: dict[str, Any]) -> str | None:
    """Take the job's `name` out of a job file's mapping: the job's own (the job list shows it), not a field of
    its config. Raises ConfigError for a name that is not text of at most NAME_MAX characters."""
    name = data.pop("name", None)
    if isinstance(name, (int, float)) and not isinstance(name, bool):
        name = str(name)  # `name: 2024` is YAML's number
    if name is not None and (not isinstance(name, str) or len(name.strip()) > NAME_MAX):
        raise ConfigError(f"name: the job's name is text of at most {NAME_MAX} characters")
    return (name or "").strip() or None


def summary(errors: Iterable[dict[str, str]], sep: str = "; ", unnamed: str = "request") -> str:
    """Field errors as one text: "field: message; other: message" (an error of no field is `unnamed`'s)."""
    return sep.join(f"{e['field'] or unnamed}: {e['message']}" for e in errors)


def job_file_fields(cfg: JobConfig, leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """The fields a job file needs to give `cfg` again: every field that differs from its default, plus any
    default whose absence would read differently (a method's own defaults), in JobConfig's order; never a
    secret, nor the fields in `leave_out`."""
    skip = {*SECRET_FIELDS, *leave_out}
    full = {k: v for k, v in cfg.public_dict().items() if k not in skip}
    chosen = {k: v for k, v in cfg.model_dump(mode="json", exclude_defaults=True).items() if k in full}
    for _ in range(len(full)):  # each round adds back what reading the smaller file changed
        try:
            again = JobConfig.model_validate(chosen).public_dict()
        except ValidationError:  # a check that needs a default spelled out: the whole config, then
            return full
        changed = [k for k, v in full.items() if k not in chosen and again.get(k) != v]
        if not changed:
            break
        chosen.update({k: full[k] for k in changed})
    return {k: _as_written(k, full[k]) for k in full if k in chosen}


def _as_written(field: str, value: Any) -> Any:
    """A whole number in a float field as the integer the user typed (`eval_steps: 10`, not 10.0): the field
    reads it back as the same float."""
    annotation = JobConfig.model_fields[field].annotation
    floats = annotation is float or set(typing.get_args(annotation)) == {float, type(None)}
    return int(value) if floats and isinstance(value, float) and value.is_integer() else value


def dump_config(cfg: JobConfig, header: str = "", leave_out: Iterable[str] = (), name: str | None = None) -> str:
    """A job file (YAML) that `load_job_file` reads back as `cfg` (less its secrets and `leave_out`) and the job's
    `name` (its first field, when given); `header` becomes comment lines at its top."""
    fields = {"name": name, **job_file_fields(cfg, leave_out)} if name else job_file_fields(cfg, leave_out)
    text = yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, width=10_000)
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comments + text


def parse_config_text(text: str) -> tuple[JobConfig, str | None]:
    """A job file's text (YAML, or JSON, which YAML reads too) validated as `load_job_file` does: its config and
    its job's name.

    Raises ConfigError when it is not a mapping of field: value, pydantic's ValidationError for bad fields.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the job file is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("a job file holds a mapping of field: value (e.g. model_name: ...)")
    name = job_name(data)
    return JobConfig.model_validate(data), name
