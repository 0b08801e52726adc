"""The logging integrations a job can turn on: TensorBoard and Weights & Biases.

Both are reached through the trainer's `report_to`. Their settings go into this
worker process's environment only. The W&B token comes through the secrets
channel and lands in WANDB_API_KEY; it is never written to a file. Without a
token, W&B runs offline and keeps its run under the job's output folder.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tunestudio.config import JobConfig
from tunestudio.paths import tensorboard_path
from tunestudio.worker.errors import UserError


def setup(cfg: JobConfig) -> tuple[list[str], list[str]]:
    """Prepare the environment for the enabled integrations; returns (report_to, notes)."""
    report_to: list[str] = []
    notes: list[str] = []
    if cfg.enable_tensorboard:
        if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
            raise UserError("enable_tensorboard: the tensorboard package is not installed (pip install tensorboard)")
        board = tensorboard_path(cfg)  # relative: inside output_dir, where paths.confine judged it
        board.mkdir(parents=True, exist_ok=True)
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(board)
        report_to.append("tensorboard")
        notes.append(f"tensorboard: writing event files to {board}")
    if cfg.enable_wandb:
        if importlib.util.find_spec("wandb") is None:
            raise UserError("enable_wandb: the wandb package is not installed (pip install wandb)")
        os.environ["WANDB_PROJECT"] = cfg.wandb_project
        os.environ.setdefault("WANDB_DIR", cfg.output_dir or ".")
        os.environ.setdefault("WANDB_SILENT", "true")
        if cfg.wandb_token is not None:
            os.environ["WANDB_API_KEY"] = cfg.wandb_token.get_secret_value()
            os.environ.setdefault("WANDB_MODE", "online")
        else:
            os.environ["WANDB_MODE"] = "offline"
        Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
        report_to.append("wandb")
        notes.append(f"wandb: project {cfg.wandb_project!r}, {os.environ['WANDB_MODE']} mode"
                     + (f", run kept in {os.environ['WANDB_DIR']}" if os.environ["WANDB_MODE"] == "offline" else ""))
    return report_to, notes
