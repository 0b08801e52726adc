"""Audio: speech to text with an encoder-decoder speech model (Whisper's family: `AutoModelForSpeechSeq2Seq` and its
`AutoProcessor`, a feature extractor and a tokenizer), clips and transcripts (worker/data/audio.py), transformers'
Seq2SeqTrainer (the method registry's `seq2seq` family for sft on audio), and word and character error rates before
and after (worker/train/speech_eval.py).

The job's language and task (`audio_language`, `audio_task`) set the tokenizer's prefix (start of transcript,
language, task, no timestamps), which every training transcript starts with, and are given to `generate`, as for
real Whisper. A model whose processor has no feature extractor, or a model of another kind, is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tunestudio.config import JobConfig
from tunestudio.worker.errors import UserError

if TYPE_CHECKING:
    import torch

    from tunestudio.worker.data import PreparedData

DEFAULT_LANGUAGE = "en"


def language_of(cfg: JobConfig, processor: Any) -> str | None:
    """The job's language, as generate and the tokenizer take it; None for a model that names no languages."""
    if getattr(cfg, "audio_language", None):  # a dataset report's spec has none: the default
        return cfg.audio_language
    return DEFAULT_LANGUAGE if getattr(processor.tokenizer, "language", None) is not None or hasattr(
        processor.tokenizer, "set_prefix_tokens") else None


def _multilingual(model_name: str, token: str | None) -> bool:
    """Whether the model's generation config names languages (English-only Whisper models say is_multilingual
    false, and refuse a language or a task); a model without one is taken as multilingual."""
    from transformers import GenerationConfig

    from tunestudio.worker.errors import UserError as Missing
    from tunestudio.worker.train import from_pretrained

    try:
        generation = from_pretrained(GenerationConfig, model_name, "generation config", token=token)
    except (Missing, OSError, ValueError):
        return True
    return getattr(generation, "is_multilingual", True) is not False


class AudioModality:
    name = "audio"

    def load_processor(self, cfg: JobConfig) -> Any:
        from transformers import AutoConfig, AutoProcessor

        from tunestudio.worker.train import from_pretrained

        token = cfg.hf_token.get_secret_value() if getattr(cfg, "hf_token", None) else None
        config = from_pretrained(AutoConfig, cfg.model_name, "config", token=token)
        if not getattr(config, "is_encoder_decoder", False) or getattr(config, "num_mel_bins", None) is None:
            raise UserError(f"model {cfg.model_name!r} is a {config.model_type} model, not a speech encoder-decoder: "
                            "audio datasets need a speech-to-text model (Whisper's family); leave is_dataset_audio "
                            "off for text data")
        processor = from_pretrained(AutoProcessor, cfg.model_name, "processor", token=token)
        if getattr(processor, "feature_extractor", None) is None:
            raise UserError(f"model {cfg.model_name!r}: its processor has no feature extractor (not a speech model?)")
        language, task = language_of(cfg, processor), getattr(cfg, "audio_task", "transcribe")
        if not _multilingual(cfg.model_name, token):  # an English-only model (whisper-*.en) names neither
            if getattr(cfg, "audio_language", None) not in (None, "en", "english") or task != "transcribe":
                raise UserError(f"model {cfg.model_name!r} is English-only: it transcribes English (leave "
                                "audio_language and audio_task unset)")
            language = None
        elif hasattr(processor.tokenizer, "set_prefix_tokens"):
            try:
                processor.tokenizer.set_prefix_tokens(language=language, task=task, predict_timestamps=False)
            except ValueError as exc:
                raise UserError(f"audio_language: {exc}") from None
        processor.tokenizer.tunestudio_max_target = getattr(config, "max_target_positions", None)
        processor.tunestudio_max_target = processor.tokenizer.tunestudio_max_target
        window = processor.feature_extractor.n_samples / processor.feature_extractor.sampling_rate
        processor.tunestudio_notes = [f"audio: {processor.feature_extractor.sampling_rate} Hz, window {window:g} s, "
                                      f"language {language or 'none'}, task {task}"]
        return processor

    def load_model(self, cfg: JobConfig, compute_dtype: torch.dtype) -> torch.nn.Module:
        from transformers import AutoModelForSpeechSeq2Seq

        from tunestudio.worker.train import load_model

        model = load_model(cfg, compute_dtype, AutoModelForSpeechSeq2Seq)
        generation = getattr(model, "generation_config", None)
        if generation is not None:  # the job's transcripts carry their prefix: generate must not force another
            generation.forced_decoder_ids = None
        return model

    def prepare_data(self, cfg: JobConfig, processor: Any, progress: Any = None) -> PreparedData:
        from tunestudio.worker.data import prepare_audio

        data = prepare_audio(cfg, processor, progress)
        data.notes[:0] = getattr(processor, "tunestudio_notes", [])
        return data

    def generate(self, model: torch.nn.Module, processor: Any, prompt: str) -> str:
        raise UserError("sample_prompts: an audio job's samples are its held-out clips")

    def evaluator(self, held_eval: Any, limit: int, places: Sequence[dict[str, Any]] | None,
                  max_length: int) -> Any:
        from tunestudio.worker.train import SpeechEvaluator

        return SpeechEvaluator.for_job(held_eval, limit, places)  # the language and task: the processor's prefix

    def serving_loaders(self) -> tuple[Any, Any]:
        from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

        return AutoProcessor, AutoModelForSpeechSeq2Seq
