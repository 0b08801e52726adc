"""A manager in its own process: `python -m tests.helpers.manager_proc HOME CONFIG.json [FAKE_WORKER]`.

For tests that kill it, or that need a second process on one data directory.
FAKE_WORKER names a function in tests/helpers/fake_workers.py to run instead of the real worker.

Prints one JSON line per job event (plus {"worker_pid": N} once the worker
runs), so the test can wait for a moment and then SIGKILL this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tunestudio.config import JobConfig
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings


def main(home: str, config_file: str, fake_worker: str | None = None) -> None:
    config = JobConfig.model_validate(json.loads(Path(config_file).read_text()))
    # The worker forkserver only where it serves this one job: not for a fake worker (a spawn imports only
    # tunestudio) nor under torchrun (its ranks are fresh interpreters): its preload is about 10 s of CPU.
    settings = Settings(home=Path(home))  # TUNESTUDIO_PREWARM=0 still turns it off
    settings = settings.model_copy(update={"prewarm": settings.prewarm and not fake_worker
                                           and config.num_processes == 1})
    if fake_worker:
        from tests.helpers import fake_workers

        manager = JobManager(settings, worker_target=getattr(fake_workers, fake_worker)).start()
    else:
        manager = JobManager(settings).start()
    job = manager.submit(config)
    print(json.dumps({"job_id": job.id}), flush=True)
    announced = False
    with manager.subscribe(job.id) as stream:
        while True:
            event = stream.get(timeout=1)
            if event is None:
                continue
            if not announced and event.kind == "status" and event.data["status"] == "loading_model":
                manager.flush()
                print(json.dumps({"worker_pid": manager.get(job.id).worker_pid}), flush=True)
                announced = True
            print(json.dumps({"seq": event.seq, "kind": event.kind, **event.data}), flush=True)
            if event.is_end:
                break
    manager.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
