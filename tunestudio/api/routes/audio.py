"""POST /v1/audio/transcriptions: OpenAI's transcription API over a speech-to-text job's model (`<id>` or its base,
`<id>:base`), what the official client's `client.audio.transcriptions.create` sends.

multipart/form-data: `file` (WAV, FLAC, MP3 or OGG, at most `max_audio_bytes`, 25 MB as OpenAI's), `model`,
`language` (default: the job's), `prompt` (words to prime the decoder with), `response_format` (json, text,
verbose_json, srt, vtt) and `temperature` (0: greedy). The recording is cut into the model's windows; a segment of
verbose_json, srt and vtt is a window with its times (the model is not asked to predict timestamps). Errors are
OpenAI's shape: a text job's model, a file that is not audio, one too large.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tunestudio.api.deps import ManagerDep, SettingsDep
from tunestudio.api.errors import ApiError
from tunestudio.api.openai_route import OpenAIRoute
from tunestudio.api.routes.openai import get_pool, one_answer
from tunestudio.api.schemas import OPENAI_ERRORS
from tunestudio.inference import resolve
from tunestudio.inference_protocol import Transcribed
from tunestudio.transcripts import render, verbose

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible audio"], route_class=OpenAIRoute, responses=OPENAI_ERRORS)

TRANSCRIBE_WAIT_S = 600.0  # the model's first load included
Format = Literal["json", "text", "verbose_json", "srt", "vtt"]
CHUNK = 1 << 20


async def _read(file: UploadFile, limit: int) -> bytes:
    data = bytearray()
    while chunk := await file.read(CHUNK):
        data += chunk
        if len(data) > limit:
            size = f"{limit / (1024 * 1024):g} MB" if limit >= 1024 * 1024 else f"{limit:,} bytes"
            raise ApiError(413, "file_too_large", f"file: the recording is over {size}, the most a transcription "
                           "takes; send a shorter one or split it", field="file")
    if not data:
        raise ApiError(400, "invalid_audio", "file: the recording is empty", field="file")
    return bytes(data)


def formatted(done: Transcribed, response_format: Format) -> Response:
    if response_format in ("json", "verbose_json"):
        body = {"text": done.text} if response_format == "json" else verbose(done.text, done.language, done.duration,
                                                                              done.segments)
        return JSONResponse(body)
    return PlainTextResponse(render(response_format, done.text, done.language, done.duration, done.segments),
                             media_type="text/vtt" if response_format == "vtt" else "text/plain")


@router.post("/audio/transcriptions", response_model=None,
             openapi_extra={"description": "multipart/form-data: file, model, language, prompt, response_format, "
                                           "temperature."})
async def transcriptions(
    request: Request,
    manager: ManagerDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="The recording: WAV, FLAC, MP3 or OGG.")],
    model: Annotated[str, Form(min_length=1, max_length=300)],
    language: Annotated[str | None, Form(max_length=32, pattern=r"^[A-Za-z][A-Za-z -]*$")] = None,
    prompt: Annotated[str | None, Form(max_length=2000)] = None,
    response_format: Annotated[Format, Form()] = "json",
    temperature: Annotated[float, Form(ge=0.0, le=1.0)] = 0.0,
) -> Response:
    """Transcribe a recording with a speech-to-text job's model."""
    spec = resolve(manager, model)  # 404 in OpenAI's shape for an unknown model
    if spec.modality != "audio":
        raise ApiError(400, "not_a_speech_model", f"model: {model} is a {spec.modality} model; transcriptions need "
                       "a speech-to-text job (is_dataset_audio)", field="model")
    audio = await _read(file, settings.max_audio_bytes)
    pool = get_pool(request)
    done = await one_answer(lambda deliver: pool.transcribe(spec, audio, deliver=deliver, language=language,
                                                            prompt=prompt, temperature=temperature),
                            Transcribed, TRANSCRIBE_WAIT_S, "the speech model")
    return formatted(done, response_format)
