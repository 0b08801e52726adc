"""POST /v1/rewards through the official openai client: a reward job's scores, equal to plain peft's; the errors in
OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings
from tunestudio.worker.tiny_rewards import reward_pairs

from ..helpers.chat import ChatHome
from ..helpers.jobs import job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*")]


@pytest.fixture(scope="module")
def served(chat_home: ChatHome, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Job]]:
    data = tmp_path_factory.mktemp("reward-data") / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in reward_pairs(32, 8)[0]))
    settings = Settings(home=chat_home.home)
    with JobManager(settings) as manager:
        job = manager.submit(job_config(tiny_model, chat_home.home / "reward-job", method="reward",
                                        local_datasets=[str(data)], max_steps=4, batch_size=4, max_seq_length=48,
                                        learning_rate=1e-3))
        job = wait_until(lambda: j if (j := manager.get(job.id)).status.is_terminal else None, 300, "the reward job")
    assert job.status is JobStatus.completed, job.error
    with running_server(settings) as url:
        yield url, job


@pytest.fixture(scope="module")
def client(served: tuple[str, Job]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0) as client:
        yield client


def _plain_scores(job: Job, tiny_model: Path, items: list[tuple[list[dict[str, str]], str]]) -> list[float]:
    """The base with a one-output head, the job's adapter on it (plain peft), each conversation scored whole."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(str(tiny_model),
                                                                                         num_labels=1),
                                      job.output_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(job.output_dir)
    out = []
    for prompt, answer in items:
        ids = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=True,
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
    return out


def test_rewards_score_each_pair_as_plain_peft_does(client: openai.OpenAI, served: tuple[str, Job],
                                                   tiny_model: Path) -> None:
    _, job = served
    items = [([{"role": "user", "content": "What colour is the sky?"}], answer) for answer in ("blue", "green")]
    body = {"model": job.id, "input": [{"prompt": p, "answer": a} for p, a in items]}
    answer: Any = client.post("/rewards", body=body, cast_to=object)
    assert answer["object"] == "list" and [d["index"] for d in answer["data"]] == [0, 1]
    plain = _plain_scores(job, tiny_model, items)
    assert [round(d["score"], 4) for d in answer["data"]] == [round(s, 4) for s in plain]
    text: Any = client.post("/rewards", body={"model": job.id, "input": [{"prompt": "What colour is the sky?",
                                                                          "answer": [{"role": "assistant",
                                                                                      "content": "blue"}]}]},
                            cast_to=object)
    assert round(text["data"][0]["score"], 4) == round(plain[0], 4)  # a text prompt is one user turn


def test_what_is_not_a_reward_model_is_refused_in_openai_shape(client: openai.OpenAI, served: tuple[str, Job],
                                                              chat_home: ChatHome) -> None:
    one = {"input": [{"prompt": "q", "answer": "a"}]}
    with pytest.raises(openai.BadRequestError, match="is a sft job") as chat_job:
        client.post("/rewards", body={"model": chat_home.job.id, **one}, cast_to=object)
    assert chat_job.value.code == "not_a_reward_model"
    with pytest.raises(openai.BadRequestError, match="no trained score head"):
        client.post("/rewards", body={"model": f"{served[1].id}:base", **one}, cast_to=object)
    with pytest.raises(openai.NotFoundError):
        client.post("/rewards", body={"model": "no-such-job", **one}, cast_to=object)
    with pytest.raises(openai.BadRequestError, match="input"):
        client.post("/rewards", body={"model": served[1].id, "input": []}, cast_to=object)
