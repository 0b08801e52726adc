"""Jobs on a real two-node Ray cluster that shares no disk with the studio (see tests/jobs/test_ray.py).

`python -m tests.helpers.ray_cluster MODEL WORKDIR` runs inside private network and PID namespaces
(`unshare -n -p -f --mount-proc`: only loopback; every process it starts dies with it). It is the studio: a
JobManager on WORKDIR/home, and the head node of a cluster (`ray start --head`, no CPU of its own, as the
studio's machine joins a cluster). The other node is "the cluster": `ray start` inside a mount namespace of its
own with a fresh tmpfs over /tmp, HOME and working directory in it. Everything of the studio's lies under /tmp
(the data directory, the job's copies of the model and the dataset, the output folders): that node cannot open
any of it, and what it writes to such a path would stay in its tmpfs, where this helper looks (through
/proc/PID/root). /var/tmp, which both nodes see, stands for a bucket (TUNESTUDIO_RAY_STORAGE).

It runs, on the hidden node: a 1-rank job cancelled at step 1 while its rank is frozen (its driver is killed after
the grace period, Ray ends the rank, whose copy of the inputs stays on the node until the next rank there sweeps
it); a 1-rank job whose dataset has a broken row (the rank fails); a 2-rank job stopped with save at step 2; then a
job whose dataset is too large to ship; the stopped job's resume, one rank on each node, through a storage URI. One
JSON line of what it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tunestudio import ownership
from tunestudio.api.schemas import JobOut
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from .jobs import DATA, job_config
from .wait import wait_until

RAY = str(Path(sys.executable).parent / "ray")
PORT = 6390
ADDRESS = f"127.0.0.1:{PORT}"
STORE = 100_000_000  # each node's object store: the studio ships at most half of it
HIDDEN_NODE = (
    "mount -t tmpfs tmpfs /tmp && mkdir -p /tmp/home && cd /tmp/home && "
    f"HOME=/tmp/home TMPDIR=/tmp exec {RAY} start --address={ADDRESS} --node-ip-address=127.0.0.1 --num-cpus=2 "
    f"--object-store-memory={STORE} --disable-usage-stats --temp-dir=/tmp/ray "
    """--resources='{"remote": 2, "trainer": 1}'"""
)


def _job_processes() -> list[str]:
    """Processes of a tunestudio Ray job: its driver, its train workers, its mailbox (its queues), and Ray Train's
    placement-group cleaner of its run (a detached actor: it outlives the driver unless the run ends cleanly)."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines()
            if any(name in line for name in ("tunestudio.worker.ray.job", "RayTrainWorker", "ray::Mailbox",
                                             "ray::PlacementGroupCleaner"))]


def _mount_ns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _train_worker_pids() -> dict[int, bool]:
    """Each training worker now running: whether it runs on the hidden node (in its mount namespace)."""
    mine = _mount_ns("self")
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if b"RayTrainWorker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found[int(pid)] = _mount_ns(pid) not in (mine, "")
    return found


def _loaded(pid: int, library: str) -> bool:
    """Whether a library's files are mapped into a process (bitsandbytes maps its native library on import)."""
    with contextlib.suppress(OSError):
        return f"/{library}/" in Path(f"/proc/{pid}/maps").read_text()
    return False


def _train_workers() -> list[bool]:
    """For each training worker now running: whether it runs on the hidden node."""
    return sorted(_train_worker_pids().values())


def _hidden_pid() -> int:
    """A process of the hidden node (its raylet), to look at that node's filesystem through /proc/PID/root."""
    mine = _mount_ns("self")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes() and _mount_ns(pid) not in (mine, ""):
                return int(pid)
    raise AssertionError("no raylet in another mount namespace: the hidden node did not start")


def _end(manager: JobManager, job_id: str, timeout: float = 400) -> Job:
    wait_until(lambda: manager.get(job_id).status.is_terminal, timeout, f"job {job_id} to end", every=0.2)
    return manager.get(job_id)


def _at_step(manager: JobManager, job_id: str, step: int) -> None:
    """Until the job reached `step` (or ended: the caller's checks then say how)."""
    def reached() -> bool:
        job = manager.get(job_id)
        return (job.progress or {}).get("step", 0) >= step or job.status.is_terminal

    wait_until(reached, 400, f"job {job_id} at step {step}", every=0.1)


def _ray_logs(job: Job) -> list[str]:
    """The driver's own lines in the job's log file (the page shows it)."""
    text = Path(job.log_path or "").read_text(errors="replace") if job.log_path else ""
    return [line.split("] ", 1)[1] for line in text.splitlines() if "] ray: " in line]


