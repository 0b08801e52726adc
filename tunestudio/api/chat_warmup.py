"""A training job's chat model, loaded as the job completes, so its first chat request does not pay for the load
(issue 40: a model's first chat within 2 s of the job's end; cold, the chat worker's start, the model's load, the
adapter and its merge take about 3 s on a 256M model).

The server watches for jobs that complete while it runs (every `poll_s`) and asks the chat worker for one token of
the newest such job's model, the answer thrown away. It does not warm when another job is running or waiting (the
warm-up would take their cores and memory; the worker gives a model back when training needs the room anyway), for
a job whose model does not chat (a reward model, a speech model), or with TUNESTUDIO_CHAT_WARMUP=0. A model nobody
then asks stays loaded for `inference_idle_seconds`, as after any request.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from tunestudio.inference import GenerateParams, InferencePool, InferenceUnavailable, UnknownModel, resolve
from tunestudio.jobs import JobManager, JobStatus

__all__ = ["ChatWarmup"]

log = logging.getLogger(__name__)
WATCHED = 50  # the newest completed jobs looked at each time
NOT_CHAT_METHODS = ("reward",)
NOT_CHAT_MODALITIES = ("audio",)


class ChatWarmup:
    """The watch (a daemon thread from `start` to `close`)."""

    def __init__(self, pool: InferencePool, jobs: JobManager, poll_s: float = 1.0) -> None:
        self.pool, self.jobs, self.poll_s = pool, jobs, poll_s
        self.warmed: list[str] = []  # job ids asked for, oldest first
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chat-warmup", daemon=True)

    def start(self) -> ChatWarmup:
        self._seen = {j.id for j in self.jobs.list([JobStatus.completed], limit=WATCHED)}  # done before this server
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.look()
            except Exception:  # a watch must not die of one bad look; the next one tries again
                log.exception("chat warm-up: looking for completed jobs failed")

    def look(self) -> str | None:
        """Warm the newest job completed since the last look, when it may be; its id, or None."""
        new = [j for j in self.jobs.list([JobStatus.completed], limit=WATCHED) if j.id not in self._seen]
        self._seen.update(j.id for j in new)
        job = next((j for j in new if _chats(j)), None)
        if job is None or self.jobs.count([s for s in JobStatus if s.is_live]):
            return None
        try:
            spec = resolve(self.jobs, job.id)
            self.pool.generate(spec, [{"role": "user", "content": "Hello"}], GenerateParams(max_tokens=1),
                               deliver=_ignore)
        except (UnknownModel, InferenceUnavailable) as exc:
            log.info("chat warm-up of %s skipped: %s", job.id, exc)
            return None
        self.warmed.append(job.id)
        log.info("chat warm-up: loading %s's model", job.id)
        return job.id


def _chats(job: Any) -> bool:
    config = job.config
    return (job.kind == "train" and getattr(config, "method", None) not in NOT_CHAT_METHODS
            and getattr(config, "modality", "text") not in NOT_CHAT_MODALITIES)


def _ignore(reply: object) -> None:
    pass
