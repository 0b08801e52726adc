"""A job's configuration: `JobConfig` and everything it is made of.

- `vocabulary.py`: the literals and enums a config is written in, their aliases, the bounds.
- `methods.py`: one `MethodSpec` per training method (formats, options, mappings, defaults, main metric,
  its own checks, rows per example, its OpenAI method type) and the reward grammar; the config, the worker,
  the estimate, the OpenAI API and the page read it.
- `seed.py`: every other spelling a field takes (the seed's, aliases, words for booleans), in one
  before-validator.
- `parts.py`: the per-concern parts of what is trained (model, data, optimisation, adapters, media, method), each
  field with the page's label, group and help; `reporting.py`: those of what a job reports and keeps (logging,
  outputs, early stopping).
- `job.py`: `JobConfig`, composed of the parts, and `DataSpec`, the data part a dataset preview checks.
- `report.py`: `ReportSpec`, what the dataset report reads of a job (a DataSpec with the model, the slice,
  dedupe and the held-out split).
- `files.py`: loading a job file; validation errors as [{field, message}] and as one line (`summary`).
"""

from tunestudio.config.files import ConfigError, field_errors, format_validation_error, load_config, summary
from tunestudio.config.job import DataSpec, JobConfig
from tunestudio.config.methods import (
    ANSWER_REWARDS,
    BUILTIN_REWARDS,
    METHOD_FORMATS,
    METHOD_MAIN_METRIC,
    METHOD_OPTIONS,
    METHOD_SPECS,
    METHODS,
    OPENAI_TYPES,
    MethodSpec,
    OpenAIFile,
    method_spec,
    openai_method,
    reward_model_folder,
    reward_name,
    reward_source,
)
from tunestudio.config.report import ReportSpec
from tunestudio.config.vocabulary import (
    FIELD_GROUPS,
    MAX_ROWS,
    MAX_STEPS,
    SECRET_FIELDS,
    FormatType,
    MappingTarget,
    Method,
    TrainingType,
)

__all__ = [
    "ANSWER_REWARDS", "BUILTIN_REWARDS", "FIELD_GROUPS", "MAX_ROWS", "MAX_STEPS", "METHODS", "METHOD_FORMATS",
    "METHOD_MAIN_METRIC", "METHOD_OPTIONS", "METHOD_SPECS", "OPENAI_TYPES", "SECRET_FIELDS", "ConfigError", "DataSpec",
    "FormatType", "JobConfig", "MappingTarget", "Method", "MethodSpec", "OpenAIFile", "ReportSpec", "TrainingType",
    "field_errors", "format_validation_error", "load_config", "method_spec", "openai_method",
    "reward_model_folder", "reward_name", "reward_source", "summary",
]
