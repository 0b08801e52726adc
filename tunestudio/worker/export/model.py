"""The merged model: base + adapter folded into plain weights (`merge_and_unload`),
saved as safetensors with the tokenizer and its chat template.

A vision-language model (an image job's) loads as the training did, through
`AutoModelForImageTextToText`, and is saved with its processor (image processor,
tokenizer, chat template), which `AutoProcessor` loads back."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tunestudio.worker.channel import Channel
from tunestudio.worker.export.source import ExportStep, Source
from tunestudio.worker.train import from_pretrained

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _loaders(source: Source) -> tuple[Any, Any, str, tuple[str, ...]]:
    """(model class, tokenizer or processor class, what the latter is called, files only its folder has)."""
    if source.speech:  # Whisper's family: the encoder-decoder and its processor (feature extractor, tokenizer)
        from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

        return AutoModelForSpeechSeq2Seq, AutoProcessor, "processor", ("processor_config.json",
                                                                       "preprocessor_config.json")
    if source.reward:  # its score head, as the job trained it (worker/train/model.load_model)
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification, AutoTokenizer, "tokenizer", ("tokenizer_config.json",)
    if not source.vision:
        return AutoModelForCausalLM, AutoTokenizer, "tokenizer", ("tokenizer_config.json",)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tunestudio.worker.modalities import allow_missing_video

    allow_missing_video()  # the processor loads and saves without torchvision (images only)
    markers = ("processor_config.json", "preprocessor_config.json")
    return AutoModelForImageTextToText, AutoProcessor, "processor", markers


def load_merged(source: Source, channel: Channel) -> tuple[torch.nn.Module, Any]:
    """The model to export in fp32, and its tokenizer or processor (the job's own copy, else the base model's)."""
    model_class, processing_class, what, markers = _loaders(source)
    if not source.adapter:
        model = from_pretrained(model_class, str(source.path), "model", dtype=torch.float32)
        return _knows_padding(source, model, from_pretrained(processing_class, str(source.path), what))
    from peft import PeftModel

    # A QLoRA adapter merges into the base in full precision: merging into 4-bit weights would round it away.
    if source.job_config.get("training_type") == "qlora":
        channel.log("QLoRA adapter: merged into the base model's full-precision weights")
    # a reward model's base gets the one-output head the job trained, whose weights the adapter carries
    extra: dict[str, Any] = {"num_labels": 1} if source.reward else {}
    base = from_pretrained(model_class, source.base_model or "", "model", dtype=torch.float32, **extra)
    with warnings.catch_warnings():
        # peft 0.21.2 reads transformers 5's deprecated `is_gradient_checkpointing` alias; nothing for us to fix.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = PeftModel.from_pretrained(base, str(source.path)).merge_and_unload()
    processing_dir = source.path if any((source.path / m).is_file() for m in markers) else source.base_model
    return _knows_padding(source, model, from_pretrained(processing_class, str(processing_dir), what))


def _knows_padding(source: Source, model: torch.nn.Module, processing: Any) -> tuple[torch.nn.Module, Any]:
    """A reward model scores each row at its last real token, which a padded batch finds by the pad token: its
    config names it (the tokenizer's, else its end token), as TRL's RewardTrainer had it while training."""
    if source.reward and model.config.pad_token_id is None:
        model.config.pad_token_id = processing.pad_token_id if processing.pad_token_id is not None else (
            processing.eos_token_id)
    return model, processing


def write_merged(source: Source, dtype: str, dest: Path, step: ExportStep) -> None:
    """Load, merge, cast and save into `dest` (a folder inside the export's staging folder)."""
    step.report(0.0)
    model, tokenizer = load_merged(source, step.channel)
    step.check_stop()
    # The job's status follows the phases, and only "saving" may end in completed.
    step.channel.phase("saving", f"writing the merged model ({dtype})")
    step.report(0.5)
    model = model.to(DTYPES[dtype])
    model.config.use_cache = True  # training switched it off; an exported model is for inference
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    tokenizer.save_pretrained(str(dest))  # with transformers 5: chat_template.jinja beside it (a processor too)
    step.check_stop()
    step.report(1.0)
