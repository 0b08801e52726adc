"""Exports of an image job (issue 42, part 5), for both tiny vision-language families, each checked by a tool
that did not write it.

The job is faked as the image training path leaves one (a PEFT LoRA adapter on an
`AutoModelForImageTextToText` model with full module names as targets, in the vision tower, the projector and
the language model, random non-zero weights, no training; the processor; job_config.json with
`is_dataset_image`), so no job runs here. Merged folders are read back with `AutoModelForImageTextToText` and
`AutoProcessor`, GGUF files with the PyPI `gguf` package's GGUFReader.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tunestudio.events import Completed, Failed, Phase, Progress, parse_event
from tunestudio.export_config import ExportConfig
from tunestudio.worker.export import job as export
from tunestudio.worker.export.gguf_driver import text_architecture

from ..helpers.channel import ListChannel

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("smolvlm", "qwen2_vl")
# Where each family's pieces are: its language model's prefix, and one vision and one projector weight with the
# name llama.cpp gives it in the mmproj GGUF (rows: the part of a fused qkv weight that is q).
LAYOUT: dict[str, dict[str, Any]] = {
    "smolvlm": {"text": "model.text_model.", "arch": "llama", "projector": "idefics3", "checked": {
        "v.blk.0.attn_q.weight": ("model.vision_model.encoder.layers.0.self_attn.q_proj.weight", None),
        "mm.model.fc.weight": ("model.connector.modality_projection.proj.weight", None)}},
    "qwen2_vl": {"text": "model.language_model.", "arch": "qwen2vl", "projector": "qwen2vl_merger", "checked": {
        "v.blk.0.attn_q.weight": ("model.visual.blocks.0.attn.qkv.weight", slice(0, 64)),
        "mm.0.weight": ("model.visual.merger.mlp.0.weight", None)}},
}


def _build(directory: str, family: str) -> None:
    from tunestudio.worker.tiny_vision import build_tiny_vlm

    build_tiny_vlm(directory, family)


def tiny_vlm(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's tiny model as `make` built it (models/), else built once, in a child as make-tiny-model does."""
    built = REPO / "models" / f"tiny-{family.replace('_', '-')}"
    if (built / "config.json").is_file() and (built / "model.safetensors").is_file():
        return built
    directory = tmp_path_factory.mktemp(f"tiny-{family}")
    proc = mp.get_context("spawn").Process(target=_build, args=(str(directory), family))
    proc.start()
    proc.join(300)
    assert proc.exitcode == 0, f"building the tiny {family} model failed"
    return directory


def convertible(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`base`, or for a Qwen2-VL whose vision tower has fewer than 3 blocks a copy with 3 (its other weights the
    same): llama.cpp's converter names the merger's layers (visual.merger.mlp.0 and .2) by block index, so with 2
    blocks it has no name for mlp.2 ("Can not map tensor 'visual.merger.mlp.2.bias'"). Real Qwen2-VL towers have
    32 blocks; a 3-block tiny Qwen2-VL is asked of tiny_vision.py (issue 42)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(base))
    if config.model_type != "qwen2_vl" or config.vision_config.depth >= 3:
        return base
    copy = tmp_path_factory.mktemp("qwen2-vl-3-blocks")
    for path in base.iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            shutil.copy2(path, copy / path.name)
    config.vision_config.depth = 3
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.load_state_dict(AutoModelForImageTextToText.from_pretrained(str(base)).state_dict(), strict=False)
    model.save_pretrained(str(copy))
    return copy


@dataclass
class ImageJob:
    family: str
    base: Path
    out: Path  # the job's output folder: adapter, processor, job_config.json
    inputs: dict[str, torch.Tensor]  # a prompt with one image, through the processor
    logits: torch.Tensor  # base + adapter (peft, not merged) at the last position
    merged: dict[str, torch.Tensor]  # base + adapter merged by peft
    base_state: dict[str, torch.Tensor]


def fake_image_job(family: str, base: Path, out: Path) -> ImageJob:
    from peft import LoraConfig, get_peft_model
    from PIL import Image, ImageDraw
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tunestudio.worker.modalities.vision_compat import allow_missing_video

    allow_missing_video()
    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    targets = [name for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name != "lm_head"]
    with warnings.catch_warnings():  # peft 0.21.2 reads a deprecated transformers alias (as the worker notes)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: an adapter that changes nothing would prove nothing
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    peft_model.save_pretrained(str(out))
    processor = AutoProcessor.from_pretrained(str(base))
    processor.save_pretrained(str(out))
    (out / "job_config.json").write_text(json.dumps(
        {"model_name": str(base), "training_type": "lora", "is_dataset_image": True}))

    image = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(image).ellipse((12, 12, 52, 52), fill="red")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what shape?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = dict(processor(text=text, images=[image], return_tensors="pt"))
    peft_model.eval()
    with torch.no_grad():
        logits = peft_model(**inputs).logits[0, -1].clone()
        with peft_model.disable_adapter():
            base_logits = peft_model(**inputs).logits[0, -1]
    assert (logits - base_logits).abs().max() > 0.05  # the adapter matters
    merged = {k: v.clone() for k, v in peft_model.merge_and_unload().state_dict().items()}
    return ImageJob(family, base, out, inputs, logits, merged, base_state)