def _settings(home: Path, **ray: Any) -> Settings:
    return Settings(home=home, executor="ray", ray_address=ADDRESS, prewarm=False, **ray)


def _stopped_job(manager: JobManager, model: Path, dataset: Path, home: Path) -> dict[str, Any]:
    """Two ranks on the hidden node, stopped with save at step 2: the checkpoint and the artefacts come back."""
    job = manager.submit(job_config(model, home / "stopped", local_datasets=[str(dataset)], num_processes=2,
                                    batch_size=4, max_steps=60, save_steps=20))
    _at_step(manager, job.id, 2)
    workers = _train_workers()
    bitsandbytes = [_loaded(pid, "bitsandbytes") for pid in _train_worker_pids()]
    manager.stop(job.id, save=True)
    done = _end(manager, job.id)
    out = Path(done.output_dir or "")
    text = Path(done.log_path or "").read_text(errors="replace") if done.log_path else ""
    return {"id": job.id, "status": done.status.value, "error": done.error, "output_dir": str(out),
            "checkpoint": done.checkpoint, "workers_hidden": workers, "bitsandbytes_loaded": bitsandbytes,
            # how often each rank's model line is in the job's log, and any disassembled code there
            "model_lines": sorted(Counter(line.split("[info] model: ")[0] for line in text.splitlines()
                                          if "[info] model: " in line).values()),
            "disassembly": len(re.findall(r"\b(?:LOAD_FAST|LOAD_CONST|RETURN_VALUE)\b", text)),
            "ray_lines": text.count("(RayTrainWorker pid="),  # a rank's lines, as Ray's driver prints them
            "escapes": text.count("\x1b["),
            "blind_cleaner": text.count("State API may be temporarily unavailable"),
            "files": sorted(p.name for p in out.iterdir()) if out.is_dir() else [],
            "owned": sorted(p.name for p in ownership.files(out, job.id)),
            "model_in_job_config": json.loads((out / "job_config.json").read_text())["model_name"]
            if (out / "job_config.json").is_file() else None,
            "logs": _ray_logs(done)}


def _stages(hidden: str) -> list[str]:
    """The stage folders (and lock files) on the hidden node: its copies of the inputs of each run."""
    stages = Path(hidden + "/tmp/tunestudio-ray")
    return sorted(p.name for p in stages.iterdir()) if stages.is_dir() else []


def _cancelled_job(manager: JobManager, model: Path, dataset: Path, home: Path, hidden: str) -> dict[str, Any]:
    """One rank on the hidden node, cancelled at step 1 while it is busy (frozen: SIGSTOP, as in a long step or
    save), so it cannot stop within the grace period: the driver gets SIGTERM and Ray ends the rank."""
    job = manager.submit(job_config(model, home / "cancelled", local_datasets=[str(dataset)], max_steps=500))
    _at_step(manager, job.id, 1)
    running = _stages(hidden)
    for pid in _train_worker_pids():
        os.kill(pid, signal.SIGSTOP)
    manager.cancel(job.id)
    done = _end(manager, job.id)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not _job_processes(), 60, "the cancelled job's Ray actors gone", every=0.2)
    return {"status": done.status.value, "message": done.message, "error": done.error,
            "stages_running": running, "left": _job_processes(), "stages_after": _stages(hidden)}


def _failing_job(manager: JobManager, model: Path, bad: Path, home: Path) -> dict[str, Any]:
    """One rank on the hidden node that fails: a row of its dataset is not JSON."""
    job = manager.submit(job_config(model, home / "failing", local_datasets=[str(bad)], max_steps=5))
    done = _end(manager, job.id)
    return {"status": done.status.value, "message": done.message, "error": done.error, "logs": _ray_logs(done)}


def _resumed_job(manager: JobManager, stopped_id: str, bucket: Path) -> dict[str, Any]:
    """The resume, one rank on each node (a resource each has one of), through a storage URI."""
    job = manager.resume(stopped_id)
    workers: list[bool] = []

    def seen_workers() -> bool:
        workers[:] = _train_workers()
        return len(workers) == 2 or manager.get(job.id).status.is_terminal

    wait_until(seen_workers, 400, "the resumed job's two training workers", every=0.2)
    done = _end(manager, job.id)
    out = Path(done.output_dir or "")
    adapter = json.loads((out / "adapter_config.json").read_text()) if (out / "adapter_config.json").is_file() \
        else {}
    return {"id": job.id, "status": done.status.value, "error": done.error, "output_dir": str(out),
            "workers_hidden": workers, "steps": [r["step"] for r in manager.metrics(job.id) if r["loss"] is not None],
            "files": sorted(p.name for p in out.iterdir()) if out.is_dir() else [],
            "adapter_base": adapter.get("base_model_name_or_path"),
            "bucket": sorted(str(p.relative_to(bucket)) for p in bucket.glob("*/*")),
            "storage": JobOut.of(done, with_artefacts=False).storage, "logs": _ray_logs(done)}


