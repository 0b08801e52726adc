"""An image job's estimate (tunestudio/estimate_vision.py, estimate.py): the vision tower and projector counted as
torch and peft count them, the image tokens as the processors make them, on both tiny families and on SmolVLM-256M's
published shape; the tower's memory where it trains, and nothing of it where it does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.estimate import ImageJob, image_flops, job_memory, memory
from tunestudio.estimate_vision import VisionTower, pixel_cap

from .helpers.jobs import job_config
from .helpers.real_shaped import SMOLVLM_256M
from .helpers.vision import FAMILIES, PICTURE

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def config_of(family: str) -> dict[str, Any]:
    folder = FAMILIES[family]
    assert (folder / "config.json").is_file(), f"{folder} is not built: `make test` builds it"
    return json.loads((folder / "config.json").read_text())


def on_meta(config: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(CONFIG_MAPPING[config["model_type"]](**fields))


@pytest.mark.parametrize("family", ["smolvlm", "qwen2_vl", "smolvlm-256m"])
def test_every_parameter_of_the_tower_projector_and_language_model_is_counted(family: str) -> None:
    config = SMOLVLM_256M if family == "smolvlm-256m" else config_of(family)
    model = on_meta(config)
    total = sum(p.numel() for p in model.parameters())
    got = memory(config, training_type="full", image=ImageJob())
    assert got.parameters == total and got.vision is not None
    tower = sum(p.numel() for n, p in model.named_parameters() if ".vision_model." in n or ".connector." in n
                or ".visual." in n)
    assert got.vision.parameters == tower
    assert memory(config).parameters == total - tower  # a text job counts the language model alone, as before
    if family == "smolvlm-256m":  # the name's 256M: 163M language model, 86M SigLIP tower, 7M connector
        assert 250e6 < total < 260e6 and 85e6 < tower < 95e6


# (finetune_vision_layers, finetune_language_layers, finetune_attention_modules, finetune_mlp_modules)
SWITCHES = [(True, True, True, True), (True, False, True, True), (False, True, True, True),
            (True, True, True, False), (True, True, False, True), (True, False, False, True)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lora_counts_what_the_switches_give_adapters_as_the_worker_chooses_them(family: str) -> None:
    from peft import LoraConfig, get_peft_model

    from tunestudio.worker.train.vision_layers import targets

    config = config_of(family)
    for vision, language, attention, mlp in SWITCHES:
        cfg = job_config(FAMILIES[family], Path("/tmp/out"), is_dataset_image=True, finetune_vision_layers=vision,
                         finetune_language_layers=language, finetune_attention_modules=attention,
                         finetune_mlp_modules=mlp, lora_r=8)
        model = on_meta(config)
        peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=targets(model, cfg)))
        trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        got = job_memory(config, cfg.model_dump(mode="json"), precision="fp32", checkpointing=False)
        assert got.trainable == trained, (vision, language, attention, mlp)
        assert got.vision is not None and got.vision.trains == vision
        assert got.adapter_bytes == 4 * trained
    # full: the switches freeze a side (worker/modalities/image.freeze_unchosen)
    full = memory(config, training_type="full", image=ImageJob(vision_layers=False))
    assert full.trainable == full.parameters - full.vision.parameters and not full.vision.trains


def processor_tokens(family: str, image: Any, **settings: Any) -> int:
    """The tokens one image adds to a conversation, as the family's real processor makes them."""
    from transformers import AutoProcessor

    from tunestudio.worker.modalities.vision_compat import allow_missing_video

    allow_missing_video()
    processor = AutoProcessor.from_pretrained(FAMILIES[family])
    for name, value in settings.items():
        setattr(processor.image_processor, name, value)
    ask = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    with_image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    plain = processor.apply_chat_template([ask], tokenize=True, return_dict=True)["input_ids"][0]
    shown = processor.apply_chat_template([with_image], images=[[image]], tokenize=True, return_dict=True)
    return len(shown["input_ids"][0]) - len(plain)


