"""OpenAI's fine-tuning API with the real worker: the tiny model trained through OpenAI's client, then chatted
with as `ft:<base>:<suffix>:<job id>`; a DPO job from OpenAI's preference rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tunestudio.settings import Settings

from ..helpers.jobs import DATA
from ..helpers.server import running_server
from ..helpers.wait import wait_until

# Real training and a real inference worker on a busy 2-core machine: minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def client(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    home = tmp_path_factory.mktemp("fine-tuning") / "home"
    settings = Settings(home=home, model_roots=[tiny_model.parent])
    with running_server(settings) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                                         timeout=300) as client:
        yield client


def upload(client: openai.OpenAI, folder: Path, name: str, rows: list[dict]) -> str:
    path = folder / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with path.open("rb") as handle:
        return client.files.create(file=handle, purpose="fine-tune").id


def finished(client: openai.OpenAI, job_id: str) -> openai.types.fine_tuning.FineTuningJob:
    return wait_until(lambda: j if (j := client.fine_tuning.jobs.retrieve(job_id)).status in (
        "succeeded", "failed", "cancelled") else None, 700, f"job {job_id} to end", every=0.5)


def test_supervised_job_on_the_tiny_model_then_chat_with_its_ft_name(
        client: openai.OpenAI, tiny_model: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (DATA / "messages.jsonl").read_text().splitlines()[:32]]
    training = upload(client, tmp_path, "animals.jsonl", rows)
    created = client.fine_tuning.jobs.create(
        model=str(tiny_model), training_file=training, suffix="tiny", seed=7,
        hyperparameters={"n_epochs": 2, "batch_size": 8, "learning_rate_multiplier": 15})
    done = finished(client, created.id)
    assert done.status == "succeeded", done.error
    studio_id = created.id.removeprefix("ftjob-")
    assert done.fine_tuned_model == f"ft:{tiny_model.name}:tiny:{studio_id}"
    assert done.trained_tokens and done.trained_tokens > 0

    # one checkpoint an epoch: 32 rows at 8 a step
    checkpoints = client.fine_tuning.jobs.checkpoints.list(created.id).data
    assert [c.step_number for c in checkpoints] == [8, 4]
    assert all(c.metrics.train_loss is not None for c in checkpoints)
    losses = [e.data["train_loss"] for e in client.fine_tuning.jobs.list_events(created.id, limit=1000).data
              if e.type == "metrics" and "train_loss" in e.data]
    assert len(losses) == 8 and losses[0] < losses[-1]  # newest first: the loss fell

    listed = [m.id for m in client.models.list()]
    assert done.fine_tuned_model in listed
    # each saved checkpoint is a model of its own in the list too
    assert {c.fine_tuned_model_checkpoint for c in checkpoints} <= set(listed)
    answer = client.chat.completions.create(model=done.fine_tuned_model, temperature=0, max_tokens=8,
                                            messages=[{"role": "user", "content": rows[0]["messages"][0]["content"]}])
    assert answer.model == done.fine_tuned_model and answer.choices[0].message.content
    assert answer.usage.completion_tokens > 0
    assert client.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model

    # a checkpoint answers too, by its own name
    first_epoch = checkpoints[-1].fine_tuned_model_checkpoint
    assert first_epoch == f"{done.fine_tuned_model}:ckpt-step-4"
    early = client.chat.completions.create(model=first_epoch, temperature=0, max_tokens=8,
                                           messages=[{"role": "user", "content": "hi"}])
    assert early.model == first_epoch and early.usage.completion_tokens > 0
    with pytest.raises(openai.NotFoundError, match="no checkpoint-5 with weights"):
        client.chat.completions.create(model=f"{done.fine_tuned_model}:ckpt-step-5", messages=[
            {"role": "user", "content": "hi"}])


def test_dpo_job_from_openai_preference_rows(client: openai.OpenAI, tiny_model: Path, tmp_path: Path) -> None:
    pairs = [json.loads(line) for line in (DATA / "preference.jsonl").read_text().splitlines()[:16]]
    rows = [{"input": {"messages": p["prompt"]}, "preferred_output": p["chosen"],
             "non_preferred_output": p["rejected"]} for p in pairs]
    training = upload(client, tmp_path, "pairs.jsonl", rows)
    created = client.fine_tuning.jobs.create(model=str(tiny_model), training_file=training, method={
        "type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 1, "batch_size": 8, "beta": 0.2}}})
    done = finished(client, created.id)
    assert done.status == "succeeded", done.error
    assert done.method.dpo.hyperparameters.beta == 0.2
    steps = [e.data["step"] for e in client.fine_tuning.jobs.list_events(created.id, limit=1000).data
             if e.type == "metrics" and "train_loss" in e.data]
    assert sorted(steps) == [1, 2]
