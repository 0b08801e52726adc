"""Finished image jobs of both tiny vision families (and a text job), recorded cheaply: a worker that 'trains' by
copying its base model's folder into its output folder (the chat worker serves that folder as the job's model)."""

from __future__ import annotations

import base64
import shutil
import sys
from pathlib import Path
from typing import Any

from tunestudio.jobs.manager import JobManager
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from .jobs import DATA, job_config
from .wait import wait_until

REPO = Path(__file__).resolve().parents[2]
FAMILIES = {"smolvlm": REPO / "models" / "tiny-smolvlm", "qwen2_vl": REPO / "models" / "tiny-qwen2-vl"}
PICTURE = DATA / "shapes" / "eval-0000.png"
QUESTION = "What colour is the shape?"


def copies_its_model(args: WorkerArgs) -> None:
    """A training job that copies its base model's folder into its output folder, and completes."""
    from tunestudio.worker.channel import QueueChannel

    child.become_worker(args)
    channel = QueueChannel(args.events, args.commands)
    channel.phase("training")
    output = Path(args.public_config["output_dir"])
    shutil.copytree(args.public_config["model_name"], output, dirs_exist_ok=True)  # times kept: not "replaced"
    channel.completed(output_dir=str(output), global_step=1)
    channel.close()
    sys.exit(0)


def record_jobs(manager: JobManager, folder: Path, text_model: Path) -> dict[str, str]:
    """A completed job of each tiny vision family ("smolvlm", "qwen2_vl") and of the text model ("text"), output
    folders under `folder`, by a manager whose worker is `copies_its_model`; their ids by name."""
    jobs = {}
    for name, model in {**FAMILIES, "text": text_model}.items():
        assert (model / "config.json").is_file(), f"{model} is not built: `make test` builds it"
        image = {"is_dataset_image": True, "local_datasets": [str(DATA / "shapes.jsonl")]} if name != "text" else {}
        jobs[name] = manager.submit(job_config(model, folder / name, **image)).id
    for job_id in jobs.values():
        ended = wait_until(lambda j=job_id: (job := manager.get(j)).status.is_terminal and job, 60, "a job's end")
        assert ended.status.value == "completed", ended.error
    return jobs


def data_url(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


def asking(url: str, text: str = QUESTION) -> list[dict[str, Any]]:
    """A user turn with a picture (OpenAI's image_url part) before the question."""
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]
