"""/v1/completions through OpenAI's own client, against a real server, the session's trained LoRA job and a real
inference worker; echoed log-probabilities against plain transformers + peft, computed in a child process; each
echoed token's text_offset against the text."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tunestudio.jobs.models import Job
from tunestudio.settings import Settings

from ..helpers.chat import PROMPT, ChatHome
from ..helpers.jobs import DATA
from ..helpers.server import running_server

pytestmark = pytest.mark.timeout(900)  # the session's chat job trains first (minutes on a busy machine)
# A completion prompt is plain text: written as the tiny model's chat template writes a turn (its special tokens
# are parsed in text), the job answers as it learned to.
TURN = f"<|bos|><|user|>{PROMPT}<|end|><|assistant|>"


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


@pytest.fixture(scope="module")
def server(job: Job, chat_home: ChatHome) -> Iterator[str]:
    with running_server(Settings(home=chat_home.home, dataset_roots=[DATA])) as url:
        yield url


@pytest.fixture
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def _reference(model: str, adapter: str, prompts: list[list[int]], out: mp.Queue) -> None:
    """Each prompt's token log-probabilities (from its second token), as plain transformers gives them for the base
    model, then plain peft for the base with the adapter: {"base": [...], "adapter": [...]}."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def scored(net: Any) -> list[list[float]]:
        net.eval()
        result = []
        with torch.no_grad():
            for ids in prompts:
                scores = torch.log_softmax(net(torch.tensor([ids])).logits[0].float(), dim=-1)
                result.append([float(scores[i - 1, ids[i]]) for i in range(1, len(ids))])
        return result

    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    base = scored(net)  # before the adapter wraps the model (peft changes it in place)
    out.put({"base": base, "adapter": scored(PeftModel.from_pretrained(net, adapter))})


def reference_logprobs(model: str, adapter: str, prompts: list[list[int]]) -> dict[str, list[list[float]]]:
    """`_reference` in a fresh interpreter: one spawned child for both models (each child imports torch,
    transformers and peft, about 9 s of CPU)."""
    context = mp.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_reference, args=(model, adapter, prompts, out))
    child.start()
    try:
        return out.get(timeout=300)
    finally:
        child.join(60)


def assert_offsets_point_at_tokens(choice: Any) -> None:
    """Each token's text_offset is where that token stands in the choice's text (echoed prompt and answer); an end
    token that stopped the choice is listed last, at the end of the text, and is not in it."""
    text, logprobs = choice.text, choice.logprobs
    tokens, offsets = logprobs.tokens, logprobs.text_offset
    assert len(offsets) == len(tokens) > 0
    if choice.finish_reason == "stop" and offsets[-1] == len(text):
        tokens, offsets = tokens[:-1], offsets[:-1]
    for token, offset in zip(tokens, offsets, strict=True):
        assert text[offset: offset + len(token)] == token, (offset, token, text)
    assert "".join(tokens) == text[: offsets[-1] + len(tokens[-1])]  # nothing between them: each follows the last


def test_echo_logprobs_match_plain_transformers_for_the_job_and_its_base(client: openai.OpenAI, job: Job,
                                                                         tiny_model: Path) -> None:
    # What lm-evaluation-harness sends for a loglikelihood: a batch of token-id prompts, one token, echo.
    prompts = [[5, 77, 499, 84, 275, 92, 40], [1, 300, 12, 7], [88, 99]]
    reference = reference_logprobs(str(tiny_model), job.output_dir, prompts)
    for model, expected in ((job.id, reference["adapter"]), (f"{job.id}:base", reference["base"])):
        answer = client.completions.create(model=model, prompt=prompts, max_tokens=1, logprobs=1, echo=True,
                                           temperature=0, seed=1234)
        assert answer.object == "text_completion" and answer.model == model
        assert sorted(c.index for c in answer.choices) == [0, 1, 2]
        for choice in answer.choices:
            ids, logprobs = prompts[choice.index], choice.logprobs
            assert logprobs is not None
            assert len(logprobs.token_logprobs) == len(ids) + 1  # the prompt's tokens, then the one generated
            assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
            got = logprobs.token_logprobs[1 : len(ids)]
            assert got == pytest.approx(expected[choice.index], abs=1e-4)
            # lm_eval's greedy check: each position's top alternative against the token's own log-probability
            for mine, top in zip(logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True):
                assert max(top.values()) >= mine
            assert_offsets_point_at_tokens(choice)
        assert answer.usage.prompt_tokens == sum(map(len, prompts)) and answer.usage.completion_tokens == 3
    # The base and the job differ: the adapter is on for one and off for the other.
    assert reference["base"] != reference["adapter"]


