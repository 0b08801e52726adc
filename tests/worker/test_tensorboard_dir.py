"""A relative tensorboard_dir is inside the job's output folder, as JobConfig says and paths.confine checks: the
worker once wrote it relative to its own cwd (the server's), outside every root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tunestudio.config import JobConfig
from tunestudio.worker.train import integrations


def test_a_relative_tensorboard_dir_lands_in_the_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    out = tmp_path / "jobs" / "x" / "output"
    cfg = JobConfig(model_name="org/model", hf_dataset="org/data", output_dir=str(out), enable_tensorboard=True)
    report_to, _ = integrations.setup(cfg)
    assert report_to == ["tensorboard"]
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(out / "runs") and (out / "runs").is_dir()
    assert list(cwd.iterdir()) == []
    absolute = tmp_path / "boards"
    integrations.setup(cfg.model_copy(update={"tensorboard_dir": str(absolute)}))
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(absolute) and absolute.is_dir()
