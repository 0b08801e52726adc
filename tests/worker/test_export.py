"""Exports of a real LoRA job on the tiny model, each checked by a tool that did not write it.

The job trains once per module in a real worker; the exports run in this
process (`export.run` with an in-memory channel), and the GGUF conversion in
its own child, as in a worker. Merged folders are read back with
`AutoModelForCausalLM.from_pretrained`, GGUF files with transformers' GGUF
reader and gguf's GGUFReader (PyPI `gguf`, not the converter's copy).
"""

from __future__ import annotations

import json
import socket
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tunestudio import ownership
from tunestudio.events import Completed, Failed, Phase, Progress, Stop, parse_event
from tunestudio.export_config import ExportConfig
from tunestudio.worker import hub
from tunestudio.worker.export import job as export

from ..helpers.channel import ListChannel
from ..helpers.jobs import Run, job_config, run_job
from ..helpers.ports import refused_port

PROMPT = [{"role": "user", "content": "Repeat the word three times.\n\napple"}]
TOKEN = "hf_EXPORTSECRET_4711"


class WatchChannel(ListChannel):
    """A ListChannel that sends itself a cancel when `cancel_when(event)` first says so."""

    def __init__(self, cancel_when: Any = None) -> None:
        super().__init__()
        self.cancel_when = cancel_when
        self.cancel_sent = False

    def _send(self, line: str) -> None:
        super()._send(line)
        if self.cancel_when is not None and not self.cancel_sent and self.cancel_when(parse_event(line)):
            self.cancel_sent = True
            # emit() holds the channel's lock while sending; the command arrives as the parent's would, from outside.
            threading.Thread(target=self.receive, args=(Stop(save=False).model_dump_json(),)).start()

    def events(self) -> list[Any]:
        return [parse_event(line) for line in self.lines]


def run_export(channel: ListChannel | None = None, **fields: Any) -> tuple[int, ListChannel]:
    channel = channel or ListChannel()
    code = export.run(ExportConfig.model_validate(fields), channel)
    return code, channel


def ended(channel: ListChannel) -> Completed | Failed:
    events = [parse_event(line) for line in channel.lines]
    final = [e for e in events if isinstance(e, (Completed, Failed))]
    assert len(final) == 1, events
    return final[0]


@pytest.fixture(scope="module")
def lora_job(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("lora") / "out"
    run = run_job(job_config(tiny_model, out, max_steps=20, hf_token=TOKEN))
    assert run.outcome.kind == "completed", run.failure
    return run


@pytest.fixture(scope="module")
def reference(lora_job: Run, tiny_model: Path) -> dict[str, Any]:
    """Base + adapter through plain peft (not merged): the logits and greedy tokens every export must give."""
    from peft import PeftModel

    tokenizer = AutoTokenizer.from_pretrained(lora_job.completed.output_dir)
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(**ids).logits[0, -1].clone()
        with warnings.catch_warnings():  # peft 0.21.2 reads a deprecated transformers alias (as the worker notes)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = PeftModel.from_pretrained(base, lora_job.completed.output_dir).eval()
        logits = model(**ids).logits[0, -1]
        tokens = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    # The adapter must matter, or agreeing with base + adapter would prove nothing.
    assert (logits - base_logits).abs().max() > 0.05
    return {"ids": ids, "logits": logits, "tokens": tokens[0].tolist()}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0).item()


def test_merged_fp32_equals_base_plus_adapter(lora_job: Run, reference: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged", dtype="fp32",
                               output_dir=str(out))
    done = ended(channel)
    assert code == 0 and isinstance(done, Completed) and done.saved, done
    assert done.output_dir == str(out)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja", "export.json"):
        assert (out / name).is_file(), name
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.float32
    with torch.no_grad():
        logits = model(**reference["ids"]).logits[0, -1]
    assert (logits - reference["logits"]).abs().max().item() <= 1e-4

    events = [parse_event(line) for line in channel.lines]
    assert next(e.phase for e in events if isinstance(e, Phase)) == "loading_model"
    steps = [e.step for e in events if isinstance(e, Progress)]
    assert steps == sorted(steps) and steps[-1] == 100 and {e.total_steps for e in events if isinstance(e, Progress)} \
        == {100}
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no staging folder left beside it