def test_image_tokens_are_the_processors_own_count() -> None:
    from PIL import Image

    big = Image.open(PICTURE).convert("RGB").resize((600, 600))
    smol = VisionTower.of(config_of("smolvlm"), 128)
    assert smol is not None
    # one 64 px view of 16 patches, folded 2x2: 4 tokens and their 3 markers
    assert smol.image(None, False).as_dict() == {"side": 64, "views": 1, "patches": 16, "tokens": 7}
    assert smol.image(None, False).tokens == processor_tokens("smolvlm", big)
    # split: resized to 128 or 192 px, tiles of 64 px and the global view, each tile with its row/column markers
    for side, views in ((128, 5), (192, 10)):
        split = smol.image(side, True)
        assert split.views == views and split.patches == views * 16
        assert split.tokens == processor_tokens("smolvlm", big, do_image_splitting=True,
                                                size={"longest_edge": side})
    # Qwen2-VL: its processor caps an image at 3,136 pixels (56 x 56: 16 patches, 4 tokens and 2 markers)
    qwen_config = config_of("qwen2_vl")
    cap = pixel_cap(json.loads((FAMILIES["qwen2_vl"] / "processor_config.json").read_text()))
    assert cap == 3136 and pixel_cap(json.loads((FAMILIES["smolvlm"] / "processor_config.json").read_text())) is None
    qwen = VisionTower.of(qwen_config, 128)
    assert qwen is not None
    assert qwen.image(None, False, cap).as_dict() == {"side": 56, "views": 1, "patches": 16, "tokens": 6}
    # the largest an image gets: a big square one (a smaller or a rounded-down one makes fewer, never more)
    assert qwen.image(None, False, cap).tokens == processor_tokens("qwen2_vl", big.resize((2000, 2000)))
    assert all(processor_tokens("qwen2_vl", big.resize(size)) <= 6 for size in ((96, 96), (600, 400), (600, 600)))
    assert qwen.image(448, False).patches == 1024 and qwen.image(448, False).tokens == 258  # no cap known: 448 px


def test_smolvlm_256m_makes_64_tokens_of_a_512_px_image_and_a_tower_that_dominates_the_flops() -> None:
    tower = VisionTower.of(SMOLVLM_256M, 576)
    assert tower is not None and tower.family == "idefics3" and not tower.approximate
    one = tower.image(None, False)
    assert (one.side, one.views, one.patches, one.tokens) == (512, 1, 1024, 64 + 3)
    split = tower.image(2048, True)  # SmolVLM's own default: 4 x 4 tiles of 512 px and the global view
    # 2 markers a tile, a newline a row; the last row's and the global view's newlines are one token, "\n\n" (SmolVLM's
    # vocabulary has it: llama.cpp's multimodal tool looks it up before each Idefics3 image, tools/mtmd/mtmd.cpp)
    assert split.views == 17 and split.tokens == 17 * 64 + 3 + 2 * 16 + 4
    # a row's picture costs far more than its tokens: 1,024 patches through 86M weights
    job = {"is_dataset_image": True, "training_type": "lora", "target_modules": None}
    assert image_flops(SMOLVLM_256M, job) == pytest.approx(2 * tower.flops(one))
    assert image_flops(SMOLVLM_256M, {**job, "finetune_vision_layers": False}) == pytest.approx(tower.flops(one))
    assert image_flops(SMOLVLM_256M, {**job, "is_dataset_image": False}) == 0.0
    assert tower.flops(one) > 150e9


def test_the_tower_keeps_activations_only_where_it_trains() -> None:
    config = SMOLVLM_256M
    both = memory(config, batch_size=4, seq_len=256, image=ImageJob())
    language_only = memory(config, batch_size=4, seq_len=256, image=ImageJob(vision_layers=False))
    text_job = memory(config, batch_size=4, seq_len=256)
    assert both.vision is not None and language_only.vision is not None and text_job.vision is None
    assert both.vision.activations_bytes > 50 * language_only.vision.activations_bytes
    assert language_only.vision.activations_bytes == 4 * 1024 * 768 * 4  # its output for 4 images, fp32
    assert both.activations_bytes - both.vision.activations_bytes == text_job.activations_bytes
    assert both.weights_bytes == 4 * both.parameters and both.parameters > text_job.parameters
    checkpointed = memory(config, batch_size=4, seq_len=256, image=ImageJob(), checkpointing=True)
    assert checkpointed.vision.activations_bytes < both.vision.activations_bytes / 4
    # splitting multiplies the views, and so the tower's memory
    split = memory(config, batch_size=4, seq_len=2048, image=ImageJob(max_image_size=1024, splitting=True))
    assert split.vision.image.views == 5
    assert split.vision.activations_bytes == pytest.approx(5 * both.vision.activations_bytes)
    # QLoRA: the tower's linears in 4 bits too
    qlora = memory(config, training_type="qlora", image=ImageJob())
    assert qlora.weights_bytes < both.weights_bytes / 3


def test_a_config_without_a_tower_and_other_families_are_said_as_they_are() -> None:
    text = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    assert memory(text, image=ImageJob()).vision is None  # the worker refuses such a job; nothing to count
    llava = {"model_type": "llava", "text_config": text,
             "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                               "num_attention_heads": 16, "image_size": 336, "patch_size": 14}}
    got = memory(llava, image=ImageJob())
    assert got.vision is not None and got.vision.approximate and got.vision.image.tokens == 576  # (336 / 14)^2
    gemma = {**llava, "model_type": "gemma3", "mm_tokens_per_image": 256}
    assert memory(gemma, image=ImageJob()).vision.image.tokens == 256
