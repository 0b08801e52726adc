"""A speech-to-text job on the tiny Whisper (issue 45): trained by Seq2SeqTrainer on the bundled clips, evaluated
by WER and CER before and after, saved so that plain transformers and peft load it; what it refuses, by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers.audio import SPEECH, WHISPER
from ..helpers.jobs import Run, job_config, run_job

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


def audio_config(out: Path, **overrides: object):  # type: ignore[no-untyped-def]
    fields = {"is_dataset_audio": True, "local_datasets": [str(SPEECH)], "eval_split": "test", "max_steps": 6,
              "batch_size": 8, "max_seq_length": 32, "learning_rate": 1e-3, "eval_steps": 6,
              "eval_generate_rows": 6, "audio_language": "en", **overrides}
    return job_config(WHISPER, out, **fields)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # evaluated at steps 3 and 6, watched by early stopping on the eval loss, the best step's weights kept
    return run_job(audio_config(tmp_path_factory.mktemp("audio") / "out", eval_steps=3, keep_best=True,
                                early_stopping={"metric": "eval_loss", "patience": 5}))


def test_an_audio_job_trains_evaluates_by_error_rates_and_saves_what_peft_loads(lora_run: Run) -> None:
    done = lora_run.completed
    evaluation = done.evaluation
    assert evaluation is not None and evaluation.rows == 6
    for name in ("wer", "cer", "eval_loss"):
        assert evaluation.metrics[name].before is not None and evaluation.metrics[name].after is not None
    assert evaluation.metrics["eval_loss"].after < evaluation.metrics["eval_loss"].before
    assert done.best is not None and done.best.step in (3, 6) and done.best.metric == "eval_loss"
    assert "window 2 s, language en, task transcribe" in done.resolved["audio"]
    rows = json.loads(Path(evaluation.rows_file).read_text())
    assert rows["metrics"] == ["wer", "cer"] and len(rows["rows"]) == 6
    first = rows["rows"][0]
    assert first["audio"].startswith("data:audio/wav;base64,") and first["reference"] == "zero red"
    assert first["file"].endswith("test/metadata.csv") and first["line"] == 2

    # plain transformers and peft read what the job saved, and transcribe as the job's evaluation did
    import soundfile
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    processor = AutoProcessor.from_pretrained(done.output_dir)
    assert (processor.tokenizer.language, processor.tokenizer.task) == ("en", "transcribe")
    model = PeftModel.from_pretrained(AutoModelForSpeechSeq2Seq.from_pretrained(str(WHISPER)), done.output_dir)
    samples, rate = soundfile.read(SPEECH / "test" / "test-000.wav", dtype="float32")
    features = processor(samples, sampling_rate=rate, return_tensors="pt").input_features
    with torch.no_grad():
        ids = model.merge_and_unload().generate(input_features=features, language="en", task="transcribe",
                                                max_new_tokens=2 * 3 + 8)
    assert processor.batch_decode(ids, skip_special_tokens=True)[0].strip() == first["answer"]


def test_a_text_model_or_text_data_in_an_audio_job_is_refused_by_name(tiny_model: Path, tmp_path: Path) -> None:
    from tunestudio.worker.errors import UserError
    from tunestudio.worker.modalities import named

    from ..helpers.jobs import DATA

    audio = named("audio")
    cfg = audio_config(tmp_path / "out", eval_split=None, eval_steps=0)
    with pytest.raises(UserError, match="is a llama model, not a speech encoder-decoder"):
        audio.load_processor(cfg.model_copy(update={"model_name": str(tiny_model)}))
    processor = audio.load_processor(cfg)
    with pytest.raises(UserError, match="holds no recordings in its first rows"):
        audio.prepare_data(cfg.model_copy(update={"local_datasets": [str(DATA / "alpaca.jsonl")]}), processor)
    with pytest.raises(UserError, match="audio_language: Unsupported language: klingon"):
        audio.load_processor(cfg.model_copy(update={"audio_language": "klingon"}))


def test_the_merged_export_is_a_whisper_model_with_its_processor_and_gguf_is_refused(lora_run: Run,
                                                                                     tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor, WhisperForConditionalGeneration

    from tunestudio.events import Completed, Failed, parse_event
    from tunestudio.export_config import ExportConfig
    from tunestudio.worker.export import job as export

    from ..helpers.channel import ListChannel

    def run_export(target: str) -> tuple[int, Completed | Failed]:
        channel = ListChannel()
        code = export.run(ExportConfig.model_validate({"source_dir": lora_run.completed.output_dir, "target": target,
                                                       "output_dir": str(tmp_path / target)}), channel)
        return code, [e for e in map(parse_event, channel.lines) if isinstance(e, (Completed, Failed))][-1]

    code, done = run_export("merged")
    assert code == 0 and isinstance(done, Completed), done
    merged = WhisperForConditionalGeneration.from_pretrained(str(tmp_path / "merged"))
    processor = AutoProcessor.from_pretrained(str(tmp_path / "merged"))
    assert merged.generation_config.lang_to_id["<|en|>"] == processor.tokenizer.convert_tokens_to_ids("<|en|>")
    plain = PeftModel.from_pretrained(AutoModelForSpeechSeq2Seq.from_pretrained(str(WHISPER)),
                                      lora_run.completed.output_dir).merge_and_unload()
    features = torch.randn(1, 80, 200)
    labels = torch.tensor([[processor.tokenizer.convert_tokens_to_ids("<|en|>"), 500, 501]])
    with torch.no_grad():
        ours, theirs = merged(input_features=features, labels=labels).logits, plain(input_features=features,
                                                                                   labels=labels).logits
    assert torch.allclose(ours, theirs, atol=1e-5)
    code, refused = run_export("gguf")
    assert code == 1 and isinstance(refused, Failed) and "whisper.cpp has its own format" in refused.message
    assert not (tmp_path / "gguf").exists()