def test_merged_bf16_is_saved_in_bf16(lora_job: Run, tmp_path: Path) -> None:
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged", dtype="bf16",
                               output_dir=str(tmp_path / "m"))
    assert code == 0, ended(channel)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"


@pytest.mark.parametrize("quantization", ["f16", "q8_0"])
def test_gguf_reads_back_close_to_base_plus_adapter(
    quantization: str, lora_job: Run, reference: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "gguf"
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="gguf",
                               quantization=quantization, output_dir=str(out))
    done = ended(channel)
    assert code == 0 and isinstance(done, Completed), done
    name = f"model-{quantization}.gguf"
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "export.json", name]
    # The tiny model's tokenizer is unknown to llama.cpp's hash table: handled, and said.
    assert any("pre-tokenizer" in w and "'gpt-2'" in w for w in channel.warnings()), channel.warnings()
    steps = [e.step for e in map(parse_event, channel.lines) if isinstance(e, Progress)]
    assert steps == sorted(steps) and any(30 < s < 100 for s in steps), steps

    model = AutoModelForCausalLM.from_pretrained(str(out), gguf_file=name, dtype=torch.float32)
    with torch.no_grad():
        logits = model(**reference["ids"]).logits[0, -1]
        tokens = model.generate(**reference["ids"], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert _cosine(logits, reference["logits"]) >= 0.99
    if quantization == "f16":
        assert tokens[0].tolist() == reference["tokens"]
    # The GGUF's own tokenizer (as the reader rebuilds it) encodes the prompt as the original does.
    gguf_tokenizer = AutoTokenizer.from_pretrained(str(out), gguf_file=name)
    text = AutoTokenizer.from_pretrained(lora_job.completed.output_dir).apply_chat_template(
        PROMPT, add_generation_prompt=True, tokenize=False)
    assert gguf_tokenizer(text, add_special_tokens=False).input_ids == reference["ids"]["input_ids"][0].tolist()

    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith(f"FROM ./{name}\n")
    assert 'PARAMETER stop "<|end|>"' in modelfile
    assert '{{ else if eq .Role "user" }}<|user|>{{ .Content }}<|end|>' in modelfile
    assert modelfile.split('TEMPLATE """', 1)[1].startswith("<|bos|>{{ range .Messages }}")


def test_gguf_lora_tensors_match_the_adapter(lora_job: Run, tmp_path: Path) -> None:
    from gguf import GGUFReader
    from safetensors.torch import load_file

    out = tmp_path / "lora"
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="gguf-lora",
                               quantization="f32", output_dir=str(out))
    assert code == 0, ended(channel)
    reader = GGUFReader(str(out / "adapter-f32.gguf"))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    adapter_dir = Path(lora_job.completed.output_dir)
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["adapter.lora.alpha"] == adapter_config["lora_alpha"]

    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    written = {t.name: torch.from_numpy(t.data.copy()).reshape([int(n) for n in reversed(t.shape)])
               for t in reader.tensors}
    assert len(written) == len(adapter) > 0
    for key, tensor in adapter.items():
        # base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight -> blk.3.attn_q.weight.lora_a
        parts = key.split(".")
        layer, module, ab = parts[4], parts[6], parts[7][-1].lower()
        got = written[f"blk.{layer}.{names[module]}.weight.lora_{ab}"]
        assert got.shape == tensor.shape, key
        # llama.cpp permutes the rows of q/k projections (its rotary layout); the values themselves are equal.
        if module in ("q_proj", "k_proj") and ab == "b":
            got, tensor = got.sort(dim=0).values, tensor.sort(dim=0).values
        assert torch.equal(got, tensor.float()), key


