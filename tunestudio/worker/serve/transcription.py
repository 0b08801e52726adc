"""A recording transcribed by a speech-to-text job's model, for `/v1/audio/transcriptions` and `tunestudio
transcribe`: decoded and resampled as training read its clips (worker/data's `decode_audio`), cut into the model's
windows (30 s for real Whisper, 2 s for the tiny one; the last one shorter), each window transcribed greedily (or
sampled, with a temperature), with the request's language (else the job's) and prompt. A segment is a window, with
its times: the model is not asked to predict timestamps.

The job's model is loaded once and kept while the same weights are asked for (one: a chat model and a speech
model share the worker): its adapter merged into its base, or its full weights, in fp32 on a CPU.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from tunestudio.inference_protocol import Done, Loaded, Transcribe, Transcribed
from tunestudio.worker.data import RowProblem, decode_audio
from tunestudio.worker.errors import UserFacing
from tunestudio.worker.train import transcribe as transcribe_window

_loaded: dict[tuple[str, str, bool], tuple[Any, Any]] = {}  # (weights, fingerprint, base) -> (model, processor)


def _model(request: Transcribe, replies: Any) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    spec = request.spec
    key = (spec.weights, spec.fingerprint, spec.base)
    if key in _loaded:
        return _loaded[key]
    _loaded.clear()
    started = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        processor = AutoProcessor.from_pretrained(spec.tokenizer, local_files_only=True)
        if getattr(processor, "feature_extractor", None) is None:
            raise UserFacing(f"{spec.model_id}: its processor has no feature extractor: not a speech model", 400,
                             "not_a_speech_model", param="model")
        if spec.base or spec.kind == "adapter":
            model = AutoModelForSpeechSeq2Seq.from_pretrained(spec.base_model, local_files_only=True)
            if not spec.base:
                from peft import PeftModel

                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                    model = PeftModel.from_pretrained(model, spec.weights).merge_and_unload()
        else:
            model = AutoModelForSpeechSeq2Seq.from_pretrained(spec.weights, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserFacing(f"cannot load the speech model of {spec.model_id}: {exc}", 409, "model_unavailable") \
            from None
    model.to(device).eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.forced_decoder_ids = None
    replies.put(Loaded(spec.model_id, device, time.monotonic() - started))
    _loaded[key] = (model, processor)
    return _loaded[key]


MAX_SECONDS = 3600.0  # a recording longer is refused before it is decoded: 25 MB of Opus can hold nine hours


def _check_length(audio: bytes) -> None:
    import io

    import soundfile

    try:
        seconds = soundfile.info(io.BytesIO(audio)).duration
    except (RuntimeError, TypeError, ValueError):
        return  # not audio: the decoder says so, in its words
    if seconds > MAX_SECONDS:
        raise UserFacing(f"file: the recording is {seconds / 60:.0f} minutes, over the {MAX_SECONDS / 60:.0f} a "
                         "transcription takes; split it", 400, "audio_too_long", param="file")


def transcribe(models: Any, request: Transcribe, replies: Any, halt: threading.Event) -> None:
    import torch

    if torch.get_num_threads() != request.threads:
        torch.set_num_threads(request.threads)
    model, processor = _model(request, replies)
    rate = processor.feature_extractor.sampling_rate
    _check_length(request.audio)
    try:
        clip = decode_audio(request.audio, None, rate)
    except RowProblem as exc:
        raise UserFacing(f"file: {str(exc).removeprefix('its audio (bytes) ')}", 400, "invalid_audio",
                         param="file") from None
    window = processor.feature_extractor.n_samples
    language = request.language or getattr(processor.tokenizer, "language", None)
    options: dict[str, Any] = {}
    if request.prompt:  # at most half the decoder's positions, its end kept (Whisper's own rule for context)
        ids = list(processor.get_prompt_ids(request.prompt, return_tensors="np"))
        half = getattr(model.config, "max_target_positions", 448) // 2
        ids = ids if len(ids) <= half else [ids[0], *ids[len(ids) - half + 1:]]
        options["prompt_ids"] = torch.as_tensor(ids, device=next(model.parameters()).device)
    if request.temperature > 0:
        options.update(do_sample=True, temperature=request.temperature)
    segments: list[tuple[float, float, str]] = []
    samples = clip.samples
    for start in range(0, len(samples), window):
        if halt.is_set():
            replies.put(Done(request.request_id, "cancelled"))
            return
        piece = samples[start:start + window]
        try:
            text = transcribe_window(model, processor, piece, language, request.task, **options)
        except ValueError as exc:  # generate's refusal of the request's settings (an unknown language, ...)
            raise UserFacing(f"{'language' if request.language else 'model'}: {exc}", 400, "invalid_request",
                             param="language" if request.language else "model") from None
        segments.append((start / rate, min(len(samples), start + window) / rate, text))
    whole = " ".join(t for _, _, t in segments if t).strip()
    replies.put(Transcribed(request.request_id, whole, language, len(samples) / rate, segments))
    replies.put(Done(request.request_id, "stop"))
