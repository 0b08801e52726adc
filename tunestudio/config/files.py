"""Reading and writing a job file, and validation errors as the user sees them: [{field, message}] and one line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tunestudio.config.job import JobConfig
from tunestudio.config.vocabulary import SECRET_FIELDS

__all__ = ["ConfigError", "dump_config", "field_errors", "format_validation_error", "job_file_fields", "load_config",
           "parse_config_text", "summary"]


class ConfigError(ValueError):
    """A config file could not be read or did not validate; the message is for the user."""


def format_validation_error(error: ValidationError) -> list[dict[str, str]]:
    """Field errors as [{field, message}], the shape every front end shows."""
    return field_errors(error.errors(include_url=False))


def field_errors(items: Iterable[Any]) -> list[dict[str, str]]:
    """[{field, message}] from pydantic's error items (a dict each, with "loc" and "msg")."""
    out = []
    for item in items:
        field = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if not field:  # whole-model checks name their field first: "field: reason" (or "field.part: reason")
            head, _, rest = message.partition(":")
            if rest and all(part.isidentifier() for part in head.split(".")):
                field, message = head, rest.strip()
        out.append({"field": field, "message": message})
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> JobConfig:
    """Read a YAML or JSON job file and validate it.

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
    data.update(overrides or {})
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path}:\n  " + summary(format_validation_error(exc), "\n  ", "(config)")) \
            from None


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
    return {k: full[k] for k in full if k in chosen}


def dump_config(cfg: JobConfig, header: str = "", leave_out: Iterable[str] = ()) -> str:
    """A job file (YAML) that `load_config` reads back as `cfg` (less its secrets and `leave_out`); `header`
    becomes comment lines at its top."""
    text = yaml.safe_dump(job_file_fields(cfg, leave_out), sort_keys=False, allow_unicode=True, width=10_000)
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comments + text


def parse_config_text(text: str) -> JobConfig:
    """A job file's text (YAML, or JSON, which YAML reads too) validated as `load_config` does.

    Raises ConfigError when it is not a mapping of field: value, pydantic's ValidationError for bad fields.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the job file is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("a job file holds a mapping of field: value (e.g. model_name: ...)")
    return JobConfig.model_validate(data)
