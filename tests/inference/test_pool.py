"""The inference pool and its worker process: real processes, a real trained job."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunestudio.inference import GenerateParams, InferencePool, InferenceUnavailable, ModelSpec, chat_models, resolve
from tunestudio.inference.models import SLACK_S, UnknownModel, WeightsReplaced, spec_for, weights_folder
from tunestudio.inference.pool import threads_for
from tunestudio.jobs.executor import inference_executor
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job, JobNotFound
from tunestudio.process import pid_alive
from tunestudio.settings import Settings

from ..helpers.chat import PROMPT, ChatHome, train_chat_job
from ..helpers.checkpoints import write_checkpoint
from ..helpers.wait import wait_until

MESSAGES = [{"role": "user", "content": PROMPT}]
# The first chat test of the session waits for its training job (minutes on a busy 2-core machine): a generous
# hard timeout.
pytestmark = pytest.mark.timeout(900)
GREEDY = GenerateParams(temperature=0, max_tokens=40)


@pytest.fixture(scope="module")
def home(chat_home: ChatHome) -> Path:
    return chat_home.home


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


@pytest.fixture(scope="module")
def spec(job: Job, home: Path) -> ModelSpec:
    manager = JobManager(Settings(home=home))
    try:
        return resolve(manager, job.id)
    finally:
        manager.close()


def test_specs_point_at_the_jobs_weights(spec: ModelSpec, job: Job, home: Path) -> None:
    assert (spec.kind, spec.weights, spec.tokenizer, spec.base) == ("adapter", job.output_dir, job.output_dir, False)
    manager = JobManager(Settings(home=home))
    try:
        assert resolve(manager, f"{job.id}:base").base
    finally:
        manager.close()


def test_idle_worker_is_unloaded_and_comes_back_on_demand(spec: ModelSpec, job: Job, home: Path) -> None:
    pool = InferencePool(Settings(home=home, inference_idle_seconds=0.5), inference_executor)
    try:
        first = "".join(pool.generate(spec, MESSAGES, GREEDY))
        pid = pool.status()["pid"]
        wait_until(lambda: pool.status()["state"] == "stopped", 30)
        assert not pid_alive(pid)  # the process is gone, not just forgotten
        assert "".join(pool.generate(spec, MESSAGES, GREEDY)) == first
        assert pool.status()["starts"] == 2
    finally:
        pool.close()
    assert first.strip() == job.result["samples"][0]["after"]


def test_bad_requests_fail_alone_and_the_worker_lives_on(spec: ModelSpec, home: Path) -> None:
    pool = InferencePool(Settings(home=home), inference_executor)
    try:
        gone = ModelSpec(**{**spec.__dict__, "weights": str(home / "no-such-output"), "job_id": "gone"})
        with pytest.raises(InferenceUnavailable) as caught:
            list(pool.generate(gone, MESSAGES, GREEDY))
        assert caught.value.status == 409 and "no-such-output" in str(caught.value)
        too_long = [{"role": "user", "content": "apple " * 600}]  # the tiny model's context is 512 tokens
        with pytest.raises(InferenceUnavailable) as caught:
            list(pool.generate(spec, too_long, GREEDY))
        assert caught.value.code == "context_length_exceeded"
        generation = pool.generate(spec, MESSAGES, GREEDY)
        assert "".join(generation) and generation.result().finish_reason in ("stop", "length")
        assert pool.status()["starts"] == 1 and pool.status()["crashes"] == 0
    finally:
        pool.close()


def test_a_cancel_stops_the_generation_between_tokens(spec: ModelSpec, home: Path) -> None:
    pool = InferencePool(Settings(home=home), inference_executor)
    try:
        generation = pool.generate(spec, MESSAGES, GenerateParams(max_tokens=400, min_tokens=400))
        deltas = iter(generation)
        next(deltas)
        generation.cancel()
        list(deltas)
        done = generation.result()
        assert done.finish_reason == "cancelled" and done.completion_tokens < 400
    finally:
        pool.close()


def test_sampling_with_a_seed_repeats(spec: ModelSpec, home: Path) -> None:
    pool = InferencePool(Settings(home=home), inference_executor)
    try:
        params = GenerateParams(temperature=1.5, top_p=0.95, max_tokens=30, seed=11)
        answers = {"".join(pool.generate(spec, MESSAGES, params)) for _ in range(2)}
        assert len(answers) == 1
    finally:
        pool.close()


def test_requests_queued_behind_a_dying_one_go_to_the_next_worker(spec: ModelSpec, job: Job, home: Path) -> None:
    pool = InferencePool(Settings(home=home), inference_executor)
    try:
        in_flight = pool.generate(spec, MESSAGES, GenerateParams(max_tokens=400, min_tokens=400))
        deltas = iter(in_flight)
        next(deltas)  # the worker is answering it
        queued = [pool.generate(spec, MESSAGES, GREEDY) for _ in range(2)]  # sent to the worker, not begun
        cancelled = pool.generate(spec, MESSAGES, GREEDY)
        cancelled.cancel()  # sent, then cancelled before it began: answered as cancelled, not sent again
        os.kill(pool.status()["pid"], signal.SIGKILL)
        with pytest.raises(InferenceUnavailable) as caught:
            list(deltas)
        assert caught.value.status == 503 and caught.value.code == "inference_worker_died"
        assert ["".join(g).strip() for g in queued] == [job.result["samples"][0]["after"]] * 2
        assert cancelled.result().finish_reason == "cancelled"
        assert (pool.status()["starts"], pool.status()["crashes"]) == (2, 1)
    finally:
        pool.close()


def test_the_worker_dies_with_its_parent(spec: ModelSpec, home: Path, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(f"""
import sys, time
from tunestudio.inference import GenerateParams, InferencePool, ModelSpec
from tunestudio.jobs.executor import inference_executor
from tunestudio.settings import Settings

