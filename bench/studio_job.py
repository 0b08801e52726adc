"""One job file run to its end through a JobManager in a data directory of its own, as `tunestudio train` runs it:
the demos' shared driver (bench/reward_demo.py, bench/tools_demo.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tunestudio.config.files import load_job_file
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings


def run_job_file(job_file: Path, model: Path, data: Path, train: str, held: str, work: Path,
                 overrides: dict[str, Any]) -> dict[str, Any]:
    """The job in `job_file` on `model`, trained on data/`train`, evaluated on data/`held`, in `work`; its record,
    seconds and config. Fails unless it completes."""
    config, _ = load_job_file(job_file, {"model_name": str(model), "output_dir": str(work / "job"),
                                         "local_datasets": [str(data / train)], "eval_split": str(data / held),
                                         **overrides})
    settings = Settings(home=work / "home", model_roots=[model.parent], dataset_roots=[data])
    with JobManager(settings) as manager:
        started = time.monotonic()
        job = manager.submit(config)
        with manager.subscribe(job.id) as stream:
            while True:
                event = stream.get(timeout=3600)
                assert event is not None, "the job went quiet"
                if event.is_end:
                    break
        job = manager.get(job.id)
        assert job.status.value == "completed", (job.status, job.error)
        return {"job": job, "seconds": time.monotonic() - started, "config": config}