def main(model: str, workdir: str) -> None:
    work = Path(workdir)
    home = work / "home"
    # The studio's own copies of the inputs, under /tmp: the hidden node cannot see them.
    studio_model = work / "inputs" / "tiny-model"
    shutil.copytree(model, studio_model)
    dataset = work / "inputs" / "alpaca.jsonl"
    shutil.copy(DATA / "alpaca.jsonl", dataset)
    bad = work / "inputs" / "broken.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a",\n')
    huge = work / "inputs" / "huge.jsonl"
    with huge.open("wb") as fh:  # sparse: its size counts, nothing is written
        fh.truncate(STORE // 2 + (4 << 20))
    bucket = Path(tempfile.mkdtemp(prefix="tunestudio-bucket-", dir="/var/tmp"))
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    bookkeeping = set(Path(tempfile.gettempdir()).glob("tunestudio-ray-train-*"))  # Ray Train's, of each driver
    seen: dict[str, Any] = {"seconds": {}}
    clock = time.monotonic()

    def lap(name: str) -> None:  # how long each part took, printed with the result (the suite's slowest test)
        nonlocal clock
        seen["seconds"][name] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()

    try:
        subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={PORT}", "--num-cpus=0",
                        f"--object-store-memory={STORE}", "--include-dashboard=false", "--disable-usage-stats",
                        f"--temp-dir={temp}", """--resources={"trainer": 1}"""],
                       check=True, capture_output=True, timeout=180)
        subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", HIDDEN_NODE],
                       check=True, capture_output=True, timeout=180)
        hidden = f"/proc/{_hidden_pid()}/root"
        seen["hidden_sees_studio"] = Path(hidden + str(work)).exists()
        lap("cluster")

        # A cancel's grace period of 0.1s: a rank that does not stop by then has its driver sent SIGTERM, and its
        # run aborted; SIGKILL only 30 s later (5 s by default), so that a loaded machine cannot cut that short.
        with JobManager(_settings(home, ray_worker_resources={"remote": 1}, stop_grace_seconds=0.1,
                                  kill_after_seconds=30)) as manager:
            seen["cancelled"] = _cancelled_job(manager, studio_model, dataset, home, hidden)
            lap("cancelled")
            seen["failing"] = _failing_job(manager, studio_model, bad, home)
            lap("failing")
            seen["stopped"] = _stopped_job(manager, studio_model, dataset, home)
            lap("stopped")
            seen["stages_after_stopped"] = _stages(hidden)  # its ranks swept the cancelled job's copy
            big = manager.submit(job_config(studio_model, home / "huge", local_datasets=[str(huge)]))
            seen["too_large"] = _end(manager, big.id).model_dump(include={"status", "error"}, mode="json")
            lap("too_large")
        with JobManager(_settings(home, ray_worker_resources={"trainer": 1}, ray_storage=f"file://{bucket}")) \
                as manager:
            seen["resumed"] = _resumed_job(manager, seen["stopped"]["id"], bucket)
            lap("resumed")
        with contextlib.suppress(AssertionError):  # what is left is reported, not raised
            wait_until(lambda: not _job_processes(), 60, "the jobs' Ray actors gone", every=0.2)
        seen["left"] = _job_processes()
        seen["bookkeeping_left"] = sorted(map(str, set(Path(tempfile.gettempdir()).glob("tunestudio-ray-train-*"))
                                              - bookkeeping))
        lap("actors_gone")
        # What the hidden node holds of the studio's paths (nothing, if no rank wrote there) and of its stages.
        seen["hidden_has_studio"] = Path(hidden + str(work)).exists()
        seen["hidden_stages_left"] = _stages(hidden)
    finally:
        # Every Ray process dies with this PID namespace; its files go here.
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(bucket, ignore_errors=True)
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    start = time.monotonic()
    main(sys.argv[1], sys.argv[2])
    print(f"took {time.monotonic() - start:.0f}s", flush=True)
