"""/v1/files and /v1/fine_tuning/jobs through OpenAI's own Python client, against a real server and a scripted
worker (tests/helpers/fake_workers.py `fine_tunes`: paced steps, a checkpoint an epoch, stop commands obeyed).

tests/api/test_fine_tuning_training.py trains the tiny model for real and chats with the result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = pytest.mark.timeout(300)


@dataclass
class Studio:
    url: str
    client: openai.OpenAI
    manager: JobManager
    tmp: Path

    def studio_id(self, job_id: str) -> str:
        return job_id.removeprefix("ftjob-")


@pytest.fixture
def studio(tmp_path: Path) -> Iterator[Studio]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], max_concurrent_jobs=2,
                        request_poll_seconds=0.1)
    manager = JobManager(settings, worker_target=fake_workers.fine_tunes)
    try:
        with running_server(settings, manager) as url, openai.OpenAI(
                base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            yield Studio(url, client, manager, tmp_path)
    finally:
        manager.close(save=False, timeout=30)


def chat_rows(n: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "developer", "content": "Answer in one word."},
                          {"role": "user", "content": [{"type": "text", "text": f"What is {i} + 1?"}]},
                          {"role": "assistant", "content": str(i + 1)}]} for i in range(n)]


def preference_rows(n: int) -> list[dict[str, Any]]:
    return [{"input": {"messages": [{"role": "user", "content": f"Say {i}."}]},
             "preferred_output": [{"role": "assistant", "content": str(i)}],
             "non_preferred_output": [{"role": "assistant", "content": "no"}]} for i in range(n)]


def jsonl(folder: Path, name: str, rows: list[Any]) -> Path:
    path = folder / name
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def upload(studio: Studio, name: str, rows: list[Any]) -> str:
    with jsonl(studio.tmp, name, rows).open("rb") as handle:
        return studio.client.files.create(file=handle, purpose="fine-tune").id


def wait_status(studio: Studio, job_id: str, *statuses: str, timeout: float = 120) -> Any:
    return wait_until(lambda: j if (j := studio.client.fine_tuning.jobs.retrieve(job_id)).status in statuses
                      else None, timeout, f"job {job_id} to be {' or '.join(statuses)}", every=0.05)


# --- files ----------------------------------------------------------------------------------------------
def test_files_upload_list_retrieve_content_delete(studio: Studio) -> None:
    client = studio.client
    path = jsonl(studio.tmp, "chat.jsonl", chat_rows(3))
    sent = path.read_bytes()
    with path.open("rb") as handle:
        first = client.files.create(file=handle, purpose="fine-tune")
    assert (first.id, first.filename, first.bytes, first.purpose, first.object) == (
        "file-chat.jsonl", "chat.jsonl", len(sent), "fine-tune", "file")
    second = upload(studio, "chat.jsonl", chat_rows(2))  # never replaces the first
    assert second == "file-chat-2.jsonl"

    assert {f.id for f in client.files.list()} == {first.id, second}
    page = client.files.list(limit=1, order="asc")
    assert [f.id for f in page.data] == [first.id] and page.has_more
    assert client.files.retrieve(first.id).bytes == first.bytes
    assert client.files.content(first.id).content == sent
    # the page's uploads are the same folder
    assert {u["name"] for u in httpx.get(f"{studio.url}/api/uploads").json()["items"]} == {"chat.jsonl",
                                                                                          "chat-2.jsonl"}

    deleted = client.files.delete(first.id)
    assert (deleted.id, deleted.deleted) == (first.id, True)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-../tunestudio.db")


def test_a_bad_file_is_refused_naming_its_first_bad_line(studio: Studio) -> None:
    client = studio.client
    rows: list[Any] = chat_rows(2)
    for bad, words in (
        ("{not json", "line 3: is not valid JSON"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "line 3: has no assistant message"),
        ({"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "ok"}]},
         "line 3: message 1 of 'messages' is a tool result, but no assistant call before it awaits one"),
        (preference_rows(1)[0], "line 3: is a preference row, but the file holds chat rows"),
        ({"prompt": "a", "completion": "b"}, "line 3: has neither 'messages'"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            upload(studio, "bad.jsonl", [*rows, bad])
        assert words in refused.value.message, refused.value.message
        assert refused.value.param == "file" and refused.value.code == "invalid_file_format"
    with pytest.raises(openai.BadRequestError, match="no rows"):
        upload(studio, "empty.jsonl", ["", ""])
    with pytest.raises(openai.BadRequestError) as purpose, jsonl(studio.tmp, "ok.jsonl", rows).open("rb") as f:
        client.files.create(file=f, purpose="batch")
    assert purpose.value.param == "purpose"
    assert client.files.list().data == []  # nothing was kept


def test_a_tool_calling_file_is_taken_and_reaches_the_job_in_openais_form(studio: Studio) -> None:
    # Before issue 41 the upload answered 400 "tunestudio trains on text turns only (no tool calls yet)".
    from .test_fine_tune_data import TOOL_CHAT

    training = upload(studio, "tools.jsonl", [TOOL_CHAT, TOOL_CHAT])
    created = studio.client.fine_tuning.jobs.create(model="org/base-model", training_file=training)
    config = studio.manager.get(studio.studio_id(created.id)).config.public_dict()
    [row, _] = [json.loads(line) for line in Path(config["local_datasets"][0]).read_text().splitlines()]
    assert row["tools"] == TOOL_CHAT["tools"] and row["messages"][2]["tool_call_id"] == "call_1"
    assert row["messages"][5]["weight"] == 0
    studio.client.fine_tuning.jobs.cancel(created.id)


# --- jobs -------------------------------------------------------------------------------------------------------
def test_supervised_job_to_succeeded_with_events_checkpoints_and_results(studio: Studio) -> None:
    client = studio.client
    training = upload(studio, "train.jsonl", chat_rows(4))
    validation = upload(studio, "valid.jsonl", chat_rows(2))
    created = client.fine_tuning.jobs.create(
        model="org/base-model", training_file=training, validation_file=validation, suffix="sums", seed=11,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 2,
                                                                          "learning_rate_multiplier": 0.5}}})
    assert created.status in ("queued", "validating_files", "running")
    assert (created.model, created.training_file, created.validation_file, created.seed) == (
        "org/base-model", training, validation, 11)
    hyper = created.method.supervised.hyperparameters
    assert (hyper.n_epochs, hyper.batch_size, hyper.learning_rate_multiplier) == (2, 2, 0.5)
    assert created.user_provided_suffix == "sums" and created.fine_tuned_model is None

    # the studio's job: OpenAI's rows in the studio's messages format, one checkpoint an epoch
    job = studio.manager.get(studio.studio_id(created.id))
    config = job.config.public_dict()  # the stored view
    assert (config["method"], config["format_type"], config["num_epochs"], config["batch_size"],
            config["gradient_accumulation_steps"], config["learning_rate"], config["random_seed"],
            config["save_steps"]) == ("sft", "messages", 2, 2, 1, 1e-4, 11, 2)
    converted = [json.loads(line) for line in Path(config["local_datasets"][0]).read_text().splitlines()]
    assert converted[0] == {"messages": [{"role": "system", "content": "Answer in one word."},
                                         {"role": "user", "content": "What is 0 + 1?"},
                                         {"role": "assistant", "content": "1"}]}
    assert Path(config["eval_split"]).name == "valid.jsonl"

    done = wait_status(studio, created.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:org/base-model:sums:{job.id}"
    assert done.trained_tokens == 400 and done.finished_at >= done.created_at and done.error is None

    # events: newest first, a page at a time; the pages together are the whole list
    everything = client.fine_tuning.jobs.list_events(created.id, limit=1000)
    assert not everything.has_more
    ids = [e.id for e in everything.data]
    seqs = [int(i.rpartition("-")[2]) for i in ids]
    assert seqs == sorted(seqs, reverse=True)
    first = client.fine_tuning.jobs.list_events(created.id, limit=3)
    assert [e.id for e in first.data] == ids[:3] and first.has_more
    assert [e.id for e in first.iter_pages().__next__().data] == ids[:3]
    assert [e.id for e in client.fine_tuning.jobs.list_events(created.id, limit=3)] == ids  # auto-paging
    metrics = [e for e in everything.data if e.type == "metrics"]
    assert [e.data["step"] for e in metrics if "train_loss" in e.data] == [4, 3, 2, 1]
    assert everything.data[0].message.startswith("completed") and everything.data[-1].message == "queued"

    checkpoints = client.fine_tuning.jobs.checkpoints.list(created.id)
    assert [(c.step_number, c.fine_tuning_job_id) for c in checkpoints.data] == [(4, created.id), (2, created.id)]
    assert checkpoints.data[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-4"
    assert checkpoints.data[1].metrics.train_loss == 1.0 and checkpoints.data[1].metrics.valid_loss == 1.5
    older = client.fine_tuning.jobs.checkpoints.list(created.id, after=checkpoints.data[0].id)
    assert [c.step_number for c in older.data] == [2]

    [results] = done.result_files
    csv = client.files.content(results).text.splitlines()
    assert csv[0].startswith("step,epoch,train_loss,valid_loss")
    assert [row.split(",")[0] for row in csv[1:]] == ["1", "2", "2", "3", "4", "4"]
    assert client.files.retrieve(results).purpose == "fine-tune-results"

    assert done.fine_tuned_model in [m.id for m in client.models.list()]


def test_dpo_job_from_a_preference_file_with_auto_resolved(studio: Studio) -> None:
    client = studio.client
    training = upload(studio, "pairs.jsonl", preference_rows(3))
    created = client.fine_tuning.jobs.create(model="org/base-model", training_file=training,
                                             method={"type": "dpo", "dpo": {"hyperparameters": {
                                                 "beta": "auto", "n_epochs": 1, "batch_size": "auto"}}})
    hyper = created.method.dpo.hyperparameters
    assert created.method.type == "dpo"
    # auto: the studio's defaults (batch 2 x accumulation 4, learning rate 2e-4 = multiplier 1, beta 0.1)
    assert (hyper.n_epochs, hyper.batch_size, hyper.learning_rate_multiplier, hyper.beta) == (1, 8, 1.0, 0.1)
    config = studio.manager.get(studio.studio_id(created.id)).config.public_dict()
    assert (config["method"], config["format_type"], config["beta"]) == ("dpo", "preference", 0.1)
    row = json.loads(Path(config["local_datasets"][0]).read_text().splitlines()[0])
    assert row == {"prompt": [{"role": "user", "content": "Say 0."}],
                   "chosen": [{"role": "assistant", "content": "0"}],
                   "rejected": [{"role": "assistant", "content": "no"}]}
    assert wait_status(studio, created.id, "succeeded", "failed").status == "succeeded"

    # the older top-level hyperparameters, and a supervised job refusing preference rows by line
    legacy = client.fine_tuning.jobs.create(model="org/base-model", training_file=upload(
        studio, "chat.jsonl", chat_rows(2)), hyperparameters={"n_epochs": 3, "batch_size": 3})
    assert (legacy.hyperparameters.n_epochs, legacy.hyperparameters.batch_size) == (3, 3)
    assert studio.manager.get(studio.studio_id(legacy.id)).config.batch_size == 1
    with pytest.raises(openai.BadRequestError, match="line 1: is a preference row") as wrong:
        client.fine_tuning.jobs.create(model="org/base-model", training_file=training)
    assert wrong.value.param == "training_file"
    with pytest.raises(openai.BadRequestError) as beta:
        client.fine_tuning.jobs.create(model="org/base-model", training_file=legacy.training_file,
                                       hyperparameters={"beta": 0.5})
    assert beta.value.param == "beta"


def test_list_jobs_paginates_newest_first_and_shows_the_pages_jobs(studio: Studio) -> None:
    client = studio.client
    training = upload(studio, "train.jsonl", chat_rows(2))
    made = [client.fine_tuning.jobs.create(model="org/base-model", training_file=training,
                                           hyperparameters={"n_epochs": 1}).id for _ in range(3)]
    page_job = httpx.post(f"{studio.url}/api/jobs", json=job_config(
        "org/page-model", studio.tmp / "page-out", max_steps=2, save_steps=1, num_epochs=1).public_dict()).json()
    newest_first = [f"ftjob-{page_job['id']}", *reversed(made)]

    first = client.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in first.data] == newest_first[:2] and first.has_more
    second = client.fine_tuning.jobs.list(limit=2, after=first.data[-1].id)
    assert [j.id for j in second.data] == newest_first[2:] and not second.has_more
    assert [j.id for j in client.fine_tuning.jobs.list(limit=1)] == newest_first  # auto-paging
    listed = client.fine_tuning.jobs.retrieve(newest_first[0])
    assert (listed.model, listed.method.type) == ("org/page-model", "supervised")
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.list(after="ftjob-nothing")


def test_pause_resume_and_cancel(studio: Studio) -> None:
    client = studio.client
    # 40 rows at batch 1: 40 steps an epoch, 50 epochs (40 s at 20 ms a step): long enough to act on
    training = upload(studio, "long.jsonl", chat_rows(40))
    created = client.fine_tuning.jobs.create(model="org/base-model", training_file=training, suffix="long",
                                             hyperparameters={"n_epochs": 50, "batch_size": 1})
    wait_until(lambda: (studio.manager.get(studio.studio_id(created.id)).progress or {}).get("step", 0) >= 3,
               60, "a few steps")
    pausing = client.fine_tuning.jobs.pause(created.id)
    assert pausing.id == created.id and pausing.status in ("running", "paused")
    paused = wait_status(studio, created.id, "paused", "failed", "succeeded")
    assert paused.status == "paused" and paused.finished_at is None and paused.fine_tuned_model is None
    saved = client.fine_tuning.jobs.checkpoints.list(created.id).data[0]
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.pause(created.id)

    resumed = client.fine_tuning.jobs.resume(created.id)
    assert resumed.id == created.id and resumed.status in ("queued", "validating_files", "running")
    chain = studio.manager.get(studio.studio_id(created.id)).resumed_by
    assert chain is not None and studio.manager.get(chain).name == "long"
    wait_until(lambda: (studio.manager.get(chain).progress or {}).get("step", 0) > saved.step_number, 60,
               "the resumed job to go on")
    assert client.fine_tuning.jobs.retrieve(created.id).status == "running"
    assert client.fine_tuning.jobs.retrieve(f"ftjob-{chain}").id == created.id  # either studio id names it
    assert [j.id for j in client.fine_tuning.jobs.list()] == [created.id]  # one OpenAI job

    cancelled = client.fine_tuning.jobs.cancel(created.id)
    assert cancelled.status == "cancelled"  # at once, as OpenAI says it; finished once the worker is gone
    wait_until(lambda: studio.manager.get(chain).status.is_terminal, 60, "the worker's end")
    done = client.fine_tuning.jobs.retrieve(created.id)
    assert done.status == "cancelled" and done.finished_at is not None
    messages = [e.message for e in client.fine_tuning.jobs.list_events(created.id, limit=1000).data]
    assert messages[0].startswith("cancelled") and any(m.startswith("training paused at step") for m in messages)
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.cancel(created.id)
    with pytest.raises(openai.BadRequestError):
        client.fine_tuning.jobs.resume(created.id)


def test_unknown_ids_and_bad_requests(studio: Studio) -> None:
    client = studio.client
    jobs = client.fine_tuning.jobs
    for call in (lambda: jobs.retrieve("ftjob-nope"), lambda: jobs.cancel("ftjob-nope"),
                 lambda: jobs.list_events("ftjob-nope"), lambda: jobs.checkpoints.list("ftjob-nope"),
                 lambda: jobs.retrieve("nope"), lambda: client.files.retrieve("file-nope.jsonl"),
                 lambda: client.files.content("file-results-nope"), lambda: client.files.delete("nope")):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert missing.value.type == "invalid_request_error"
    for fields, param in (({"training_file": "file-nope.jsonl"}, "training_file"),
                          ({"suffix": "has:colon"}, "suffix"),
                          ({"model": "ft:org/x::123"}, "model")):
        with pytest.raises(openai.BadRequestError) as refused:
            jobs.create(**{"model": "org/base-model", "training_file": "file-nope.jsonl", **fields})
        assert refused.value.param == param, refused.value.message
    with pytest.raises(openai.BadRequestError):
        jobs.create(model="org/base-model", training_file="x", extra_body={"unknown": 1})
    training = upload(studio, "chat.jsonl", chat_rows(2))
    with pytest.raises(openai.BadRequestError) as outside:
        jobs.create(model="/opt/elsewhere/model", training_file=training)
    assert outside.value.param == "model" and "outside the allowed model folders" in outside.value.message
    with pytest.raises(openai.BadRequestError) as integrations:
        jobs.create(model="org/base-model", training_file=training,
                    integrations=[{"type": "wandb", "wandb": {"project": "p"}}])
    assert integrations.value.param == "integrations"
    assert jobs.list().data == []  # nothing was queued


def test_a_foreign_origin_is_refused_and_the_sdks_no_origin_taken(studio: Studio) -> None:
    """OpenAI's SDK uploads multipart without an Origin (taken); a page of another site always sends its own."""
    path = jsonl(studio.tmp, "chat.jsonl", chat_rows(1))
    with openai.OpenAI(base_url=f"{studio.url}/v1", api_key="unused", max_retries=0,
                       default_headers={"Origin": "http://evil.example"}) as foreign, path.open("rb") as handle:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            foreign.files.create(file=handle, purpose="fine-tune")
        assert refused.value.code == "cross_origin"
        with pytest.raises(openai.PermissionDeniedError):
            foreign.fine_tuning.jobs.create(model="org/base-model", training_file="file-chat.jsonl")
    with path.open("rb") as handle:
        assert studio.client.files.create(file=handle, purpose="fine-tune").id == "file-chat.jsonl"
