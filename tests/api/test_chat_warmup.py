"""A job's chat model loaded as it completes (tunestudio/api/chat_warmup.py, issue 40): a real JobManager over the
session's chat job, a real chat worker; jobs done before the watch began, and models that do not chat, are not
loaded; nor is one that completes while another job runs or waits."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tunestudio.api.chat_warmup import ChatWarmup, _chats
from tunestudio.inference import GenerateParams, InferencePool, resolve
from tunestudio.inference_protocol import Done
from tunestudio.jobs import JobManager, inference_executor
from tunestudio.settings import Settings

from ..helpers.chat import PROMPT, ChatHome
from ..helpers.wait import wait_until

pytestmark = pytest.mark.timeout(900)


def test_a_job_completed_while_the_watch_runs_has_its_model_loaded_before_the_first_chat(
        chat_home: ChatHome) -> None:
    settings = Settings(home=chat_home.home, chat_warmup=True)
    with JobManager(settings) as manager:
        pool = InferencePool(settings, inference_executor)
        try:
            started = ChatWarmup(pool, manager, poll_s=0.05).start()
            time.sleep(0.3)  # several looks: the job completed before the watch began is left alone
            started.close()
            assert started.warmed == [] and started.look() is None and pool.status()["starts"] == 0
            watch = ChatWarmup(pool, manager)  # never started: every completed job is new to it
            assert watch.look() == chat_home.job.id and watch.look() is None  # once
            wait_until(lambda: pool.status()["loaded"] and pool.status()["in_flight"] == 0, 120, "the model loaded")
            generation = pool.generate(resolve(manager, chat_home.job.id), [{"role": "user", "content": PROMPT}],
                                       GenerateParams(max_tokens=4))
            text = "".join(generation)
            assert isinstance(generation.result(), Done) and text
            assert pool.status()["starts"] == 1  # the warm worker answered: no second start (how soon: bench/)
        finally:
            pool.close()


def test_models_that_do_not_chat_are_not_warmed() -> None:
    def job(kind: str = "train", **config: str) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, config=SimpleNamespace(**{"method": "sft", "modality": "text", **config}))

    assert _chats(job()) and _chats(job(modality="image"))
    assert not _chats(job(method="reward")) and not _chats(job(modality="audio"))
    assert not _chats(job("export")) and not _chats(job("make_data"))


def test_a_live_job_holds_the_warm_up_back_and_the_completed_one_is_then_left() -> None:
    done = SimpleNamespace(id="j1", kind="train", config=SimpleNamespace(method="sft", modality="text"))
    asked: list[object] = []
    jobs = SimpleNamespace(list=lambda statuses, limit: [done], count=lambda statuses: 1)
    watch = ChatWarmup(SimpleNamespace(generate=lambda *a, **k: asked.append(a)), jobs)  # type: ignore[arg-type]
    assert watch.look() is None and asked == [] and watch.warmed == []
    jobs.count = lambda statuses: 0
    assert watch.look() is None and asked == []  # seen while another job ran: not loaded later either
