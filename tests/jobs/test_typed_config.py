"""A job's config is read back as the type it was validated as at submit (jobs/models.py: stored_config)."""

from __future__ import annotations

import logging

import pytest

from tunestudio.bench_config import BenchConfig
from tunestudio.config import JobConfig
from tunestudio.export_config import ExportConfig
from tunestudio.jobs.models import Job


def row(kind: str, config: dict) -> dict:
    return {"id": "j1", "kind": kind, "status": "completed", "config": config, "created_at": 0.0}


def test_each_kind_reads_back_as_its_own_type_equal_to_what_was_stored() -> None:
    train = JobConfig(model_name="org/m", local_datasets=["a.jsonl"], method="dpo", beta=0.2, lora_r=4)
    job = Job.from_row(row("train", train.public_dict()))
    assert isinstance(job.config, JobConfig) and job.train_config == train
    export = ExportConfig(target="gguf", quantization="q8_0", source_dir="/x/out", source_job_id="j0")
    assert Job.from_row(row("export", export.public_dict())).config == export
    bench = BenchConfig(tasks=["hellaswag"], source_job_id="j0", base_url="http://127.0.0.1:1/v1", tokenizer="/t",
                        models={"before": "j0:base", "after": "j0"})
    got = Job.from_row(row("bench", bench.public_dict())).config
    assert isinstance(got, BenchConfig) and got == bench
    with pytest.raises(AssertionError):
        _ = Job.from_row(row("export", export.public_dict())).train_config


def test_a_config_of_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="export job's config is a ExportConfig"):
        Job(id="j1", kind="export", status="completed", created_at=0.0,
            config=JobConfig(model_name="org/m", hf_dataset="org/d"))


def test_an_older_row_still_lists(caplog: pytest.LogCaptureFixture) -> None:
    """A field this version no longer has is dropped; a value it now refuses is read as stored, with a warning."""
    old = {**JobConfig(model_name="org/m", hf_dataset="org/d").public_dict(), "a_field_from_long_ago": 1}
    assert Job.from_row(row("train", old)).train_config.model_name == "org/m"
    refused = {**JobConfig(model_name="org/m", hf_dataset="org/d").public_dict(), "batch_size": 0}
    with caplog.at_level(logging.WARNING, logger="tunestudio.jobs.models"):
        job = Job.from_row(row("train", refused))
    assert job.train_config.batch_size == 0 and job.train_config.model_name == "org/m"
    assert "no longer validates" in caplog.text
