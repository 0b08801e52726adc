"""The chat panel's settings over HTTP, against a real server, trained job and inference worker: a job's
checkpoints as `<id>:step-N` models, its chat template read from its files, and the exact prompt the worker
gives the model (a render, nothing generated)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tunestudio.api.routes.chat import weight_choices
from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.chat import PROMPT, ChatHome, add_saved_step
from ..helpers.jobs import DATA
from ..helpers.server import running_server

pytestmark = pytest.mark.timeout(900)  # the first chat-job module of a session waits for its training
SYSTEM = "You answer like a farmer."


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    """The chat job with a saved step, checkpoint-20."""
    add_saved_step(chat_home.job, 20)
    return chat_home.job


@pytest.fixture(scope="module")
def server(job: Job, chat_home: ChatHome) -> Iterator[str]:
    with running_server(Settings(home=chat_home.home, dataset_roots=[DATA])) as url:
        yield url


def test_a_jobs_chat_settings_list_its_weights_and_its_template(server: str, job: Job) -> None:
    answer = httpx.get(f"{server}/api/jobs/{job.id}/chat", timeout=30)
    assert answer.status_code == 200, answer.text
    settings = answer.json()
    assert [(m["id"], m["step"]) for m in settings["models"]] == [(job.id, None), (f"{job.id}:step-20", 20)]
    assert settings["base"] == f"{job.id}:base"
    template_file = Path(settings["template_file"])
    assert template_file.parent == Path(job.output_dir or "") and settings["template"] == template_file.read_text()
    assert httpx.get(f"{server}/api/jobs/nope/chat", timeout=30).status_code == 404


def test_a_saved_step_answers_under_its_own_id_and_models_stays_as_it_was(server: str, job: Job) -> None:
    ask = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0}
    final = httpx.post(f"{server}/v1/chat/completions", json={"model": job.id, **ask}, timeout=300)
    step = httpx.post(f"{server}/v1/chat/completions", json={"model": f"{job.id}:step-20", **ask}, timeout=300)
    assert final.status_code == 200 and step.status_code == 200, step.text
    assert step.json()["model"] == f"{job.id}:step-20"
    # the same weights (copied): the same greedy answer
    assert step.json()["choices"][0]["message"] == final.json()["choices"][0]["message"]
    missing = httpx.post(f"{server}/v1/chat/completions", json={"model": f"{job.id}:step-7", **ask}, timeout=60)
    assert missing.status_code == 404 and "checkpoint-7" in missing.json()["error"]["message"]
    listed = {m["id"] for m in httpx.get(f"{server}/v1/models", timeout=30).json()["data"]}
    assert {job.id, f"{job.id}:base"} <= listed and not any(":step-" in m for m in listed)


def test_the_prompt_the_model_saw_comes_from_the_worker_with_the_system_prompt(server: str, job: Job) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    answer = httpx.post(f"{server}/api/chat/prompt", json={"model": job.id, "messages": messages}, timeout=300)
    assert answer.status_code == 200, answer.text
    rendered = answer.json()
    assert rendered["prompt"].endswith(f"<|system|>{SYSTEM}<|end|><|user|>{PROMPT}<|end|><|assistant|>")
    assert rendered["template"] == (Path(job.output_dir or "") / "chat_template.jinja").read_text()
    chat = httpx.post(f"{server}/v1/chat/completions", json={"model": job.id, "messages": messages,
                                                              "max_tokens": 1}, timeout=300)
    assert chat.json()["usage"]["prompt_tokens"] == rendered["prompt_tokens"]  # what the answer was given

    unknown = httpx.post(f"{server}/api/chat/prompt", json={"model": "nope", "messages": messages}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["detail"]["field"] == "model"


def test_the_best_step_is_named_and_an_unfinished_jobs_weights_are_its_newest_checkpoint() -> None:
    best = {"step": 20, "metric": "eval_loss", "value": 0.81234, "checkpoint": "/out/checkpoint-20"}
    finished = weight_choices("j", True, True, [10, 20, 30], best)
    assert [(c.id, c.label) for c in finished] == [("j", "final weights"), ("j:step-30", "step 30"),
                                                   ("j:step-20", "best: step 20 (eval_loss 0.8123)"),
                                                   ("j:step-10", "step 10")]
    interrupted = weight_choices("j", True, False, [10], {})
    assert [c.label for c in interrupted] == ["newest checkpoint", "step 10"]
    assert weight_choices("j", False, False, [], {}) == []
