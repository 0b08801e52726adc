"""Loading the tokenizer and model, and preparing them for LoRA, QLoRA or a full fine-tune."""

from __future__ import annotations

from typing import Any

import torch
from peft import LoftQConfig, LoraConfig, get_peft_model, prepare_model_for_kbit_training
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedTokenizerBase,
)

from tunestudio.config import METHOD_SPECS, JobConfig, TrainingType
from tunestudio.paths import expand
from tunestudio.worker import hub
from tunestudio.worker.errors import UserError

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
SPEECH_ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "out_proj")  # Whisper's encoder and decoder
SPEECH_MLP_MODULES = ("fc1", "fc2")


def from_pretrained(loader: Any, name: str, what: str, **kwargs: Any) -> Any:
    """`loader.from_pretrained(name)` with the cache first and a clear error when offline."""
    local = expand(name)
    if local.is_dir():
        try:
            return loader.from_pretrained(str(local), **kwargs)
        except (OSError, ValueError) as exc:
            raise UserError(f"model {name!r}: cannot load the {what} from this folder: {exc}") from exc
    if hub.looks_like_local_path(name):
        raise UserError(f"model {name!r} does not exist: there is no such folder")
    try:
        return loader.from_pretrained(name, local_files_only=True, **kwargs)
    except OSError:
        pass  # not in the cache: ask the hub
    hub.require_hub("model", name)
    try:
        return loader.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise UserError(f"model {name!r}: cannot load the {what} from the hub: {exc}") from exc


def load_tokenizer(cfg: JobConfig) -> PreTrainedTokenizerBase:
    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    tokenizer = from_pretrained(AutoTokenizer, cfg.model_name, "tokenizer", token=token)
    if tokenizer.pad_token is None:
        # Padding positions are masked out of the loss, so reusing EOS is safe.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def hidden_size(cfg: JobConfig) -> int | None:
    """The model's hidden size from its config alone (no weights loaded), or None if it has none."""
    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    config = from_pretrained(AutoConfig, cfg.model_name, "config", token=token)
    text = getattr(config, "get_text_config", lambda: config)()
    return getattr(text, "hidden_size", None)


def is_reward_model(cfg: JobConfig) -> bool:
    """Whether the job trains a reward model (method reward): a score head instead of the LM head."""
    return METHOD_SPECS[cfg.method].trainer == "reward"


def load_model(cfg: JobConfig, compute_dtype: torch.dtype, loader: Any = AutoModelForCausalLM) -> torch.nn.Module:
    """The base model for training, through `loader` (AutoModelForImageTextToText for image jobs); a reward
    model's base gets a one-output score head (AutoModelForSequenceClassification, num_labels=1, new weights)."""
    token = cfg.hf_token.get_secret_value() if cfg.hf_token else None
    kwargs: dict[str, Any] = {"token": token, "dtype": torch.float32}
    if is_reward_model(cfg) and loader is AutoModelForCausalLM:
        loader, kwargs["num_labels"] = AutoModelForSequenceClassification, 1
    if cfg.training_type is TrainingType.qlora:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
        if not torch.cuda.is_available():
            kwargs["device_map"] = {"": "cpu"}
    model = from_pretrained(loader, cfg.model_name, "model", **kwargs)
    model.config.use_cache = False  # training never reads the KV cache
    return model


def lora_target_modules(cfg: JobConfig, model: torch.nn.Module | None = None) -> list[str] | str:
    if cfg.target_modules:
        return cfg.target_modules
    if cfg.modality == "image" and model is not None:  # the vision switches choose among the model's layers
        from tunestudio.worker.train.vision_layers import targets

        return targets(model, cfg)  # the worker logs them (worker/main.py)
    if cfg.finetune_attention_modules and cfg.finetune_mlp_modules:
        return "all-linear"
    if cfg.modality == "audio":  # Whisper's family names its layers as BART does
        return list(SPEECH_ATTENTION_MODULES if cfg.finetune_attention_modules else SPEECH_MLP_MODULES)
    return list(ATTENTION_MODULES if cfg.finetune_attention_modules else MLP_MODULES)


def prepare_model(model: torch.nn.Module, cfg: JobConfig, gradient_checkpointing: bool) -> torch.nn.Module:
    """Wrap the model for its training type; a full fine-tune trains every weight."""
    if cfg.training_type is TrainingType.full:
        if cfg.modality == "image":
            from tunestudio.worker.train.vision_layers import freeze_unchosen

            freeze_unchosen(model, cfg)
        return model
    if cfg.training_type is TrainingType.qlora:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=lora_target_modules(cfg, model),
        use_rslora=cfg.use_rslora,
        bias="none",
        # a reward model's score head is new: trained whole beside the adapters, and saved with them
        # a speech encoder-decoder's forward takes input_features, which peft's seq2seq wrapper does not pass on:
        # the plain PeftModel (as Whisper's LoRA recipes use it)
        task_type="SEQ_CLS" if is_reward_model(cfg) else None if cfg.modality == "audio" else "CAUSAL_LM",
        modules_to_save=["score"] if is_reward_model(cfg) else None,
        init_lora_weights="loftq" if cfg.use_loftq else True,
        loftq_config=LoftQConfig(loftq_bits=4) if cfg.use_loftq else {},
    )
    try:
        wrapped = get_peft_model(model, lora)
    except ValueError as exc:
        # peft names the modules it could not find; that is a config problem.
        raise UserError(f"target_modules: {exc}") from exc
    if cfg.training_type is TrainingType.lora and not cfg.lora_dropout:
        _without_input_casts(wrapped)
    return wrapped


def _without_input_casts(model: torch.nn.Module) -> None:
    """peft casts each LoRA layer's input to its adapters' dtype (fp32) before their products. In a model whose
    every weight is fp32 the input is fp32 already, except under autocast, which casts it straight back to bf16
    for the product: two copies of each adapted layer's input, forward and backward, for nothing. They go, in such
    a model only (a bf16 or quantized base computes in its own dtype and needs them), and without LoRA dropout
    (dropout on the bf16 input would scale it in bf16). Measured with bench/mfu.py's profile and a 6-layer body: the
    loss and gradients bitwise the same, 0.90x the step time."""
    if any(not p.is_floating_point() or p.dtype != torch.float32 for p in model.parameters()):
        return
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def count_4bit_layers(model: torch.nn.Module) -> int:
    """How many linear layers hold bitsandbytes 4-bit weights (0 unless QLoRA)."""
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return 0
    return sum(isinstance(m, Linear4bit) for m in model.modules())
