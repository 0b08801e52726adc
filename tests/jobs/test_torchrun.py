"""One job as two data-parallel ranks under torchrun (gloo on this CPU), watched like one process.

torchrun's rendezvous store listens on every interface, so where the machine
allows it (root) the jobs run in a private network namespace (`private_network`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.events import Completed, Progress, Resources
from tunestudio.jobs.executor import LocalExecutor, executor_for
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.jobs.supervisor import Supervisor
from tunestudio.jobs.torchrun import TorchrunExecutor, describe_rank_exit
from tunestudio.process import pid_alive
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import Run, job_config, run_job
from ..helpers.netns import private_network
from ..helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
PRIVATE = private_network()


def ddp(n: int = 2) -> TorchrunExecutor:
    return TorchrunExecutor(n, private_network=PRIVATE)


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _losses(run: Run) -> list[float]:
    return [e.loss for e in run.of(Progress) if e.loss is not None]


def test_the_executor_is_chosen_by_num_processes(tmp_path: Path) -> None:
    one = job_config("org/fake", tmp_path / "out")
    assert isinstance(executor_for(one, fake_workers.ignores_stop), LocalExecutor)
    assert isinstance(executor_for(one.model_copy(update={"num_processes": 2}), fake_workers.ignores_stop),
                      TorchrunExecutor)
    assert describe_rank_exit(1, -9) == "rank 1 killed by signal 9 (SIGKILL)"
    assert describe_rank_exit(0, 1) == "rank 0 exited with code 1"


@pytest.fixture(scope="module")
def ddp_and_single(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    """The same global batch (8) as 2 ranks x 4 and as 1 process x 8."""
    base = tmp_path_factory.mktemp("ddp")
    ddp_run = run_job(job_config(tiny_model, base / "ddp", num_processes=2, batch_size=4, max_steps=12),
                      executor=ddp(), log_path=base / "ddp.log")
    single = run_job(job_config(tiny_model, base / "single", batch_size=8, max_steps=12))
    return ddp_run, single


@pytest.mark.slow
def test_two_ranks_complete_like_one_process_and_the_adapter_loads_with_peft(
    ddp_and_single: tuple[Run, Run], tiny_model: Path
) -> None:
    ddp, single = ddp_and_single
    assert ddp.outcome.kind == "completed", ddp.failure
    assert len(ddp.of(Completed)) == 1  # rank 0 alone reports
    assert any("data parallel: 2 ranks (gloo), global batch 8" in m for m in ddp.messages()), ddp.messages()
    progress = [e for e in ddp.of(Progress) if e.loss is not None]
    assert [e.step for e in progress] == list(range(1, 13))
    assert all(e.global_batch_size == 8 for e in progress)
    assert progress[-1].tokens_per_second and progress[-1].num_tokens
    # Rank 0 samples the launcher's process tree: the launcher and both ranks (worker/resources.py); one process
    # samples itself.
    assert ddp.of(Resources) and max(s.processes for s in ddp.of(Resources)) >= 3, ddp.of(Resources)
    assert single.of(Resources) and all(s.rss_mb > 50 for s in single.of(Resources))
    # Both ranks' tokens are counted: as many as the one process saw on the same batches.
    single_progress = [e for e in single.of(Progress) if e.loss is not None]
    assert progress[-1].num_tokens == single_progress[-1].num_tokens
    # Same sampler seed, same global batches: the first loss agrees closely (the same batch, the same
    # weights), and the curves stay together; later steps drift a little on a CPU even between two runs
    # of one process (threaded reductions), so they are compared loosely.
    ddp_losses, single_losses = _losses(ddp), _losses(single)
    assert len(ddp_losses) == len(single_losses) == 12
    assert abs(ddp_losses[0] - single_losses[0]) <= 0.02 * single_losses[0], (ddp_losses, single_losses)
    tail = sum(ddp_losses[-3:]) / 3, sum(single_losses[-3:]) / 3
    assert abs(tail[0] - tail[1]) <= 0.2 * tail[1], (ddp_losses, single_losses)
    out = ddp.completed.output_dir
    assert json.loads((Path(out) / "job_config.json").read_text())["num_processes"] == 2
    script = f"""
from peft import PeftModel
from transformers import AutoModelForCausalLM
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(tiny_model)!r}), {out!r})
print("LOADED", sum(p.numel() for n, p in model.named_parameters() if "lora_" in n))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split("LOADED")[1]) > 0


