"""The messages between the inference pool (parent) and the inference worker (child), and nothing else.

Beside `events.py` (a training worker's messages) and for the same reason: the
parent's `inference/pool.py` and the child's `worker/serve/inference.py` and
`worker/serve/generation.py` both import only this module to talk, so neither wing
reaches into the other. Plain frozen dataclasses, carried pickled by the
executor's channels (jobs/executor.py, kind "inference"). Parent → child
(`Command`): `Generate` (a chat answer, with its `Tools` and `ImageInput`s if
any), `Complete` (a text completion of one or more prompts, `/v1/completions`),
`Render` (a chat prompt as the model would see it, nothing generated), `Cancel`,
`Shutdown`. Child → parent (`Reply`),
per request: `Started` (the prompt is accepted), any number of `Delta` (chat)
or `ChoiceDelta` (completions: text of one choice with its tokens'
log-probabilities), or one `Rendered`, then `Done` or `Error`; and `Loaded`
when a model comes into memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MAX_TOKENS = 1024  # a request without max_tokens: this many, or the model's context left if less


@dataclass(frozen=True)
class ModelSpec:
    """Which weights answer: a job's result (`base=False`) or the base model it was trained from.

    weights: the folder holding the job's adapter or full model (its output, or a checkpoint);
    tokenizer: the folder whose tokenizer and chat template the job trained with, used for both sides;
    fingerprint: the weights files' names, sizes and modification times (the worker's cache key with `weights`).
    modality: the job's kind of data (JobConfig.modality): which loaders the worker's modality object names.
    """

    job_id: str
    base: bool
    base_model: str
    weights: str
    kind: Literal["adapter", "full"]
    tokenizer: str
    load_in_4bit: bool = False
    fingerprint: str = ""
    modality: str = "text"

    @property
    def model_id(self) -> str:
        return f"{self.job_id}:base" if self.base else self.job_id


class GenerateParams(BaseModel):
    """How to generate, checked before anything reaches the worker."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    min_tokens: int = Field(default=0, ge=0, le=1_000_000)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list, max_length=4)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)


class CompletionParams(GenerateParams):
    """A text completion's knobs: `max_tokens` may be 0 (with `echo`: score the prompt only), `logprobs` top
    alternatives per position (None: no log-probabilities), `echo` the prompt's tokens before the completion."""

    max_tokens: int | None = Field(default=16, ge=0, le=1_000_000)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


@dataclass(frozen=True)
class Tools:
    """A chat request's functions, as its chat template gets them (OpenAI's tool objects), and what its reply must
    do with them: `choice` "auto" (call or answer), "required" (call one), or a function's name (call that one).
    `parallel`: more than one call may come (False: only the first is kept)."""

    tools: list[dict[str, Any]]
    choice: str = "auto"
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


@dataclass(frozen=True)
class ImageInput:
    """An image of a chat request: its encoded bytes as sent (the worker decodes them with Pillow) and where the
    request put it (`messages[0].content[1]`), which an error about it names. Its turn holds a `{"type": "image"}`
    part in its place: a request's images are in the order of those parts."""

    where: str
    data: bytes


@dataclass(frozen=True)
class Generate:
    """A chat answer. messages: the turns as the chat template reads them (OpenAI's, a call's arguments as a
    dict); tools: the request's functions (None: none offered, or `tool_choice: none`); images: one for each
    `{"type": "image"}` part of the turns, in order (an image model's requests only)."""

    request_id: int
    spec: ModelSpec
    messages: list[dict[str, Any]]
    params: dict
    threads: int  # torch threads for this request (fewer while a training job shares the CPU)
    tools: Tools | None = None
    images: tuple[ImageInput, ...] = ()


@dataclass(frozen=True)
class Complete:
    """Complete each prompt (text, or token ids as they are): one choice per prompt, in order."""

    request_id: int
    spec: ModelSpec
    prompts: list[str | list[int]]
    params: dict  # CompletionParams, dumped
    threads: int


@dataclass(frozen=True)
class Render:
    """The prompt a `Generate` of these messages would give the model (its chat template applied), not answered."""

    request_id: int
    spec: ModelSpec
    messages: list[dict[str, Any]]
    tools: Tools | None = None
    images: tuple[ImageInput, ...] = ()


