"""Jobs on a real one-node Ray cluster, run inside a private network namespace (see tests/jobs/test_ray.py).

`python -m tests.helpers.ray_cluster MODEL WORKDIR` starts `ray start --head` on
127.0.0.1 (no dashboard, usage stats off, its own temp folder), runs a job to
completion and one cancelled mid-way through `RayExecutor`, stops the cluster,
and prints one JSON line of what it saw.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tunestudio.events import Progress
from tunestudio.jobs.ray_cluster import RayExecutor
from tunestudio.jobs.supervisor import Supervisor

from .jobs import job_config, run_job
from .wait import wait_until

RAY = str(Path(sys.executable).parent / "ray")
PORT = 6390


def _job_processes() -> list[str]:
    """Processes of a tunestudio Ray job: its driver, its train workers, its queues."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines()
            if "tunestudio.worker.ray_job" in line or "RayTrainWorker" in line or "_QueueActor" in line]


def main(model: str, workdir: str) -> None:
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    address = f"127.0.0.1:{PORT}"
    subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={PORT}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                   check=True, capture_output=True, timeout=180)
    seen: dict[str, object] = {}
    try:
        done = run_job(job_config(model, Path(workdir) / "done", num_processes=2, batch_size=4, max_steps=5),
                       executor=RayExecutor(2, address), log_path=Path(workdir) / "done.log", timeout=400)
        seen["done"] = {"kind": done.outcome.kind, "message": done.outcome.message,
                        "steps": [s for s, _ in done.losses],
                        "global_batch": [e.global_batch_size for e in done.of(Progress)][-1:],
                        "adapter": (Path(workdir) / "done" / "adapter_model.safetensors").is_file()}

        def cancel_at_step_2(sup: Supervisor, event: object) -> None:
            if isinstance(event, Progress) and event.step == 2 and "live" not in seen:
                seen["live"] = len(_job_processes())
                sup.cancel()

        cancelled = run_job(job_config(model, Path(workdir) / "cancel", num_processes=2, batch_size=4,
                                       max_steps=500), cancel_at_step_2, executor=RayExecutor(2, address),
                            log_path=Path(workdir) / "cancel.log", timeout=400, stop_grace_seconds=60)
        seen["cancel"] = {"kind": cancelled.outcome.kind, "message": cancelled.outcome.message}
        with contextlib.suppress(AssertionError):  # what is left is reported, not raised
            wait_until(lambda: not _job_processes(), 60, "the job's Ray actors gone")
        seen["left"] = _job_processes()
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    start = time.monotonic()
    main(sys.argv[1], sys.argv[2])
    print(f"took {time.monotonic() - start:.0f}s", flush=True)
