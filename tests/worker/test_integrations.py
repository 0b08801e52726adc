"""Datasets and logging integrations through the real worker process, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.events import Log

from ..helpers.jobs import DATA, job_config, run_job

SECRETS = {"hf_token": "hf_TOPSECRET_data", "wandb_token": "wandb_TOPSECRET_0123456789abcdef0123456789abcdef0123"}


def test_saved_dataset_with_eval_split_tensorboard_and_offline_wandb(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import Dataset, DatasetDict
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = [json.loads(line) for line in (DATA / "alpaca.jsonl").read_text().splitlines()]
    DatasetDict({"train": Dataset.from_list(rows[40:]), "test": Dataset.from_list(rows[:40])}).save_to_disk(
        str(tmp_path / "saved"))
    monkeypatch.setenv("WANDB_MODE", "offline")  # a token is given, but these machines have no W&B server
    out, tb = tmp_path / "out", tmp_path / "tb"
    cfg = job_config(tiny_model, out, local_datasets=[], hf_dataset=str(tmp_path / "saved"), eval_split="test",
                     eval_steps=2, max_steps=6, enable_tensorboard=True, tensorboard_dir=str(tb),
                     enable_wandb=True, **SECRETS)
    run = run_job(cfg, log_path=tmp_path / "worker.log", prewarm=False)  # WANDB_MODE reaches a spawned worker
    assert run.outcome.kind == "completed", run.failure
    assert any("eval: 40 rows from eval_split 'test'" in m for m in run.messages())
    assert any("wandb" in m and "offline" in m for m in run.messages()), run.messages()

    accumulator = EventAccumulator(str(tb))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert [e.step for e in accumulator.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6], tags
    assert [e.step for e in accumulator.Scalars("eval/loss")] == [0, 2, 4, 6]  # integer eval_steps
    assert all(e.value > 0 for e in accumulator.Scalars("train/loss"))
    assert list((out / "wandb").glob("offline-run-*")), "W&B kept no offline run"

    # The secrets reach neither the artefacts, the W&B run, the event files, the log nor the events.
    files = [p for root in (out, tb) for p in root.rglob("*") if p.is_file()] + [tmp_path / "worker.log"]
    for secret in SECRETS.values():
        assert [p for p in files if secret.encode() in p.read_bytes()] == [], secret
        assert all(secret not in e.model_dump_json() for e in run.events)


def test_sharegpt_packed_with_completion_mask_trains_and_says_its_format(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", local_datasets=[str(DATA / "sharegpt.json")], max_steps=5,
                     packing=True, train_on_completions=True)
    run = run_job(cfg)
    assert run.outcome.kind == "completed", run.failure
    logs = [e.message for e in run.of(Log)]
    assert any("read as sharegpt (auto-detected)" in m for m in logs), logs
    assert [s for s, _ in run.losses] == [1, 2, 3, 4, 5]


def test_bad_data_ends_in_a_failed_event_naming_file_and_row(tiny_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a",\n')
    run = run_job(job_config(tiny_model, tmp_path / "out", local_datasets=[str(bad)]))
    assert run.outcome.kind == "failed"
    assert f"dataset {bad} row 2 is not valid JSON" in run.failure
    assert "Traceback" not in run.failure
