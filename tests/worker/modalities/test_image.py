"""Image jobs (worker/modalities/image.py): the switches choose the layers, the processor is set for a CPU, and a
short job on each tiny family trains, evaluates with its images and saves what a vision model loads."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tunestudio.worker.modalities.image import set_for_cpu
from tunestudio.worker.train.vision_layers import ATTENTION_PARTS, PROJECTOR_PARTS, VISION_PARTS, targets

from ...helpers.jobs import job_config

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[3]
FAMILIES = {"smolvlm": REPO / "models" / "tiny-smolvlm", "qwen2_vl": REPO / "models" / "tiny-qwen2-vl"}
SHAPES = REPO / "examples" / "data"


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, Path]:
    folder = FAMILIES[request.param]
    assert (folder / "model.safetensors").is_file(), f"{folder} is not built: `make test` builds it"
    return request.param, folder


@pytest.fixture(scope="module")
def loaded(family: tuple[str, Path]) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from tunestudio.worker.modalities.vision_compat import allow_missing_video

    allow_missing_video()
    return AutoModelForImageTextToText.from_pretrained(family[1]), (AutoProcessor.from_pretrained(family[1]),
                                                                     AutoConfig.from_pretrained(family[1]))


def _shapes(tmp: Path, train: int = 8, held: int = 4) -> tuple[Path, Path]:
    """A few of the bundled rows with their pictures, copied beside their own data files."""
    for name, n in (("shapes.jsonl", train), ("shapes_eval.jsonl", held)):
        rows = [json.loads(line) for line in (SHAPES / name).read_text().splitlines()[:n]]
        (tmp / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        for row in rows:
            (tmp / row["images"][0]).parent.mkdir(exist_ok=True)
            shutil.copy(SHAPES / row["images"][0], tmp / row["images"][0])
    return tmp / "shapes.jsonl", tmp / "shapes_eval.jsonl"


@pytest.mark.parametrize(("switches", "vision", "language", "attention", "mlp"), [
    ({}, True, True, True, True),
    ({"finetune_vision_layers": False}, False, True, True, True),
    ({"finetune_language_layers": False}, True, False, True, True),
    ({"finetune_attention_modules": False}, True, True, False, True),
    ({"finetune_mlp_modules": False}, True, True, True, False),
])
def test_the_four_switches_choose_the_layers_that_get_adapters(loaded: tuple[Any, Any], family: tuple[str, Path],
                                                               tmp_path: Path, switches: dict[str, bool],
                                                               vision: bool, language: bool, attention: bool,
                                                               mlp: bool) -> None:
    model, _ = loaded
    cfg = job_config(family[1], tmp_path, is_dataset_image=True, **switches)
    names = targets(model, cfg)
    sides = {bool(VISION_PARTS.search(n)) for n in names}
    assert (True in sides) is vision and (False in sides) is language
    def is_attention(name: str) -> bool:
        return bool(ATTENTION_PARTS.search(name)) and not PROJECTOR_PARTS.search(name)

    assert any(is_attention(n) for n in names) is attention
    assert any(not is_attention(n) for n in names) is mlp
    assert not any(n.endswith("lm_head") for n in names)


def test_the_processor_is_set_for_a_cpu(loaded: tuple[Any, Any], family: tuple[str, Path], tmp_path: Path) -> None:
    _, (processor, config) = loaded
    said = set_for_cpu(processor, config, job_config(family[1], tmp_path, is_dataset_image=True, max_image_size=28))
    size = processor.image_processor.size
    if family[0] == "qwen2_vl":
        assert size.longest_edge == 28 * 28 and said == ["at most 784 pixels an image"]
    else:
        assert size.longest_edge == 28 and processor.image_processor.do_image_splitting is False
        assert said == ["splitting off", "longest side 28 px"]


def test_the_config_refuses_what_images_cannot_do(tmp_path: Path) -> None:
    model = FAMILIES["smolvlm"]
    with pytest.raises(ValidationError, match="method: orpo trains text data, not image data"):
        job_config(model, tmp_path, is_dataset_image=True, method="orpo")
    with pytest.raises(ValidationError, match="finetune_vision_layers: at least one of"):
        job_config(model, tmp_path, is_dataset_image=True, finetune_vision_layers=False,
                   finetune_language_layers=False)
    with pytest.raises(ValidationError, match="finetune_language_layers: a text model has language layers only"):
        job_config(model, tmp_path, finetune_language_layers=False)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_a_short_image_job_trains_evaluates_with_its_pictures_and_saves_a_vision_model(
        family: tuple[str, Path], tmp_path: Path) -> None:
    """is_dataset_image is left off: the rows' images make it an image job."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tunestudio.events import Completed, parse_event
    from tunestudio.worker import main

    from ...helpers.channel import ListChannel

    train, held = _shapes(tmp_path)
    cfg = job_config(family[1], tmp_path / "out", local_datasets=[str(train)], eval_split=str(held), max_steps=2,
                     eval_steps=2, eval_generate_rows=2, batch_size=4, sample_prompts=["Hello"], precision="fp32",
                     train_on_completions=True)
    channel = ListChannel()
    assert main.run(cfg, channel) == 0, channel.lines[-3:]
    done = parse_event(channel.lines[-1])
    assert isinstance(done, Completed) and done.evaluation is not None
    log = "\n".join(channel.lines)
    assert "is_dataset_image auto-detected" in log
    from tunestudio.events import Phase

    counted = [e for e in map(parse_event, channel.lines) if isinstance(e, Phase) and e.phase == "loading_dataset"
               and e.done is not None]
    assert counted and counted[-1].done == counted[-1].total  # the images were read and checked with a count
    sides = re.search(r"LoRA targets .*: (\d+) in the vision tower and projector, (\d+) in the language model", log)
    assert sides is not None and int(sides[1]) > 0 and int(sides[2]) > 0  # as peft wrapped them
    # the job's resolved record says the same (the page's config card and `tunestudio jobs show` show it)
    assert done.resolved["lora_targets"].endswith(sides[0].split(": ", 1)[1])
    assert done.resolved["precision"] == "fp32" and done.resolved["gradient_checkpointing"] in ("on", "off")
    assert "longest side" in done.resolved["images"] or "pixels" in done.resolved["images"]
    assert set(done.evaluation.metrics) >= {"exact_match", "token_f1", "rouge_l", "eval_loss"}
    assert done.evaluation.examples[0].prompt.startswith("[image]")
    rows = json.loads(Path(done.evaluation.rows_file).read_text())["rows"]
    assert len(rows) == 2 and rows[0]["images"][0].startswith("data:image/png;base64,")
    assert json.loads((tmp_path / "out" / "job_config.json").read_text())["is_dataset_image"] is True

    from peft import PeftModel

    from tunestudio.worker.modalities.vision_compat import allow_missing_video

    allow_missing_video()
    processor = AutoProcessor.from_pretrained(tmp_path / "out")  # the job's processor, as a chat worker loads it
    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(family[1]), tmp_path / "out")
    assert processor.chat_template and any("lora_" in n for n, _ in model.named_parameters())


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_early_stopping_on_exact_match_answers_with_the_pictures_and_keeps_the_best(
        tmp_path: Path) -> None:
    from tunestudio.events import Completed, parse_event
    from tunestudio.worker import main

    from ...helpers.channel import ListChannel

    train, held = _shapes(tmp_path)
    cfg = job_config(FAMILIES["smolvlm"], tmp_path / "out", local_datasets=[str(train)], eval_split=str(held),
                     max_steps=4, eval_steps=2, eval_generate_rows=2, batch_size=4, precision="fp32",
                     early_stopping={"metric": "exact_match", "patience": 5}, keep_best=True)
    channel = ListChannel()
    assert main.run(cfg, channel) == 0, channel.lines[-3:]
    done = parse_event(channel.lines[-1])
    assert isinstance(done, Completed) and done.best is not None and done.best.metric == "exact_match"