@pytest.mark.slow
def test_stop_with_save_then_resume_with_one_process(tiny_model: Path, tmp_path: Path) -> None:
    """Through the manager, as a user does it: a 2-rank job stopped with save resumes on 1 process."""
    with JobManager(Settings(home=tmp_path / "home", private_network=PRIVATE)) as manager:
        job = manager.submit(job_config(tiny_model, tmp_path / "home" / "out", num_processes=2, batch_size=4,
                                        max_steps=60))
        wait_until(lambda: (manager.get(job.id).progress or {}).get("step", 0) >= 3, 240, "step 3")
        manager.stop(job.id, save=True)
        stopped = _wait_end(manager, job.id)
        assert stopped.status is JobStatus.stopped, stopped.error
        checkpoint = Path(stopped.checkpoint or "")
        step = int(checkpoint.name.split("-")[1])
        assert 3 <= step < 60
        # Both ranks stopped at the same boundary: one checkpoint, and each rank's RNG state in it.
        assert [p.name for p in checkpoint.parent.glob("checkpoint-*")] == [checkpoint.name]
        assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step

        resumed = manager.resume(job.id, num_processes=1)
        final = _wait_end(manager, resumed.id)
        assert final.status is JobStatus.completed, final.error
        assert final.config.num_processes == 1
        steps = [r["step"] for r in manager.metrics(resumed.id) if r["loss"] is not None]
        assert steps[0] == step + 1 and steps[-1] == 60


def _wait_end(manager: JobManager, job_id: str, timeout: float = 400) -> Job:
    wait_until(lambda: manager.get(job_id).status.is_terminal, timeout, f"job {job_id} to end")
    return manager.get(job_id)


@pytest.mark.slow
def test_the_launcher_and_every_rank_die_with_the_manager(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "home" / "out", num_processes=2, batch_size=4, max_steps=500)
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps(cfg.public_dict()))
    launcher = None
    ranks: set[int] = set()
    with subprocess.Popen([sys.executable, "-m", "tests.helpers.manager_proc", str(tmp_path / "home"),
                           str(config_file)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "TUNESTUDIO_PRIVATE_NETWORK": "1" if PRIVATE else "0"}) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                item = json.loads(line)
                launcher = item.get("worker_pid", launcher)
                if item.get("kind") == "progress" and item.get("step", 0) >= 2:
                    break
            assert launcher
            ranks = set(TorchrunExecutor.children_of(launcher))
            os.kill(proc.pid, signal.SIGKILL)  # the whole manager process dies at once
        finally:
            proc.kill()
    assert len(ranks) == 2
    wait_until(lambda: not any(pid_alive(p) for p in {launcher, *ranks}), 10, "the launcher and the ranks gone")


@pytest.mark.slow
def test_sigkill_of_one_rank_fails_the_job_naming_it_and_nothing_is_left(tiny_model: Path, tmp_path: Path) -> None:
    ranks: dict[int, int] = {}

    def kill_rank_1_at_step_2(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 2 and not ranks:
            assert isinstance(sup.executor, TorchrunExecutor)
            ranks.update({_rank_of(pid): pid for pid in sup.executor.rank_pids()})
            subprocess.run(["kill", "-9", str(ranks[1])], check=True)

    # Ended by the death, not by a collective's timeout: that would run into run_job's deadline.
    run = run_job(job_config(tiny_model, tmp_path / "out", num_processes=2, batch_size=4, max_steps=500),
                  kill_rank_1_at_step_2, executor=ddp())
    assert run.outcome.kind == "failed"
    # The cause first; rank 0 usually saw the broken collective before torchrun noticed the death.
    assert run.outcome.message.startswith("rank 1 killed by signal 9 (SIGKILL)"), run.outcome.message
    assert set(ranks) == {0, 1}
    wait_until(lambda: not any(pid_alive(p) for p in ranks.values()), 10, "every rank gone")


@pytest.mark.slow
def test_cancel_leaves_no_process_of_the_job(tiny_model: Path, tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    def cancel_at_step_2(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 2 and "ranks" not in seen:
            assert isinstance(sup.executor, TorchrunExecutor)
            seen["ranks"] = sup.executor.rank_pids()
            seen["launcher"] = sup.pid
            sup.cancel()

    run = run_job(job_config(tiny_model, tmp_path / "out", num_processes=2, batch_size=4, max_steps=500),
                  cancel_at_step_2, executor=ddp(), stop_grace_seconds=20)
    # An orderly cancel: every rank took the agreed stop at one step boundary, no signal was needed.
    assert run.outcome.kind == "cancelled" and run.outcome.message == "cancelled", run.outcome
    pids = [seen["launcher"], *seen["ranks"]]  # type: ignore[misc]
    assert len(pids) == 3
    wait_until(lambda: not any(pid_alive(p) for p in pids), 10, "the launcher and every rank gone")
    for pid in pids:  # their process groups are gone too
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
