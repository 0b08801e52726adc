"""The kinds of job: one entry each, read by the store, the executor, the worker's entry and the page.

A kind is what a queued job does in its worker: train a model, export one, benchmark one, make a dataset. Each
entry names its typed config (validated once, at submit, stored without secrets and read back as the same type),
the worker's recipe that runs it (a "module:function" string, imported inside the child only: this module stays
light), what it leaves (a model of its own, or files about its source job) and where it may run. Adding a kind of
job is a config type, a recipe and one entry here; code elsewhere asks the entry (`spec_of(job.kind).trains`),
never compares kind names.

Judgements and sweeps are not kinds: a judgement asks served models through /v1, a sweep submits train jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tunestudio.bench_config import BenchConfig
from tunestudio.config import JobConfig
from tunestudio.export_config import ExportConfig
from tunestudio.make_data_config import MakeDataConfig

__all__ = ["KINDS", "AnyConfig", "JobKindSpec", "kind_of_config", "spec_of"]

AnyConfig = JobConfig | ExportConfig | BenchConfig | MakeDataConfig  # the config of some kind of job


@dataclass(frozen=True)
class JobKindSpec:
    """What one kind of job is.

    name: its stored value (`jobs.kind`). config: its typed config (`public_dict`, `secrets`, `from_parts`).
    recipe: "module:function" of the worker that runs it, called as `recipe(public, channel, secrets,
    cache_dir=...)` and returning the exit code. label: how the page and the CLI name one ("a training job").
    trains: it trains a model of its own (so it can be resumed, chatted with, exported, benchmarked, cloned as a
    job file). about_job: it is about `source_job`, a training job (an export, a benchmark). distributed: it may
    run as N ranks (torchrun) or on a Ray cluster; otherwise always one local process.
    """

    name: str
    config: type[BaseModel]
    recipe: str
    label: str
    trains: bool
    distributed: bool = False
    about_job: bool = False

    @property
    def about_source(self) -> bool:
        return self.about_job


KINDS: dict[str, JobKindSpec] = {spec.name: spec for spec in (
    JobKindSpec("train", JobConfig, "tunestudio.worker.main:run", "training job", trains=True, distributed=True),
    JobKindSpec("export", ExportConfig, "tunestudio.worker.export:run", "export", trains=False, about_job=True),
    JobKindSpec("bench", BenchConfig, "tunestudio.worker.bench:run", "benchmark", trains=False,
                about_job=True),
    # documents and a teacher model write a dataset (issue 43): about no job, it writes its recipe's output file
    JobKindSpec("make_data", MakeDataConfig, "tunestudio.worker.make_data:run", "data-making job", trains=False),
)}


def spec_of(kind: str) -> JobKindSpec:
    """The entry of a stored kind; KeyError names the kinds there are."""
    try:
        return KINDS[kind]
    except KeyError:
        raise KeyError(f"no kind of job {kind!r}; the kinds are {', '.join(KINDS)}") from None


def kind_of_config(config: Any) -> JobKindSpec:
    """The kind whose config `config` is (the configs do not inherit from one another)."""
    for spec in KINDS.values():
        if isinstance(config, spec.config):
            return spec
    raise TypeError(f"{type(config).__name__} is the config of no kind of job")
