"""A worker killed while saving a checkpoint leaves the previous one usable, and "latest" resumes from it."""

from __future__ import annotations

from pathlib import Path

from tunestudio.checkpoints import is_complete, latest_checkpoint

from ..helpers import fake_workers
from ..helpers.jobs import job_config, run_job


def test_a_kill_while_saving_leaves_the_previous_checkpoint_and_latest_resumes_from_it(
        tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = job_config(tiny_model, out, max_steps=16, save_steps=5)
    # forked from the warm forkserver (the patch of Trainer stays in the fork)
    killed = run_job(cfg, target=fake_workers.killed_while_saving_second_checkpoint, prewarm=True)
    assert killed.outcome.kind == "failed" and "signal 9" in killed.outcome.message, killed.outcome
    # The step-10 checkpoint never appeared as a checkpoint-N folder: only its staging folder is left.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-5"]
    assert is_complete(out / "checkpoint-5")
    assert latest_checkpoint(out) == str(out / "checkpoint-5")

    resumed = run_job(cfg.model_copy(update={"resume_from_checkpoint": "latest"}))
    assert resumed.outcome.kind == "completed", resumed.failure
    steps = [step for step, _ in resumed.losses]
    assert steps[0] == 6 and steps[-1] == 16
    # Its own checkpoints went through the staging folder into place, and the staging folder is gone.
    assert {"checkpoint-5", "checkpoint-10", "checkpoint-15"} <= {p.name for p in out.glob("checkpoint-*")}
    assert all(is_complete(p) for p in out.glob("checkpoint-*"))
    assert not (out / ".checkpoint-staging").exists()


def test_a_save_that_fails_leaves_no_staging_folder(tmp_path: Path) -> None:
    """A full disk in the middle of a checkpoint: the half-written staging folder must not keep the space."""
    from types import SimpleNamespace

    import pytest

    from tunestudio.worker.train.checkpointing import STAGING, save_checkpoints_atomically

    class Trainer:
        args = SimpleNamespace(world_size=1, should_save=True, save_total_limit=None)
        state = SimpleNamespace(global_step=3, best_model_checkpoint=None)

        def _get_output_dir(self, trial: object = None) -> str:
            return str(tmp_path)

        def _save_checkpoint(self, model: object, trial: object) -> None:
            half = Path(self._get_output_dir()) / "checkpoint-3"
            half.mkdir()
            (half / "model.safetensors").write_bytes(b"\0" * 4096)
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    trainer = Trainer()
    save_checkpoints_atomically(trainer)
    with pytest.raises(RuntimeError, match="file write failed"):
        trainer._save_checkpoint(None, None)
    assert not (tmp_path / STAGING).exists() and not (tmp_path / "checkpoint-3").exists()
