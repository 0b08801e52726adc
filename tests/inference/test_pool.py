"""The inference pool and its worker process: real processes, a real trained job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.inference import GenerateParams, InferencePool, InferenceUnavailable, ModelSpec, resolve
from tunestudio.inference.pool import threads_for
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.process import pid_alive
from tunestudio.settings import Settings

from ..helpers.chat import PROMPT, train_chat_job
from ..helpers.wait import wait_until

MESSAGES = [{"role": "user", "content": PROMPT}]
# The first test waits for the module's training job (minutes on a busy 2-core machine): a generous hard timeout.
pytestmark = pytest.mark.timeout(900)
GREEDY = GenerateParams(temperature=0, max_tokens=40)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pool") / "home"


@pytest.fixture(scope="module")
def job(tiny_model: Path, home: Path) -> Job:
    return train_chat_job(tiny_model, home)


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
    pool = InferencePool(Settings(home=home, inference_idle_seconds=0.5))
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
    pool = InferencePool(Settings(home=home))
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
    pool = InferencePool(Settings(home=home))
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
    pool = InferencePool(Settings(home=home))
    try:
        params = GenerateParams(temperature=1.5, top_p=0.95, max_tokens=30, seed=11)
        answers = {"".join(pool.generate(spec, MESSAGES, params)) for _ in range(2)}
        assert len(answers) == 1
    finally:
        pool.close()


def test_the_worker_dies_with_its_parent(spec: ModelSpec, home: Path, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(f"""
import sys, time
from tunestudio.inference import GenerateParams, InferencePool, ModelSpec
from tunestudio.settings import Settings

if __name__ == "__main__":
    pool = InferencePool(Settings(home={str(home)!r}))
    spec = ModelSpec(**{spec.__dict__!r})
    "".join(pool.generate(spec, [{{"role": "user", "content": "hi"}}], GenerateParams(max_tokens=2)))
    print(pool.status()["pid"], flush=True)
    time.sleep(600)
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert pid_alive(worker)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: not pid_alive(worker), 15)
    finally:
        parent.kill()
        parent.wait(10)


def test_threads_share_the_cpu_with_training(spec: ModelSpec, home: Path) -> None:
    assert threads_for(False, cores=8) == 8
    assert threads_for(True, cores=8) == 4
    assert threads_for(True, cores=1) == 1
    training = [True]
    pool = InferencePool(Settings(home=home), training_active=lambda: training[0])
    try:
        generation = pool.generate(spec, MESSAGES, GenerateParams(max_tokens=2))
        list(generation)
        assert generation.started is not None and generation.started.threads == threads_for(True)
    finally:
        pool.close()
