"""ExportConfig / ExportOptions: pure data, every bad combination named by its field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tunestudio.export_config import ExportConfig, ExportOptions


@pytest.mark.parametrize(("fields", "words"), [
    ({"target": "gguf", "quantization": "q3"}, ("quantization 'q3'", "q8_0")),
    ({"target": "gguf-lora", "quantization": "q4_k_m"}, ("q4_k_m",)),
    ({"target": "merged", "quantization": "f16"}, ("quantization applies to gguf",)),
    ({"target": "hub"}, ("repo",)),
    ({"target": "hub", "repo": "a/b/c"}, ("'owner/name'",)),
    ({"target": "merged", "repo": "a/b"}, ("hub target only",)),
    ({"target": "tar"}, ("target",)),
    ({"target": "merged", "dtype": "int8"}, ("dtype",)),
    ({"target": "merged", "colour": "red"}, ("colour",)),
])
def test_bad_options_are_refused_with_the_reason(fields: dict, words: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        ExportOptions.model_validate(fields)
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_the_token_is_a_secret_and_the_public_part_round_trips() -> None:
    cfg = ExportConfig(source_dir="/jobs/a/output", target="hub", repo="me/x", hf_token="hf_SECRET")
    public = cfg.public_dict()
    assert "hf_token" not in public and "hf_SECRET" not in str(public) and "hf_SECRET" not in repr(cfg)
    assert cfg.secrets() == {"hf_token": "hf_SECRET"}
    assert ExportConfig.from_parts(public, cfg.secrets()) == cfg


def test_default_output_folders_lie_inside_the_job_output() -> None:
    def out(**fields: object) -> str:
        return ExportConfig(source_dir="/jobs/a/output/", **fields).resolved_output_dir()

    assert out(target="merged") == "/jobs/a/output/exports/merged-fp32"
    assert out(target="gguf") == "/jobs/a/output/exports/gguf-f16"
    assert out(target="gguf", quantization="q8_0") == "/jobs/a/output/exports/gguf-q8_0"
    assert out(target="gguf-lora", output_dir="/elsewhere") == "/elsewhere"
