"""A short real LoRA job to chat with, trained once per test module, and a polling helper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings

from .jobs import job_config
from .wait import wait_until

PROMPT = "What sound does this animal make?\n\ncow"


def train_chat_job(tiny_model: Path, home: Path, **overrides: Any) -> Job:
    """A completed 40-step LoRA job of the tiny model, with an eval split, samples and an evaluation."""
    settings = Settings(home=home)
    fields = {"max_steps": 40, "eval_steps": 0.5, "eval_generate_rows": 8, "sample_prompts": [PROMPT], **overrides}
    cfg = job_config(tiny_model, Path(fields.pop("output_dir", home / "chat-job")), **fields)
    with JobManager(settings) as manager:
        job = manager.submit(cfg)
        job = wait_until(lambda: j if (j := manager.get(job.id)).status.is_terminal else None, 600,
                         "the chat job's end")
    assert job.status is JobStatus.completed, f"the chat job ended {job.status.value}: {job.error}"
    return job

