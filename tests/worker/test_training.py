"""Real training of the embedded tiny model in a real worker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.events import Completed, Phase, Progress, WarningEvent, parse_event
from tunestudio.jobs.supervisor import Supervisor

from ..helpers.jobs import Run, job_config, run_job


def metric_records(output_dir: str | Path) -> list[dict]:
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def mean_loss(records: list[dict], which: slice) -> float:
    losses = [r["loss"] for r in records if r["loss"] is not None][which]
    return sum(losses) / len(losses)


@pytest.fixture(scope="module")
def lora_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("lora") / "out"
    return run_job(job_config(tiny_model, out, max_steps=40, hf_token="hf_TOPSECRET_abc"),
                   log_path=out.parent / "worker.log")


def test_lora_loss_falls_and_artefacts_are_complete(lora_run: Run) -> None:
    assert lora_run.outcome.kind == "completed", lora_run.failure
    out = Path(lora_run.completed.output_dir)
    records = metric_records(out)
    assert [r["step"] for r in records if r["loss"] is not None] == list(range(1, 41))
    first, last = mean_loss(records, slice(0, 3)), mean_loss(records, slice(-3, None))
    # Stated: with seed 7, 40 LoRA steps cut the training loss by at least 25%.
    assert last <= 0.75 * first, (first, last)
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "job_config.json"):
        assert (out / name).is_file(), name
    stored = json.loads((out / "job_config.json").read_text())
    assert stored["max_steps"] == 40 and "hf_token" not in stored
    secret_hits = [p for p in out.rglob("*") if p.is_file() and b"TOPSECRET" in p.read_bytes()]
    assert secret_hits == []


def test_the_log_of_a_forked_worker_holds_no_progress_bars_and_no_peft_warning(lora_run: Run) -> None:
    # The job's log (the page's, `jobs logs`) is a file: the libraries' progress bars were one line of redraws
    # each ("Loading weights", "Tokenizing train dataset"), and peft warned of transformers' renamed attribute.
    # This worker forked from the warm forkserver, which had imported those libraries before the worker started
    # (tests/test_cli.py's job spawns a fresh one).
    text = (Path(lora_run.completed.output_dir).parent / "worker.log").read_text()
    assert "[info] model: " in text and "[info] dataset: " in text
    assert "\r" not in text and "it/s]" not in text and "examples/s]" not in text, text[:2000]
    assert "is_gradient_checkpointing" not in text


def test_events_are_ordered_and_phases_run_in_order(lora_run: Run) -> None:
    seqs = [e.seq for e in lora_run.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert [e.phase for e in lora_run.of(Phase)] == ["loading_model", "loading_dataset", "training", "saving"]
    last = [e for e in lora_run.of(Progress) if e.loss is not None][-1]
    assert last.step == last.total_steps == 40
    assert last.tokens_per_second and last.tokens_per_second > 0
    assert last.num_tokens and last.elapsed_seconds and last.eta_seconds == 0
    assert all(e.learning_rate is not None and e.grad_norm is not None for e in lora_run.of(Progress) if e.loss)


def test_saved_adapter_loads_with_plain_peft_in_a_fresh_process(lora_run: Run, tiny_model: Path) -> None:
    script = f"""
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({lora_run.completed.output_dir!r})
base = AutoModelForCausalLM.from_pretrained({str(tiny_model)!r})
model = PeftModel.from_pretrained(base, {lora_run.completed.output_dir!r})
ids = tok.apply_chat_template([{{"role": "user", "content": "Repeat the word three times.\\n\\ncat"}}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
out = model.generate(**ids, max_new_tokens=12, do_sample=False)
new = out[0, ids["input_ids"].shape[1]:]
assert len(new) > 0
print("GENERATED", repr(tok.decode(new, skip_special_tokens=True)))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GENERATED" in proc.stdout


def test_full_finetune_loss_falls(tiny_model: Path, tmp_path: Path) -> None:
    run = run_job(job_config(tiny_model, tmp_path / "out", training_type="full", learning_rate=1e-3, max_steps=30))
    assert run.outcome.kind == "completed", run.failure
    records = metric_records(run.completed.output_dir)
    first, last = mean_loss(records, slice(0, 3)), mean_loss(records, slice(-3, None))
    # Stated: with seed 7, 30 full fine-tuning steps cut the training loss by at least 35%.
    assert last <= 0.65 * first, (first, last)
    assert (Path(run.completed.output_dir) / "model.safetensors").is_file()
    assert not (Path(run.completed.output_dir) / "adapter_config.json").exists()


def test_qlora_trains_on_cpu(tiny_model: Path, tmp_path: Path) -> None:
    # The seed's engine-only values map to their nearest equivalent, with a warning each.
    run = run_job(job_config(tiny_model, tmp_path / "out", training_type="qlora", max_steps=30,
                             optim="adamw_8bit", gradient_checkpointing="unsloth"))
    assert run.outcome.kind == "completed", run.failure
    assert any("4-bit layers" in m for m in run.messages()), run.messages()
    warnings = [e.message for e in run.of(WarningEvent)]
    assert any("adamw_8bit" in w and "adamw_torch" in w for w in warnings), warnings
    assert any("unsloth" in w for w in warnings), warnings
    records = metric_records(run.completed.output_dir)
    first, last = mean_loss(records, slice(0, 3)), mean_loss(records, slice(-3, None))
    assert last <= 0.8 * first, (first, last)


def test_stop_with_save_then_resume_continues_at_the_saved_step(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "first", max_steps=60)

    def stop_at_step_15(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 15 and event.loss is not None:
            sup.stop(save=True)

    first = run_job(cfg, stop_at_step_15)
    assert first.outcome.kind == "stopped", first.failure
    done = first.completed
    assert done.stopped and done.saved and done.checkpoint
    stopped_at = done.global_step
    assert 15 <= stopped_at < 60
    checkpoint = Path(done.checkpoint)
    assert checkpoint.name == f"checkpoint-{stopped_at}"
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"):
        assert (checkpoint / name).is_file(), name
    assert (Path(done.output_dir) / "adapter_model.safetensors").is_file()  # final artefacts too

    resumed = run_job(cfg.model_copy(update={"resume_from_checkpoint": str(checkpoint),
                                             "output_dir": str(tmp_path / "second")}))
    assert resumed.outcome.kind == "completed", resumed.failure
    steps = [s for s, _ in resumed.losses]
    assert steps[0] == stopped_at + 1 and steps[-1] == 60
    before = [loss for _, loss in first.losses]
    after = [loss for _, loss in resumed.losses]
    start_loss = sum(before[:3]) / 3
    before_stop = sum(before[-3:]) / 3
    after_resume = sum(after[:3]) / 3
    # Resumed training starts near where it stopped, not back at the untrained loss.
    assert abs(after_resume - before_stop) < 0.35 * (start_loss - before_stop) + 0.15, (
        start_loss, before_stop, after_resume)


def test_stop_without_save_leaves_nothing(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def cancel_at_step_5(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 5:
            sup.stop(save=False)

    run = run_job(job_config(tiny_model, out, max_steps=200, save_steps=0), cancel_at_step_5)
    assert run.outcome.kind == "cancelled", run.outcome
    assert run.completed.saved is False and run.completed.output_dir is None
    left = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert left == []
    assert max(s for s, _ in run.losses) < 200


def test_missing_local_model_fails_with_its_name(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    run = run_job(job_config(missing, tmp_path / "out"))
    assert run.outcome.kind == "failed"
    assert missing in run.failure and "does not exist" in run.failure
    assert "Traceback" not in run.failure


def test_hub_model_without_hub_fails_fast_and_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # prewarm=False: a spawned worker, which reads these variables (a fork of the forkserver has its start's)
    run = run_job(job_config("someorg/not-cached-model", tmp_path / "out"), timeout=60, prewarm=False)
    assert run.outcome.kind == "failed"
    assert "someorg/not-cached-model" in run.failure and "unreachable" in run.failure


def test_worker_module_writes_json_line_events(tiny_model: Path, tmp_path: Path) -> None:
    cfg = job_config(tiny_model, tmp_path / "out", max_steps=10, eval_steps=0.5,
                     sample_prompts=["Repeat the word three times.\n\ncat"])
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps(cfg.public_dict()))
    # -X importtime: stderr names every module the job's process imported, to its end.
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "tunestudio.worker", str(config_file)],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    # A LoRA job on a local model, reporting to no wandb, trained without bitsandbytes (and the torch compiler its
    # decorators load) or wandb (worker/optional.py); peft, which imports bitsandbytes when it can, did the LoRA.
    assert {"peft", "trl", "torch._dynamo"} <= imported
    # (a refused `import bitsandbytes` is listed too: modules that only a loaded package imports tell)
    assert not imported & {"bitsandbytes.functional", "wandb.sdk", "torch._inductor.compile_fx"}
    events = [parse_event(line) for line in proc.stdout.splitlines()]  # every stdout line is an event
    assert isinstance(events[-1], Completed)
    evals = [e.step for e in events if isinstance(e, Progress) and e.eval_loss is not None]
    assert evals[0] == 0 and evals[-1] == 10  # eval before training and at the end
    sample = events[-1].samples[0]
    assert sample.prompt.startswith("Repeat") and sample.after is not None


def test_two_runs_of_one_lora_job_start_from_the_same_adapter_and_log_the_same_losses(tiny_model: Path,
                                                                                       tmp_path: Path) -> None:
    """Each run is a fresh worker process, whose torch starts from a random seed of its own: the adapters' first
    weights must come from the job's seed (before, two runs split at step 2)."""
    from safetensors.torch import load_file

    runs = [run_job(job_config(tiny_model, tmp_path / name, max_steps=3)) for name in ("a", "b")]
    assert all(r.outcome.kind == "completed" for r in runs), [r.failure for r in runs]
    losses = [[r["loss"] for r in metric_records(tmp_path / name) if r["loss"] is not None] for name in ("a", "b")]
    assert losses[0] == losses[1]
    a, b = (load_file(tmp_path / name / "adapter_model.safetensors") for name in ("a", "b"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
