"""The form's labels, groups and help are the fields' own (issue 39, point 6): each JobConfig field says them
(config/parts.py, config/reporting.py: title, json_schema_extra group and help), GET /api/web/defaults sends
them (api/routes/web.form_fields), and no page script keeps a copy (form.js's LABELS and advanced.js's ADVANCED
were one)."""

from __future__ import annotations

import re
from pathlib import Path

from tunestudio.api.routes.web import form_fields
from tunestudio.config import FIELD_GROUPS, JobConfig

JS = Path(__file__).parents[2] / "tunestudio" / "api" / "static" / "js"


def test_every_field_the_form_shows_has_its_own_title_group_and_help() -> None:
    shown = [f for f in form_fields() if not f.hidden]
    assert len(shown) > 60
    for f in shown:
        info = JobConfig.model_fields[f.name]
        assert info.title and f.title == info.title, f"{f.name}: no title of its own (the page would show its name)"
        assert f.group in FIELD_GROUPS, f"{f.name}: group {f.group!r} is not one of config.FIELD_GROUPS"
    helpless = {f.name for f in shown if not f.help}
    # the page gives these their help (the dataset files' roots), or a label and bounds say enough
    assert helpless == {"training_type", "local_datasets", "format_type", "max_seq_length", "num_epochs",
                        "learning_rate", "batch_size", "gradient_accumulation_steps", "logging_steps", "lora_r",
                        "lora_alpha", "lora_dropout"}


def test_the_page_reads_the_fields_words_as_the_page_said_them() -> None:
    by_name = {f.name: f for f in form_fields()}
    # a label, a help that differs from the API's description, an example, a choice's words
    assert by_name["lr_scheduler_type"].title == "LR schedule"
    assert by_name["save_steps"].help == "Steps between checkpoints; 0: only at a stop and the end."
    assert by_name["save_steps"].description == "0: no periodic checkpoints."
    assert by_name["subset"].help == by_name["subset"].description
    assert by_name["custom_format_mapping"].placeholder == '{"question": "user", "answer": "assistant"}'
    assert by_name["training_type"].choice_labels == {
        "lora": ["LoRA", "small adapters on a frozen model"],
        "qlora": ["QLoRA", "LoRA on 4-bit weights (bitsandbytes; CPU or GPU)"],
        "full": ["Full", "every weight is trained"]}
    # issues 42 and 45: the image and audio fields are shown, under "Images and audio"; the attention/MLP switches
    # choose the adapters of text, image and audio jobs alike, under LoRA
    assert {n for n, f in by_name.items() if f.hidden} == set()
    assert {n for n, f in by_name.items() if f.group == "media" and not f.hidden} == {
        "is_dataset_image", "finetune_vision_layers", "finetune_language_layers", "image_splitting", "max_image_size",
        "is_dataset_audio", "audio_language", "audio_task"}
    assert by_name["finetune_attention_modules"].group == by_name["finetune_mlp_modules"].group == "lora"


def test_no_page_script_keeps_a_label_or_help_table() -> None:
    fields = [f for f in form_fields() if not f.hidden]
    found = []
    for path in sorted(JS.glob("*.js")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for f in fields:
                named = re.search(rf"\b{f.name}\b", line)
                titled = any(f"{q}{f.title}{q}" in line for q in "\"'`")
                if (named and titled) or (f.help and len(f.help) > 20 and f.help[:40] in line):
                    found.append(f"{path.name}:{number}: {f.name}")
    assert found == [], "labels and help live on the fields (config/parts.py):\n" + "\n".join(found)