@dataclass(frozen=True)
class Score:
    """A reward model's score of each (prompt, answer): a prompt is text, turns or None, an answer text or turns
    (`/v1/rewards`); answered by one `Scored`, then `Done`."""

    request_id: int
    spec: ModelSpec
    items: list[tuple[Any, Any]]
    threads: int


@dataclass(frozen=True)
class Transcribe:
    """A recording transcribed by a speech-to-text job's model (`/v1/audio/transcriptions`): its encoded bytes
    (WAV, FLAC, MP3, OGG), cut into the model's windows; answered by one `Transcribed`, then `Done`."""

    request_id: int
    spec: ModelSpec
    audio: bytes
    threads: int
    language: str | None = None  # None: the job's own (its tokenizer's)
    prompt: str | None = None  # words to prime the decoder with (Whisper's prompt_ids)
    temperature: float = 0.0
    task: Literal["transcribe", "translate"] = "transcribe"


@dataclass(frozen=True)
class Cancel:
    request_id: int


@dataclass(frozen=True)
class Shutdown:
    pass


Command = Generate | Complete | Render | Score | Transcribe | Cancel | Shutdown
Request = Generate | Complete | Render | Score | Transcribe  # a command that is answered


@dataclass(frozen=True)
class Loaded:
    key: str
    device: str
    seconds: float


@dataclass(frozen=True)
class Started:
    """A request's prompt is accepted. For a chat answer, how to read its output (`tunestudio.tool_calls`):
    family: the template's tool-call family when the request has tools (None: read no calls); think: the
    template writes `<think>` reasoning; think_open: the prompt ended inside `<think>`; prefix: the text the
    reply was begun with (a call's opener under `tool_choice` required or named): the output's first words."""

    request_id: int
    prompt_tokens: int
    threads: int = 0  # the torch threads generating it
    family: str | None = None
    think: bool = False
    think_open: bool = False
    prefix: str = ""


@dataclass(frozen=True)
class Delta:
    request_id: int
    text: str


@dataclass(frozen=True)
class TokenLogprob:
    """One token of a completion's choice: its text, its log-probability given what precedes it (None for the
    first token of an echoed prompt), the `top` alternatives (token text → log-probability) and where its text
    starts in the choice's text."""

    token: str
    logprob: float | None
    top: dict[str, float] | None
    offset: int


@dataclass(frozen=True)
class ChoiceDelta:
    """More text of one choice (`index`: its prompt's place); `tokens`: the tokens that text holds (with
    logprobs asked for); `finish_reason` set on a choice's last delta."""

    request_id: int
    index: int
    text: str
    tokens: list[TokenLogprob] | None = None
    finish_reason: Literal["stop", "length", "cancelled"] | None = None
    completion_tokens: int = 0


@dataclass(frozen=True)
class Rendered:
    """A `Render`'s answer: the prompt's tokens decoded with their special tokens (the exact text the model reads),
    how many tokens, and the chat template the tokenizer applied (None: it has none, the turns' text was joined)."""

    request_id: int
    prompt: str
    prompt_tokens: int
    template: str | None


@dataclass(frozen=True)
class Scored:
    """A `Score`'s answer: one score per item, in order."""

    request_id: int
    scores: list[float]


@dataclass(frozen=True)
class Transcribed:
    """A `Transcribe`'s answer: the whole text, the language it was read as, the recording's length, and one
    segment per window the audio was cut into: (start s, end s, text)."""

    request_id: int
    text: str
    language: str | None
    duration: float
    segments: list[tuple[float, float, str]]


@dataclass(frozen=True)
class Done:
    request_id: int
    finish_reason: Literal["stop", "length", "cancelled"]
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Error:
    """A request that could not be answered. status/code say whose fault it is, as HTTP would."""

    request_id: int
    message: str
    status: int = 500
    code: str = "inference_error"
    extra: dict = field(default_factory=dict)


Reply = Loaded | Started | Delta | ChoiceDelta | Rendered | Scored | Transcribed | Done | Error
