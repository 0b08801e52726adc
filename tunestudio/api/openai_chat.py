"""/v1/chat/completions' turns and tools: OpenAI's request shapes, checked, and the model's output read back.

Below the routes (routes/openai.py answers with it, routes/chat.py renders prompts with it). A request's turns may
hold assistant `tool_calls` (content null), `tool` turns answering a call by its `tool_call_id`, and an assistant's
`reasoning_content`; they reach the chat template as it reads them (`template_messages`: a call's arguments as a
dict, a tool turn with its function's name). `tools` must be functions whose `parameters` are JSON Schema objects;
`tool_choice` is `auto`, `none` (no tools rendered), `required` or a named function among them. Whatever breaks
these rules is a 400 naming the field, before anything reaches the worker.

A user turn's content may hold images (`image_url` parts, OpenAI's shape); each reaches the template as a
`{"type": "image"}` part in its place, its bytes read by api/chat_images.py.

`OutputReader` reads the worker's output (tunestudio.tool_calls, the family the worker named in `Started`) into
OpenAI's message or chunk deltas: `content`, `reasoning_content`, `tool_calls` with `finish_reason: "tool_calls"`.
Under `required` or a named function the reply was begun with the call's opener; an output that still holds no
whole call, or a call that half-parses, is a 422 in OpenAI's shape (`invalid_tool_call`), never a made-up call.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tunestudio.api.errors import ApiError
from tunestudio.inference_protocol import Started, Tools
from tunestudio.tool_calls import CallStream, Parsed, family_named

INVALID_CALL = "invalid_tool_call"


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    url: str = Field(min_length=1, description="A data: URL (data:image/png;base64,...), or a file inside the "
                                               "server's model or data folders (a file:// URL or an absolute "
                                               "path). http(s) URLs are refused: the server fetches nothing.")
    detail: Literal["auto", "low", "high"] | None = Field(default=None, description="Accepted; the model's "
                                                                                    "processor decides the size.")


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class CalledFunction(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1_000_000, description="The arguments: a JSON object, as text.")

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError:
            raise ValueError("a call's arguments must be a JSON object as text; this is not JSON") from None
        if not isinstance(parsed, dict):
            raise ValueError("a call's arguments must be a JSON object as text")
        return value


class MessageToolCall(BaseModel):
    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=200)
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant turn has tool_calls")
        if self.reasoning_content is not None and self.role != "assistant":
            raise ValueError("only an assistant turn has reasoning_content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool turn answers a call: it needs the call's tool_call_id")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be null only on an assistant turn with tool_calls")
        if self.images() and self.role != "user":
            raise ValueError("only a user turn may hold images (image_url parts)")
        return self

    def images(self) -> list[tuple[int, ImagePart]]:
        """The turn's image parts, by their place in its content."""
        if not isinstance(self.content, list):
            return []
        return [(i, p) for i, p in enumerate(self.content) if isinstance(p, ImagePart)]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content or [] if isinstance(p, TextPart))

    def plain(self) -> dict[str, Any]:
        """The turn as a chat template reads it (see `template_messages` for the names of a tool turn); with
        images, its content as parts, each image a `{"type": "image"}` placeholder in its place."""
        content: str | list[dict[str, Any]] = self.text()
        if self.images():
            content = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
                       for p in self.content or []]
        turn: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            turn["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:  # Qwen3's and others' name, and gpt-oss's
            turn["reasoning_content"] = turn["thinking"] = self.reasoning_content
        return turn


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The turns as the chat template reads them; each tool turn named by the function whose call it answers.
    ValueError when a tool turn answers no earlier call."""
    called: dict[str, str] = {}
    turns = []
    for index, message in enumerate(messages):
        turn = message.plain()
        for call in message.tool_calls or []:
            called[call.id] = call.function.name
        if message.role == "tool":
            if message.tool_call_id not in called:
                raise ValueError(f"messages[{index}]: tool_call_id {message.tool_call_id!r} answers no call of an "
                                 "earlier assistant turn")
            turn["name"] = called[message.tool_call_id]
        turns.append(turn)
    return turns


class FunctionSpec(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = Field(default=None, max_length=100_000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        if value.get("type", "object") != "object":
            raise ValueError("a function's parameters must be a JSON Schema of type object")
        properties = value.get("properties", {})
        if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
            raise ValueError("a JSON Schema's properties must be an object of schemas (objects)")
        required = value.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError("a JSON Schema's required must be a list of property names")
        return value


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionSpec


class ChosenName(BaseModel):
    name: str


class ChosenFunction(BaseModel):
    type: Literal["function"]
    function: ChosenName


class ToolRules(BaseModel):
    """The tool fields of a chat request (ChatCompletionRequest is one)."""

    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | ChosenFunction | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _choice(self) -> ToolRules:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: two functions have the same name")
        if isinstance(self.tool_choice, ChosenFunction) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names the function {self.tool_choice.function.name!r}, which is not "
                             f"among tools ({', '.join(names) or 'none given'})")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice is required, but no tools are given")
        return self

    def worker_tools(self) -> Tools | None:
        """The tools as the worker renders them; None without tools or under `tool_choice: none`."""
        if not self.tools or self.tool_choice == "none":
            return None
        choice = self.tool_choice
        return Tools([t.model_dump(exclude_none=True) for t in self.tools],
                     choice.function.name if isinstance(choice, ChosenFunction) else choice or "auto",
                     self.parallel_tool_calls)


class FunctionOut(BaseModel):
    name: str
    arguments: str = Field(description="The arguments the model wrote: a JSON object as text (cut short where "
                                        "finish_reason is length).")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionOut


class AssistantMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = Field(default=None, description="Not OpenAI's (vLLM's): the model's reasoning, "
                                                                     "where its template thinks.")
    tool_calls: list[ToolCallOut] | None = None

    def answer(self) -> dict[str, Any]:
        """As sent: the fields a model without tools and reasoning never fills are left out."""
        return self.model_dump(exclude={k for k in ("reasoning_content", "tool_calls") if getattr(self, k) is None})


class OutputReader:
    """The worker's output of one chat answer read as OpenAI puts it. None of it applies to a model whose
    template neither calls tools nor thinks (`active` False): its text is the content, as before."""

    def __init__(self, started: Started | None, tools: Tools | None) -> None:
        self.tools = tools
        self.active = started is not None and (started.family is not None or started.think)
        family = family_named(started.family) if started is not None and started.family else None
        # without tools no name is a call (a harmony model's channels are still read)
        self.stream = CallStream(family, tools.names if tools else (), bool(started and started.think),
                                 bool(started and started.think_open))
        self.held: list[dict[str, Any]] = []  # content withheld while a call must come
        # the opener is the output's first words (a named function's opener settles its call's id and name)
        self.first = self._keep(self.stream.feed(started.prefix)) if started is not None and started.prefix else []

    @property
    def must_call(self) -> bool:
        return self.tools is not None and self.tools.choice != "auto"

    def deltas(self, text: str) -> list[dict[str, Any]]:
        """The chunk deltas this piece of output settles (one call only when calls may not be parallel)."""
        first, self.first = self.first, []
        return [*first, *self._keep(self.stream.feed(text))]

    def finish(self, finish_reason: str) -> tuple[list[dict[str, Any]], Parsed, str]:
        """The last deltas, the whole reading, and the finish reason; ApiError (422) for an output that
        half-parses or that holds no call where one must come."""
        last, parsed = self.stream.finish()
        last, self.first = [*self.first, *self._keep(last)], []
        if self.tools is not None and not self.tools.parallel:
            parsed.tool_calls = parsed.tool_calls[:1]
        # A call cut at max_tokens is sent as it stands, as OpenAI does (finish_reason "length"); one the model
        # broke is no call
        if parsed.error is not None and not (parsed.cut and finish_reason == "length"):
            raise ApiError(422, INVALID_CALL, f"{parsed.error}: {self._shown()}")
        if self.must_call and not parsed.tool_calls:
            wanted = "a function" if self.tools and self.tools.choice == "required" else self.tools.choice \
                if self.tools else ""
            raise ApiError(422, INVALID_CALL, f"tool_choice asks for a call of {wanted}, and the model's output is "
                                              f"no valid call: {self._shown()}")
        if parsed.tool_calls and finish_reason != "length":
            finish_reason = "tool_calls"
        return [*self.held, *last] if self.must_call else last, parsed, finish_reason

    def _keep(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = []
        for delta in deltas:
            calls = [c for c in delta.get("tool_calls", []) if self.tools is None or self.tools.parallel
                     or c["index"] == 0]
            if "tool_calls" in delta and not calls:
                continue
            if "content" in delta and self.must_call:
                self.held.append(delta)
                continue
            kept.append({**delta, "tool_calls": calls} if calls else delta)
        return kept

    def _shown(self) -> str:
        text = self.stream.text
        return json.dumps(text if len(text) <= 300 else text[:300] + "…")


def answer_message(parsed: Parsed) -> AssistantMessage:
    """The assistant's message: content null when it only calls (as OpenAI's), "" when it wrote nothing."""
    return AssistantMessage(content=parsed.content if parsed.content is not None or parsed.tool_calls else "",
                            reasoning_content=parsed.reasoning,
                            tool_calls=[ToolCallOut.model_validate(c.openai()) for c in parsed.tool_calls] or None)
