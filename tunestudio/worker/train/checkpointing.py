"""Checkpoints that appear whole or not at all.

The HF Trainer writes checkpoint-N file by file (weights, optimizer, scheduler,
RNG, trainer state). A worker killed in between would leave a folder that looks
like the newest checkpoint and cannot be resumed from; a checkpoint saved again
at the same step (a periodic save, then a stop with save) would be overwritten
in place, losing the only good copy. So each checkpoint is written into a
staging folder and renamed into place once every file is on disk.

The hook: `Trainer._save_checkpoint` (transformers 5.24) asks
`self._get_output_dir(trial)` for the run folder and writes `checkpoint-N`
into it. For the length of that call the run folder is the staging folder;
TRL's model card still goes to `args.output_dir`, which is left alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from tunestudio.checkpoints import publish

STAGING = ".checkpoint-staging"  # not matched by checkpoints.CHECKPOINT: never taken for a checkpoint


def save_checkpoints_atomically(trainer: Any) -> None:
    """Make this trainer write every checkpoint into a staging folder and rename it when it is complete.

    One process only: under torchrun every rank writes its own RNG state into the checkpoint while rank 0
    writes the rest, and a rename by rank 0 would race the others; data-parallel jobs keep the Trainer's
    own in-place writes (the newest complete checkpoint is still what resume takes: tunestudio.checkpoints).
    """
    if trainer.args.world_size > 1:
        return
    save = trainer._save_checkpoint  # bound: TRL's override, then the Trainer's

    def _save_checkpoint(model: Any, trial: Any) -> None:
        run_dir = Path(type(trainer)._get_output_dir(trainer, trial=trial))
        staging = run_dir / STAGING
        shutil.rmtree(staging, ignore_errors=True)  # what a worker killed while saving left behind
        staging.mkdir(parents=True)
        trainer._get_output_dir = lambda trial=None: str(staging)
        try:
            try:
                save(model, trial)
            finally:
                del trainer._get_output_dir  # the class's method again
            name = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
            if trainer.args.should_save and (staging / name).is_dir():
                publish(staging / name, run_dir / name)
                # The Trainer rotated the staging folder, where there was nothing to rotate: do it here.
                rotate_checkpoints(output_dir=str(run_dir), save_total_limit=trainer.args.save_total_limit,
                                   best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True)
        finally:  # a failed save (a full disk) must not leave a half checkpoint holding the space
            shutil.rmtree(staging, ignore_errors=True)

    trainer._save_checkpoint = _save_checkpoint
