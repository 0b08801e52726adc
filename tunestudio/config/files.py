"""Reading a job file, and validation errors as the user sees them: [{field, message}] and one line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tunestudio.config.job import JobConfig

__all__ = ["ConfigError", "field_errors", "format_validation_error", "load_config", "summary"]


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
