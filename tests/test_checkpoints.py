"""The checkpoint finder: the newest *complete* checkpoint, judged without torch."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from tunestudio.checkpoints import is_complete, latest_checkpoint
from tunestudio.jobs import admission, tracker

from .helpers.checkpoints import safetensors_bytes, write_checkpoint


def test_a_checkpoint_is_complete_only_when_state_weights_and_optimizer_parse(tmp_path: Path) -> None:
    good = write_checkpoint(tmp_path, 10)
    assert is_complete(good)

    def damaged(name: str, how) -> Path:
        folder = tmp_path / f"damaged-{name}"
        shutil.copytree(good, folder)
        how(folder)
        return folder

    broken = {
        "no state": damaged("state", lambda f: (f / "trainer_state.json").unlink()),
        "torn state": damaged("torn", lambda f: (f / "trainer_state.json").write_text('{"global_st')),
        "no weights": damaged("weights", lambda f: (f / "adapter_model.safetensors").unlink()),
        "truncated weights": damaged("short", lambda f: (f / "adapter_model.safetensors").write_bytes(
            safetensors_bytes()[:-3])),
        "no optimizer": damaged("optim", lambda f: (f / "optimizer.pt").unlink()),
        "truncated optimizer": damaged("optshort", lambda f: (f / "optimizer.pt").write_bytes(
            (f / "optimizer.pt").read_bytes()[:-10])),
        "empty": damaged("empty", lambda f: [p.unlink() for p in f.iterdir()]),
    }
    for what, folder in broken.items():
        assert not is_complete(folder), what


def test_full_and_sharded_weights_count_too(tmp_path: Path) -> None:
    full = write_checkpoint(tmp_path, 1)
    (full / "adapter_model.safetensors").rename(full / "model.safetensors")
    assert is_complete(full)
    sharded = write_checkpoint(tmp_path, 2)
    (sharded / "adapter_model.safetensors").unlink()
    for i in (1, 2):
        (sharded / f"model-0000{i}-of-00002.safetensors").write_bytes(safetensors_bytes())
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert is_complete(sharded)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    assert not is_complete(sharded)
    pickled = write_checkpoint(tmp_path, 3)
    (pickled / "adapter_model.safetensors").unlink()
    with zipfile.ZipFile(pickled / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", b".")
    assert is_complete(pickled)


def test_latest_skips_newer_incomplete_folders_and_staging(tmp_path: Path) -> None:
    assert latest_checkpoint(None) is None and latest_checkpoint(tmp_path / "missing") is None
    write_checkpoint(tmp_path, 5)
    write_checkpoint(tmp_path, 20)
    write_checkpoint(tmp_path, 100)
    (tmp_path / "checkpoint-100" / "optimizer.pt").unlink()  # killed while saving (an older version's layout)
    (tmp_path / "checkpoint-200").mkdir()  # an empty folder
    write_checkpoint(tmp_path / ".checkpoint-staging", 300)  # a save in progress
    (tmp_path / "checkpoint-notanumber").mkdir()
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")
    # the jobs wing (resume, recovery of interrupted jobs) uses this same finder
    assert admission.latest_checkpoint is latest_checkpoint and tracker.latest_checkpoint is latest_checkpoint
