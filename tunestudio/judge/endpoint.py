"""The judge model: any OpenAI-compatible chat endpoint, named by the environment, asked through the studio's one
OpenAI client (tunestudio/openai_client.py: a total deadline per call, a cap on the reply's size, retries with
backoff on 429 and 5xx, a refused key named).

`TUNESTUDIO_JUDGE_URL` (the API's base, e.g. http://127.0.0.1:8765/v1, which may be this very server with a
job as the judge), `TUNESTUDIO_JUDGE_MODEL` (the model id there), `TUNESTUDIO_JUDGE_DEADLINE_S` (each verdict's
total deadline, retries included; default 120 s), and a key from `TUNESTUDIO_JUDGE_API_KEY` (else
`OPENAI_API_KEY`): read from the environment when a judgement starts, never stored or shown.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field, replace

from tunestudio.judge.core import JudgeError, Messages
from tunestudio.openai_client import BACKOFF_S, DEADLINE_S, RETRIES, ClientError, OpenAIClient

URL_ENV, MODEL_ENV, KEY_ENVS = "TUNESTUDIO_JUDGE_URL", "TUNESTUDIO_JUDGE_MODEL", ("TUNESTUDIO_JUDGE_API_KEY",
                                                                                  "OPENAI_API_KEY")
DEADLINE_ENV = "TUNESTUDIO_JUDGE_DEADLINE_S"
MAX_DEADLINE_S = 3600.0
MAX_VERDICT_BYTES = 1024 * 1024  # a verdict is a sentence of JSON: a megabyte is far past any honest one


class JudgeNotConfigured(ValueError):
    """The environment names no judge; the message says which variables to set."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    key: str | None = field(default=None, repr=False)
    deadline_s: float = DEADLINE_S  # one verdict, retries included
    max_tokens: int = 200
    retries: int = RETRIES
    backoff_s: float = BACKOFF_S
    cancel: threading.Event | None = field(default=None, compare=False, repr=False)  # set: the call under way ends

    @classmethod
    def from_env(cls, url: str | None = None, model: str | None = None, environ: dict[str, str] | None = None,
                 deadline_s: float | None = None) -> Endpoint:
        env = os.environ if environ is None else environ
        url = url or env.get(URL_ENV)
        model = model or env.get(MODEL_ENV)
        missing = [name for name, value in ((URL_ENV, url), (MODEL_ENV, model)) if not value]
        if missing:
            raise JudgeNotConfigured(f"no judge: set {' and '.join(missing)} (an OpenAI-compatible endpoint and its "
                                     "model; another job on this server works: its /v1 URL and the job id)")
        if not str(url).startswith(("http://", "https://")):
            raise JudgeNotConfigured(f"{URL_ENV}: {url!r} is not an http(s) URL")
        key = next((env[k] for k in KEY_ENVS if env.get(k)), None)
        return cls(str(url).rstrip("/"), str(model), key, _deadline(deadline_s, env.get(DEADLINE_ENV)))

    def cancellable(self, cancel: threading.Event) -> Endpoint:
        """This judge, its calls ended as soon as `cancel` is set (a judgement's cancel)."""
        return replace(self, cancel=cancel)

    def describe(self) -> dict[str, str]:
        """What a judgement records about its judge (never the key)."""
        return {"url": self.url, "model": self.model}

    def __call__(self, messages: Messages) -> str:
        """The judge's reply text (greedy); JudgeError naming what went wrong."""
        client = OpenAIClient(self.url, self.key, deadline_s=self.deadline_s, max_reply_bytes=MAX_VERDICT_BYTES,
                              retries=self.retries, backoff_s=self.backoff_s, name="the judge")
        try:
            return client.chat(self.model, messages, cancel=self.cancel, temperature=0, max_tokens=self.max_tokens)
        except ClientError as exc:
            raise JudgeError(str(exc)) from None


def _deadline(given: float | None, env_value: str | None) -> float:
    if given is None and not env_value:
        return DEADLINE_S
    try:
        value = float(given if given is not None else env_value)  # type: ignore[arg-type]
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_DEADLINE_S:  # NaN fails too
        raise JudgeNotConfigured(f"{DEADLINE_ENV}: {given if given is not None else env_value!r} is not a number of "
                                 f"seconds above 0 and at most {MAX_DEADLINE_S:g}")
    return value