def test_a_flat_list_of_token_ids_is_one_prompt(client: openai.OpenAI, job: Job) -> None:
    ids = [5, 77, 499, 84, 275]
    flat = client.completions.create(model=job.id, prompt=ids, max_tokens=3, logprobs=1, echo=True, temperature=0)
    nested = client.completions.create(model=job.id, prompt=[ids], max_tokens=3, logprobs=1, echo=True,
                                       temperature=0)
    assert [c.index for c in flat.choices] == [0] and flat.usage.prompt_tokens == len(ids)
    assert flat.choices[0].text == nested.choices[0].text
    assert flat.choices[0].logprobs.token_logprobs == nested.choices[0].logprobs.token_logprobs
    assert len(flat.choices[0].logprobs.tokens) >= len(ids)  # the prompt's tokens echoed, then the answer's


def test_echoed_text_offsets_point_at_each_token(client: openai.OpenAI, job: Job) -> None:
    for prompt in (TURN, "The quick brown fox, twice: the quick brown fox."):
        answer = client.completions.create(model=job.id, prompt=prompt, max_tokens=8, logprobs=1, echo=True,
                                           temperature=0)
        choice = answer.choices[0]
        assert choice.text.startswith(prompt) and choice.logprobs.text_offset[0] == 0
        assert_offsets_point_at_tokens(choice)


def test_text_prompts_whole_and_streamed_agree(client: openai.OpenAI, job: Job) -> None:
    prompts = [TURN, "<|bos|><|user|>What colour is it?\n\nbanana<|end|><|assistant|>"]
    whole = client.completions.create(model=job.id, prompt=prompts, max_tokens=12, temperature=0, logprobs=2)
    assert [c.index for c in whole.choices] == [0, 1]
    for choice in whole.choices:
        assert choice.finish_reason in ("stop", "length")
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) <= 12
        assert all(1 <= len(top) <= 3 for top in choice.logprobs.top_logprobs)
        assert choice.logprobs.text_offset[0] == 0
    chunks = list(client.completions.create(model=job.id, prompt=prompts, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == {c.index: c.text for c in whole.choices}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    echoed = client.completions.create(model=job.id, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    assert echoed.choices[0].text == PROMPT and echoed.usage.completion_tokens == 0


def test_a_seed_repeats_a_sampled_answer_and_stop_cuts_it(client: openai.OpenAI, job: Job) -> None:
    def ask(**kwargs: object) -> str:
        return client.completions.create(model=job.id, prompt=TURN, max_tokens=20, **kwargs).choices[0].text

    assert ask(temperature=1.2, top_p=0.9, seed=7) == ask(temperature=1.2, top_p=0.9, seed=7)
    text = ask(temperature=0)
    assert len(text.strip()) >= 2
    cut_at = text.strip()[1:]
    assert ask(temperature=0, stop=[cut_at]) == text[: text.index(cut_at)]


def test_bad_requests_are_openai_errors_naming_the_field(client: openai.OpenAI, server: str, job: Job) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-job", prompt="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=job.id, prompt="hi", temperature=5)
    assert "temperature" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=job.id, prompt=[[1, 2, 100_000]])
    assert "vocabulary" in caught.value.message and caught.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=job.id, prompt=[list(range(5)) * 200], max_tokens=1)
    assert caught.value.code == "context_length_exceeded"
    for body in ({"model": job.id, "prompt": []}, {"model": job.id, "prompt": "x", "n": 2},
                 {"model": job.id, "prompt": [[]]}, {"model": job.id, "prompt": "x", "logprobs": 50}):
        raw = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
        assert raw.status_code == 400, body
        assert set(raw.json()["error"]) == {"message", "type", "param", "code"}