if __name__ == "__main__":
    pool = InferencePool(Settings(home={str(home)!r}), inference_executor)
    spec = ModelSpec(**{spec.__dict__!r})
    "".join(pool.generate(spec, [{{"role": "user", "content": "hi"}}], GenerateParams(max_tokens=2)))
    print(pool.status()["pid"], flush=True)
    time.sleep(600)
""")
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as parent:
        try:
            worker = int(parent.stdout.readline())
            assert pid_alive(worker)
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait(10)
            wait_until(lambda: not pid_alive(worker), 15, "the worker's end")
        finally:
            parent.kill()


def test_threads_share_the_cpu_with_training(spec: ModelSpec, home: Path) -> None:
    assert threads_for(False, cores=8) == 8
    assert threads_for(True, cores=8) == 4
    assert threads_for(True, cores=1) == 1
    training = [True]
    pool = InferencePool(Settings(home=home), inference_executor, training_active=lambda: training[0])
    try:
        generation = pool.generate(spec, MESSAGES, GenerateParams(max_tokens=2))
        list(generation)
        assert generation.started is not None and generation.started.threads == threads_for(True)
    finally:
        pool.close()


def _job(tmp_path: Path, status: str, **fields: object) -> Job:
    return Job.model_validate({"id": "j1", "status": status, "config": {"model_name": "base-model"},
                               "created_at": 0.0, **fields})


def test_which_folder_answers_for_each_status(tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "out" / "checkpoint-5"
    write_checkpoint(out, 5)  # a complete one: state, weights, optimizer (tunestudio.checkpoints)
    (checkpoint / "adapter_config.json").write_text("{}")
    # Interrupted: its newest checkpoint, found in the output folder when the record has none.
    assert weights_folder(_job(tmp_path, "interrupted", output_dir=str(out))) == checkpoint
    assert spec_for(_job(tmp_path, "interrupted", output_dir=str(out)), base=True).tokenizer == "base-model"
    # Stopped without final artefacts: the checkpoint too; once the output holds a model, the output.
    assert weights_folder(_job(tmp_path, "stopped", output_dir=str(out))) == checkpoint
    (out / "config.json").write_text("{}")
    (out / "tokenizer_config.json").write_text("{}")
    spec = spec_for(_job(tmp_path, "completed", output_dir=str(out)), base=False)
    assert (spec.weights, spec.kind, spec.tokenizer) == (str(out), "full", str(out))
    for status in ("failed", "cancelled", "training", "queued"):
        assert weights_folder(_job(tmp_path, status, output_dir=str(out))) is None


@pytest.fixture(scope="module")
def full_job(tiny_model: Path, home: Path) -> Job:
    return train_chat_job(tiny_model, home, training_type="full", max_steps=10, save_steps=5, learning_rate=1e-3,
                          output_dir=str(home / "full-job"))


def test_a_full_fine_tune_and_its_checkpoint_answer_beside_the_base(full_job: Job, home: Path) -> None:
    manager = JobManager(Settings(home=home))
    try:
        tuned, base = resolve(manager, full_job.id), resolve(manager, f"{full_job.id}:base")
    finally:
        manager.close()
    assert tuned.kind == "full" and tuned.weights == full_job.output_dir
    checkpoint = ModelSpec(**{**tuned.__dict__, "weights": str(Path(full_job.output_dir) / "checkpoint-5")})
    pool = InferencePool(Settings(home=home), inference_executor)
    try:
        answers = {name: "".join(pool.generate(spec, MESSAGES, GREEDY)).strip()
                   for name, spec in (("tuned", tuned), ("base", base), ("checkpoint", checkpoint))}
    finally:
        pool.close()
    sample = full_job.result["samples"][0]
    assert (answers["base"], answers["tuned"]) == (sample["before"], sample["after"])
    assert answers["checkpoint"]  # a checkpoint folder loads as a model of its own


def test_weights_rewritten_on_disk_load_again(full_job: Job, tiny_model: Path, home: Path, tmp_path: Path) -> None:
    """A folder whose weights change (another job's run into it) answers with what it holds now, not the cache."""
    folder = tmp_path / "out"
    shutil.copytree(full_job.output_dir, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    job = full_job.model_copy(update={"output_dir": str(folder), "checkpoint": None})
    sample = full_job.result["samples"][0]
    pool = InferencePool(Settings(home=home), inference_executor)
    try:
        tuned = spec_for(job, base=False)
        assert "".join(pool.generate(tuned, MESSAGES, GREEDY)).strip() == sample["after"]
        # The base model's weights now, as a new file (a file rewritten in place would change what a worker has
        # memory-mapped from it, cached or not).
        shutil.copy(Path(tiny_model) / "model.safetensors", folder / "new.tmp")
        os.replace(folder / "new.tmp", folder / "model.safetensors")
        rewritten = spec_for(job, base=False)
        assert rewritten.fingerprint != tuned.fingerprint
        assert "".join(pool.generate(rewritten, MESSAGES, GREEDY)).strip() == sample["before"]
    finally:
        pool.close()


def test_replaced_weights_and_exports_are_no_chat_models(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "adapter_config.json").write_text("{}")
    (out / "adapter_model.safetensors").write_text("first")
    ended = time.time() + 1
    first = _job(tmp_path, "completed", output_dir=str(out), finished_at=ended)
    second = first.model_copy(update={"id": "j2", "created_at": 5.0})
    export = first.model_copy(update={"id": "e1", "kind": "export", "source_job": "j1"})
    manager = _Jobs(first, second, export)
    assert resolve(manager, "j1").fingerprint  # its weights' names, sizes and times: the worker's cache key
    # newest first, no export; a completed job also by its ft: name (OpenAI's fine-tuning API)
    assert [m.id for m in chat_models(manager)] == ["j2", "j2:base", "ft:base-model::j2", "j1", "j1:base",
                                                    "ft:base-model::j1"]
    for model_id in ("e1", "e1:base"):
        with pytest.raises(UnknownModel, match="job e1 is an export; chat with its source job j1") as caught:
            resolve(manager, model_id)
        assert caught.value.status == 404
    later = ended + SLACK_S + 5
    os.utime(out / "adapter_model.safetensors", (later, later))  # written after j1 ended: j2's
    with pytest.raises(WeightsReplaced, match=r"job j1's weights in .* were replaced by a later job \(j2\)") as caught:
        resolve(manager, "j1:base")
    assert caught.value.status == 409


class _Jobs:
    """What resolve() and chat_models() ask of a JobManager."""

    def __init__(self, *jobs: Job) -> None:
        self.jobs = {job.id: job for job in jobs}

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise JobNotFound(job_id)
        return self.jobs[job_id]

    def list(self, status: list | None = None, limit: int = 50) -> list[Job]:
        jobs = sorted(self.jobs.values(), key=lambda j: j.created_at, reverse=True)
        return [j for j in jobs if status is None or j.status in status][:limit]