def test_cancel_mid_conversion_leaves_nothing_where_the_file_would_be(lora_job: Run, tmp_path: Path) -> None:
    out = tmp_path / "gguf"
    # The stop arrives as the conversion starts: the merged model sits in staging, the converter is starting.
    channel = WatchChannel(lambda e: isinstance(e, Phase) and e.phase == "saving")
    code, channel = run_export(channel, source_dir=lora_job.completed.output_dir, target="gguf",
                               quantization="q8_0", output_dir=str(out))
    done = ended(channel)
    assert code == 0 and isinstance(done, Completed) and done.stopped and not done.saved, done
    assert channel.cancel_sent
    assert list(tmp_path.iterdir()) == []  # neither the output folder nor its staging folder


def test_a_later_export_replaces_an_earlier_one_but_never_a_stranger(lora_job: Run, tmp_path: Path) -> None:
    out = tmp_path / "m"
    for _ in range(2):
        code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged", output_dir=str(out))
        assert code == 0, ended(channel)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    stranger = tmp_path / "mine"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("keep me")
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged", output_dir=str(stranger))
    assert code == 1 and "is not an earlier export" in ended(channel).message
    assert (stranger / "notes.txt").read_text() == "keep me"
    # A folder of the staging folder's name that tunestudio did not make is never removed.
    theirs = tmp_path / ".new.partial"
    theirs.mkdir()
    (theirs / "draft.txt").write_text("keep me too")
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged",
                               output_dir=str(tmp_path / "new"))
    assert code == 1 and "did not make" in ended(channel).message
    assert (theirs / "draft.txt").read_text() == "keep me too" and not (tmp_path / "new").exists()


def test_an_export_again_into_its_folder_replaces_only_the_earlier_exports_files(lora_job: Run,
                                                                                 tmp_path: Path) -> None:
    out = tmp_path / "exports" / "merged"
    source = lora_job.completed.output_dir
    ownership.take(out, "e1")  # as the manager does before each export's worker starts
    code, channel = run_export(source_dir=source, target="merged", output_dir=str(out))
    assert code == 0, ended(channel)
    first = ownership.seal(out, "e1")
    assert "model.safetensors" in first and "export.json" in first
    (out / "notes.txt").write_text("the user's, added after the export")
    (out / "old-q8_0.gguf").write_bytes(b"gone with the earlier export")  # a file only the earlier one wrote
    record = json.loads((out / "export.json").read_text())
    (out / "export.json").write_text(json.dumps({**record, "files": [*record["files"], "old-q8_0.gguf"]}))

    (ownership.stage(out) / "model.safetensors").write_bytes(b"half")  # what an export killed meanwhile left

    ownership.take(out, "e2")  # the same target again: the default folder, exports/<target>
    code, channel = run_export(source_dir=source, target="merged", output_dir=str(out))
    assert code == 0, ended(channel)
    assert (out / "notes.txt").read_text() == "the user's, added after the export"
    assert not (out / "old-q8_0.gguf").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged"]  # no staging or .old folder beside it
    # The files it replaced are the second export's now: deleting either never takes the user's file.
    assert ownership.seal(out, "e2") == first and ownership.files(out, "e1") == []
    ownership.release(out, "e2")
    ownership.release(out, "e1")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_an_export_never_overwrites_a_file_the_earlier_export_did_not_write(lora_job: Run, tmp_path: Path) -> None:
    out = tmp_path / "m"
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged", output_dir=str(out))
    assert code == 0, ended(channel)
    record = json.loads((out / "export.json").read_text())
    listed = [name for name in record["files"] if name != "config.json"]
    (out / "export.json").write_text(json.dumps({**record, "files": listed}))
    (out / "config.json").write_text("the user's own config")  # a name the export writes, not the earlier one's
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="merged", output_dir=str(out))
    failed = ended(channel)
    assert code == 1 and "config.json" in failed.message and "did not write" in failed.message, failed
    assert (out / "config.json").read_text() == "the user's own config"
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing of the earlier one moved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_q4_k_m_without_llama_quantize_says_how_to_get_it(
    lora_job: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="gguf", quantization="q4_k_m",
                               output_dir=str(tmp_path / "q4"))
    failed = ended(channel)
    assert code == 1 and isinstance(failed, Failed)
    assert "llama-quantize" in failed.message and "PATH" in failed.message and "q8_0" in failed.message
    assert not [e for e in map(parse_event, channel.lines) if isinstance(e, (Phase, Progress))]  # nothing loaded first
    assert not (tmp_path / "q4").exists()