@pytest.fixture(scope="module")
def image_job(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ImageJob]:
    """The family's fake image job, made once per module."""
    made: dict[str, ImageJob] = {}

    def get(family: str) -> ImageJob:
        if family not in made:
            base = convertible(tiny_vlm(family, tmp_path_factory), tmp_path_factory)
            made[family] = fake_image_job(family, base, tmp_path_factory.mktemp(f"job-{family}") / "out")
        return made[family]

    return get


def run_export(**fields: Any) -> tuple[int, ListChannel, Completed | Failed]:
    channel = ListChannel()
    code = export.run(ExportConfig.model_validate(fields), channel)
    final = [e for e in map(parse_event, channel.lines) if isinstance(e, (Completed, Failed))]
    assert len(final) == 1, channel.lines
    return code, channel, final[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_image_job_loads_as_a_vlm_and_equals_base_plus_adapter(
    family: str, image_job: Callable[[str], ImageJob], tmp_path: Path
) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    job = image_job(family)
    out = tmp_path / "merged"
    code, _, done = run_export(source_dir=str(job.out), target="merged", output_dir=str(out))
    assert code == 0 and isinstance(done, Completed) and done.saved, done
    for name in ("model.safetensors", "config.json", "processor_config.json", "tokenizer.json",
                 "chat_template.jinja", "export.json"):
        assert (out / name).is_file(), name
    assert not (out / "adapter_config.json").exists()

    model = AutoModelForImageTextToText.from_pretrained(str(out))
    processor = AutoProcessor.from_pretrained(str(out))  # allow_missing_video: the export called it
    assert type(model).__name__ == {"smolvlm": "SmolVLMForConditionalGeneration",
                                    "qwen2_vl": "Qwen2VLForConditionalGeneration"}[family]
    assert processor.chat_template == AutoProcessor.from_pretrained(str(job.base)).chat_template
    with torch.no_grad():
        logits = model(**job.inputs).logits[0, -1]
    assert (logits - job.logits).abs().max().item() <= 1e-4


def _tensors(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    tensors = {t.name: torch.from_numpy(np.array(t.data, dtype=np.float32)).reshape(
        [int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_of_an_image_job_is_the_text_model_and_its_projector(
    family: str, image_job: Callable[[str], ImageJob], tmp_path: Path
) -> None:
    job, layout = image_job(family), LAYOUT[family]
    config = json.loads((job.base / "config.json").read_text())
    text_layers, vision_blocks = config["text_config"]["num_hidden_layers"], config["vision_config"].get(
        "num_hidden_layers", config["vision_config"].get("depth"))
    out = tmp_path / "gguf"
    code, channel, done = run_export(source_dir=str(job.out), target="gguf", output_dir=str(out))
    assert code == 0 and isinstance(done, Completed), done
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "export.json", "mmproj-f16.gguf", "model-f16.gguf"]
    steps = [e.step for e in map(parse_event, channel.lines) if isinstance(e, Progress)]
    assert steps == sorted(steps) and steps[-1] == 100

    fields, text = _tensors(out / "model-f16.gguf")
    assert fields["general.architecture"] == layout["arch"] and fields["general.type"] == "model"
    assert fields[f"{layout['arch']}.block_count"] == text_layers
    # every tensor of the language model (and the output layer), none of the vision tower or projector
    assert len(text) == len([k for k in job.merged if k.startswith(layout["text"])]) + 1
    assert not [name for name in text if name.startswith(("v.", "mm."))]
    v_proj = job.merged[f"{layout['text']}layers.0.self_attn.v_proj.weight"]
    torch.testing.assert_close(text["blk.0.attn_v.weight"], v_proj, atol=1e-3, rtol=1e-3)

    fields, projector = _tensors(out / "mmproj-f16.gguf")
    assert fields["general.architecture"] == "clip" and fields["general.type"] == "mmproj"
    assert fields["clip.projector_type"] == layout["projector"] and fields["clip.has_vision_encoder"] is True
    assert fields["clip.vision.block_count"] == vision_blocks
    assert fields["clip.vision.projection_dim"] == config["text_config"]["hidden_size"]
    assert projector and all(name.startswith(("v.", "mm.")) for name in projector)
    assert {f"v.blk.{i}.attn_q.weight" for i in range(vision_blocks)} <= set(projector)
    # the adapter's vision and projector weights reached the file, merged
    for name, (hf_name, rows) in layout["checked"].items():
        merged, base = job.merged[hf_name], job.base_state[hf_name]
        merged, base = (merged[rows], base[rows]) if rows else (merged, base)
        torch.testing.assert_close(projector[name], merged, atol=1e-3, rtol=1e-3)
        assert (projector[name] - base).abs().max() > 1e-2, name

    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./model-f16.gguf\nFROM ./mmproj-f16.gguf\n")
    assert 'TEMPLATE """' in modelfile and "{{ .Content }}" in modelfile


def test_an_image_model_llama_cpp_cannot_convert_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from transformers import PaliGemmaConfig

    source = tmp_path / "job"
    config = PaliGemmaConfig()
    config.architectures = ["PaliGemmaForConditionalGeneration"]  # in neither of the converter's tables
    config.save_pretrained(str(source))
    (source / "job_config.json").write_text(json.dumps({"model_name": "paligemma", "is_dataset_image": True}))
    before = sorted(p.name for p in source.iterdir())
    code, channel, failed = run_export(source_dir=str(source), target="gguf", output_dir=str(tmp_path / "gguf"))
    assert code == 1 and isinstance(failed, Failed)
    assert "PaliGemmaForConditionalGeneration" in failed.message and "llama.cpp" in failed.message
    assert "merged" in failed.message  # what to export instead
    assert not [e for e in map(parse_event, channel.lines) if isinstance(e, (Phase, Progress))]  # nothing loaded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"] and sorted(p.name for p in source.iterdir()) == before


def test_gguf_lora_of_an_image_job_is_refused_before_anything_is_written(
    image_job: Callable[[str], ImageJob], tmp_path: Path
) -> None:
    """llama.cpp's LoRA converter keeps a VLM adapter's text tensors and drops its vision ones without a word."""
    code, channel, failed = run_export(source_dir=str(image_job("smolvlm").out), target="gguf-lora",
                                       output_dir=str(tmp_path / "lora"))
    assert code == 1 and "gguf-lora" in failed.message and "mmproj" in failed.message, failed
    assert not [e for e in map(parse_event, channel.lines) if isinstance(e, (Phase, Progress))]
    assert list(tmp_path.iterdir()) == []


def test_a_smolvlm_text_half_without_its_architecture_is_converted_as_the_published_ones() -> None:
    """Published SmolVLM configs name their text half VLlama3ForCausalLM; one built from SmolVLMConfig does not,
    and llama.cpp would then look for SmolVLMForConditionalGeneration among its text models."""
    llama_half = {"text_config": {"model_type": "llama"}}
    assert text_architecture("SmolVLMForConditionalGeneration", llama_half) == "VLlama3ForCausalLM"
    assert text_architecture("Idefics3ForConditionalGeneration", llama_half) == "VLlama3ForCausalLM"
    named = {"text_config": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}}
    assert text_architecture("LlamaForCausalLM", named) == "LlamaForCausalLM"  # what llama.cpp found stays
    assert text_architecture("Qwen2VLForConditionalGeneration", llama_half) == "Qwen2VLForConditionalGeneration"


def test_a_converter_that_fails_is_named_in_the_error(tmp_path: Path) -> None:
    """The converter runs as `python -m ...gguf_driver`; its failure said "python3 failed" before."""
    from tunestudio.worker.errors import UserError
    from tunestudio.worker.export.gguf import require_convertible
    from tunestudio.worker.export.source import ExportStep

    with pytest.raises(UserError) as raised:
        require_convertible(tmp_path / "no-such-model", ExportStep.of(ListChannel()))
    assert str(raised.value).startswith("the GGUF converter failed (exit code 1):"), raised.value


def test_an_image_jobs_model_is_found_as_a_vision_model(tmp_path: Path) -> None:
    """The job's is_dataset_image decides; a folder without a job, its model's vision_config."""
    from tunestudio.worker.export.source import find_source

    def source(config: dict[str, Any], job: dict[str, Any] | None) -> bool:
        folder = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        if job is not None:
            (folder / "job_config.json").write_text(json.dumps(job))
        return find_source(ExportConfig(source_dir=str(folder), target="merged")).vision

    vlm = {"model_type": "smolvlm", "vision_config": {}}
    assert source(vlm, {"is_dataset_image": True, "training_type": "full"})
    assert source(vlm, None)
    assert not source({"model_type": "llama"}, None)
    assert not source({"model_type": "llama"}, {"is_dataset_image": False})
