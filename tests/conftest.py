from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "data"


def _build(directory: str) -> None:
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny model: the one `make` built (models/tiny-llama), else built once per session.

    Tests only read it. Building happens in a child, as `make-tiny-model` does, so
    this process stays as light as a user's parent process.
    """
    built = REPO / "models" / "tiny-llama"
    if (built / "config.json").is_file() and (built / "model.safetensors").is_file():
        return built
    directory = tmp_path_factory.mktemp("tiny-llama")
    proc = mp.get_context("spawn").Process(target=_build, args=(str(directory),))
    proc.start()
    proc.join(300)
    assert proc.exitcode == 0, "building the tiny model failed"
    return directory


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNESTUDIO_HOME", str(tmp_path / "home"))
