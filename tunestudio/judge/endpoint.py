"""The judge model: any OpenAI-compatible chat endpoint, named by the environment.

`TUNESTUDIO_JUDGE_URL` (the API's base, e.g. http://127.0.0.1:8765/v1, which may be this very server with a
job as the judge), `TUNESTUDIO_JUDGE_MODEL` (the model id there), and a key from `TUNESTUDIO_JUDGE_API_KEY`
(else `OPENAI_API_KEY`): read from the environment when a judgement starts, never stored or shown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx

from tunestudio.judge.core import JudgeError, Messages

URL_ENV, MODEL_ENV, KEY_ENVS = "TUNESTUDIO_JUDGE_URL", "TUNESTUDIO_JUDGE_MODEL", ("TUNESTUDIO_JUDGE_API_KEY",
                                                                                  "OPENAI_API_KEY")


class JudgeNotConfigured(ValueError):
    """The environment names no judge; the message says which variables to set."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    key: str | None = None
    timeout: float = 120.0
    max_tokens: int = 200

    @classmethod
    def from_env(cls, url: str | None = None, model: str | None = None,
                 environ: dict[str, str] | None = None) -> Endpoint:
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
        return cls(str(url).rstrip("/"), str(model), key)

    def describe(self) -> dict[str, str]:
        """What a judgement records about its judge (never the key)."""
        return {"url": self.url, "model": self.model}

    def __call__(self, messages: Messages) -> str:
        """The judge's reply text (greedy); JudgeError naming what went wrong."""
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        try:
            response = httpx.post(f"{self.url}/chat/completions", json=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException:
            raise JudgeError(f"the judge at {self.url} did not answer within {self.timeout:.0f} s") from None
        except httpx.HTTPError as exc:
            raise JudgeError(f"the judge at {self.url} is unreachable ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise JudgeError(f"the judge answered HTTP {response.status_code}: {_message(response)}")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError("the judge's answer is not an OpenAI chat completion") from None
        return str(content or "")


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        text = error.get("message") if isinstance(error, dict) else response.text
    except (ValueError, AttributeError):
        text = response.text
    return str(text)[:300]