@pytest.mark.parametrize("longest", [28, 128])
def test_a_job_image_size_keeps_image_tokens_and_features_equal(loaded: tuple[Any, Any], family: tuple[str, Path],
                                                                tmp_path: Path, longest: int) -> None:
    """Idefics3's tile stays the tower's input whatever the side (a tile of another size made 16 features for 4
    tokens); Qwen2-VL's pixel budget shrinks with it."""
    from PIL import Image

    model, (processor, config) = loaded
    set_for_cpu(processor, config, job_config(family[1], tmp_path, is_dataset_image=True, max_image_size=longest))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    inputs = processor.apply_chat_template([messages], images=[[Image.new("RGB", (200, 150), "red")]],
                                           add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    assert model(**inputs).logits.shape[1] == inputs["input_ids"].shape[1]


def _pairs(tmp: Path, n: int, name: str) -> Path:
    """Preference pairs on the bundled pictures: the picture's colour chosen over another colour."""
    rows = [json.loads(line) for line in (SHAPES / "shapes.jsonl").read_text().splitlines()[:n]]
    out = []
    for row in rows:
        colour = row["messages"][1]["content"][0]["text"]
        (tmp / row["images"][0]).parent.mkdir(exist_ok=True)
        shutil.copy(SHAPES / row["images"][0], tmp / row["images"][0])
        out.append({"images": row["images"], "prompt": "What colour is the shape?", "chosen": colour,
                    "rejected": "green" if colour != "green" else "red"})
    (tmp / name).write_text("".join(json.dumps(r) + "\n" for r in out))
    return tmp / name


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_dpo_trains_on_image_preference_pairs(tmp_path: Path) -> None:
    from tunestudio.events import Completed, parse_event
    from tunestudio.worker import main

    from ...helpers.channel import ListChannel

    cfg = job_config(FAMILIES["smolvlm"], tmp_path / "out", method="dpo",
                     local_datasets=[str(_pairs(tmp_path, 8, "pairs.jsonl"))],
                     eval_split=str(_pairs(tmp_path, 4, "held.jsonl")), max_steps=2, eval_steps=2,
                     eval_generate_rows=2, batch_size=2, precision="fp32")
    channel = ListChannel()
    assert main.run(cfg, channel) == 0, channel.lines[-3:]
    done = parse_event(channel.lines[-1])
    assert isinstance(done, Completed) and done.evaluation is not None
    assert "is_dataset_image auto-detected" in "\n".join(channel.lines)
    assert done.evaluation.examples[0].prompt.startswith("[image]")
    assert any("rewards/margins" in (r.get("extra") or {}) for r in map(json.loads, (
        tmp_path / "out" / "metrics.jsonl").read_text().splitlines()))