def test_hub_offline_fails_at_once_and_the_token_appears_nowhere(
    lora_job: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    hub.hub_reachable.cache_clear()
    try:
        with refused_port() as port:
            monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
            code, channel = run_export(source_dir=lora_job.completed.output_dir, target="hub",
                                       repo="me/tiny-export", hf_token=TOKEN, output_dir=str(tmp_path / "hub"))
    finally:
        hub.hub_reachable.cache_clear()
    failed = ended(channel)
    assert code == 1 and isinstance(failed, Failed)
    assert failed.message.startswith("hub unreachable") and "127.0.0.1" in failed.message
    # The probe's answer, before anything was loaded or uploaded (huggingface_hub's own retries are not waited for).
    assert not [e for e in map(parse_event, channel.lines) if isinstance(e, (Phase, Progress))]
    captured = capfd.readouterr()
    texts = [*channel.lines, captured.out, captured.err]
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(TOKEN in text for text in texts)
    assert "hf_token" not in ExportConfig(source_dir="x", target="hub", repo="a/b", hf_token=TOKEN).public_dict()
    assert not (tmp_path / "hub").exists()


def test_hub_that_drops_the_connection_is_reported_by_the_real_client(
    lora_job: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The probe connects, then huggingface_hub's own request breaks: the same clear error, no token."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def drop_everyone() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=drop_everyone, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    hub.hub_reachable.cache_clear()
    try:
        code, channel = run_export(source_dir=lora_job.completed.output_dir, target="hub", repo="me/tiny-export",
                                   hf_token=TOKEN, output_dir=str(tmp_path / "hub"))
    finally:
        hub.hub_reachable.cache_clear()
        stop.set()
        thread.join(5)
        server.close()
    failed = ended(channel)
    assert code == 1 and isinstance(failed, Failed), failed
    assert failed.message.startswith("hub unreachable") and "me/tiny-export" in failed.message
    captured = capfd.readouterr()
    assert not any(TOKEN in text for text in [*channel.lines, captured.out, captured.err, failed.traceback])
    assert not (tmp_path / "hub").exists() and list(tmp_path.iterdir()) == []


def test_model_card_is_built_from_the_job(lora_job: Run) -> None:
    from tunestudio.worker.export.hub import model_card
    from tunestudio.worker.export.job import find_source

    cfg = ExportConfig(source_dir=lora_job.completed.output_dir, target="hub", repo="me/tiny-export")
    card = model_card(find_source(cfg), cfg)
    # the tiny base is a local folder: named by its folder alone, and no base_model metadata (hub ids only)
    assert card.startswith("---\n") and "base_model:" not in card and "library_name: peft" in card
    assert "| max_steps | 20 |" in card and "`alpaca.jsonl`" in card and "| loss |" in card
    assert str(Path(lora_job.completed.output_dir).parent) not in card


def test_converter_missing_is_a_clear_error(lora_job: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNESTUDIO_LLAMA_CPP", str(tmp_path / "nowhere"))
    code, channel = run_export(source_dir=lora_job.completed.output_dir, target="gguf",
                               output_dir=str(tmp_path / "g"))
    assert code == 1 and "make setup" in ended(channel).message
