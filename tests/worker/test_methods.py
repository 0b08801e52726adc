"""DPO, ORPO, KTO, GRPO and continued pretraining: real training of the tiny model in a real worker.

Each job is a few steps on data made here; the numbers are kept small on purpose (steps, lengths,
generations), since each method costs a worker start (~5-10 s on these machines) plus its steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunestudio.events import Progress, WarningEvent
from tunestudio.jobs.supervisor import Supervisor
from tunestudio.worker.tiny import SOUNDS
from tunestudio.worker.train.reward_signal import FLAT_STEPS, ZERO_STD_KEY

from ..helpers.jobs import DATA, Run, job_config, run_job


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def records(run: Run) -> list[dict[str, Any]]:
    assert run.outcome.kind in ("completed", "stopped"), run.failure
    lines = (Path(run.completed.output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def method_job(tiny_model: Path, out: Path, data: Path, on_event: Any = None, **overrides: Any) -> Run:
    fields: dict[str, Any] = {"local_datasets": [str(data)], "max_steps": 3, "batch_size": 4,
                              "max_seq_length": 48, "learning_rate": 1e-3, **overrides}
    return run_job(job_config(tiny_model, out, **fields), on_event, log_path=out.parent / f"{out.name}.log")


def additions(n: int) -> list[tuple[int, int]]:
    return [(a, (a * 7 + 3) % 40) for a in range(n)]


@pytest.fixture(scope="module")
def dpo_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    # Plain-string pairs: chosen is the right sum, rejected a wrong one.
    tmp = tmp_path_factory.mktemp("dpo")
    rows = [{"prompt": f"Add the two numbers.\n\n{a} + {b}\n", "chosen": str(a + b), "rejected": str(a + b + 11)}
            for a, b in additions(16)]
    # Two batches of 8 seen three times each, at a constant rate: the trend beats the batch-to-batch noise.
    return method_job(tiny_model, tmp / "out", write_jsonl(tmp / "pairs.jsonl", rows), method="dpo", max_steps=6,
                      batch_size=8, learning_rate=3e-3, lr_scheduler_type="constant")


@pytest.fixture(scope="module")
def other_runs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("methods")

    def user(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}]

    def reply(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    pairs = [{"prompt": user(f"Add the two numbers.\n\n{a} + {b}"), "chosen": reply(str(a + b)),
              "rejected": reply(str(a + b + 11))} for a, b in additions(24)]
    unpaired = [{"prompt": user(f"Add the two numbers.\n\n{a} + {b}"), "completion": reply(str(a + b + (i % 2) * 5)),
                 "label": i % 2 == 0} for i, (a, b) in enumerate(additions(24))]
    text = [{"text": f"Add the two numbers.\n\n{a} + {b}\n{a + b}"} for a, b in additions(64)]
    return {
        "orpo": method_job(tiny_model, tmp / "orpo", write_jsonl(tmp / "pairs.jsonl", pairs), method="orpo"),
        "kto": method_job(tiny_model, tmp / "kto", write_jsonl(tmp / "unpaired.jsonl", unpaired), method="kto"),
        "pretrain": method_job(tiny_model, tmp / "pretrain", write_jsonl(tmp / "text.jsonl", text), method="pretrain",
                               max_seq_length=64),
    }


@pytest.fixture(scope="module")
def grpo_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    tmp = tmp_path_factory.mktemp("grpo")
    # In its pre-training text form, the tiny base model names an animal's sound about half the time at
    # temperature 0.5 (measured: 30 of 64 samples): a task it can partly do. Its tokenizer adds no BOS
    # token, and it was pre-trained on text that starts with one: the prompts carry it.
    rows = [{"prompt": f"<|bos|>What sound does this animal make?\n\n{animal}\n", "answer": sound,
             "topic": f"sound-{animal}"} for animal, sound in SOUNDS[:8]]
    calls = tmp / "calls.jsonl"
    source = tmp / "my_rewards.py"
    source.write_text(f"""
import json

def saw_columns(prompts, completions, answer, topic, **kwargs):
    with open({str(calls)!r}, "a") as fh:
        fh.write(json.dumps({{"prompts": prompts, "answer": answer, "topic": topic,
                              "completions": completions}}) + "\\n")
    return [0.5] * len(completions)
""")
    # GRPO generates inside its training step; a stop still lands between steps (here after step 4 of 50),
    # with a resumable checkpoint and the artefacts.
    def stop_at_step_4(sup: Supervisor, event: object) -> None:
        if isinstance(event, Progress) and event.step == 4:
            sup.stop(save=True)

    run = method_job(tiny_model, tmp / "out", write_jsonl(tmp / "prompts.jsonl", rows), stop_at_step_4,
                     method="grpo", max_steps=50, batch_size=8, num_generations=4, max_completion_length=6,
                     generation_temperature=0.5, reward_functions=["exact_match", f"{source}:saw_columns"])
    return run, calls


def test_each_methods_log_holds_no_progress_bars_and_no_library_deprecation(
        dpo_run: Run, other_runs: dict[str, Run], grpo_run: tuple[Run, Path]) -> None:
    # The job's log (the page's, `jobs logs`): no progress bar redrawn in a file, no warning of a library about
    # another's renamed attribute (peft's and TRL's generation read transformers' old gradient-checkpointing name)
    for run in (dpo_run, *other_runs.values(), grpo_run[0]):
        out = Path(run.completed.output_dir)
        text = (out.parent / f"{out.name}.log").read_text()
        assert "[info] model: " in text, text[:2000]
        assert "\r" not in text and "it/s]" not in text and "examples/s]" not in text, text[:2000]
        assert "is_gradient_checkpointing" not in text, text[:2000]


def test_dpo_reward_margin_rises_when_chosen_is_right(dpo_run: Run) -> None:
    found = records(dpo_run)
    margins = [r["extra"]["rewards/margins"] for r in found]
    assert len(margins) == 6
    # Step 1: the model is still its own reference, so the margin is exactly 0 (the reference is right).
    assert margins[0] == 0.0
    assert margins[-1] > 0.05 and sum(margins[-3:]) > sum(margins[:3]), margins
    for key in ("rewards/accuracies", "logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected"):
        assert all(key in r["extra"] for r in found), key
    # The same metrics travelled as Progress events.
    assert [e.extra["rewards/margins"] for e in dpo_run.of(Progress)] == margins


def test_orpo_kto_and_pretrain_train_and_report_their_metrics(other_runs: dict[str, Run]) -> None:
    orpo, kto, pretrain = (records(other_runs[m]) for m in ("orpo", "kto", "pretrain"))
    assert [r["step"] for r in orpo] == [1, 2, 3]
    assert all({"rewards/margins", "rewards/accuracies", "logps/chosen", "log_odds_ratio"} <= set(r["extra"])
               for r in orpo)
    assert all({"kl", "rewards/chosen", "rewards/rejected"} <= set(r["extra"]) for r in kto)
    assert all(r["loss"] is not None for r in pretrain)
    messages = " ".join(other_runs["pretrain"].messages())
    assert "read as text (auto-detected)" in messages
    assert "read as unpaired (auto-detected)" in " ".join(other_runs["kto"].messages())


def test_grpo_with_exact_match_reports_each_reward_calls_the_user_function_and_stops(
    grpo_run: tuple[Run, Path],
) -> None:
    run, calls = grpo_run
    assert run.outcome.kind == "stopped", run.failure
    found = records(run)
    stopped_at = run.completed.global_step  # the step the stop reached the worker in: 4, or one or two later
    assert 4 <= stopped_at < 50 and [r["step"] for r in found] == list(range(1, stopped_at + 1))
    checkpoint = Path(run.completed.checkpoint)
    assert checkpoint.name == f"checkpoint-{stopped_at}"
    for name in ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json"):
        assert (checkpoint / name).is_file(), name
    for r in found:
        assert {"reward", "reward_std", "rewards/exact_match/mean", "rewards/saw_columns/mean",
                "completions/mean_length"} <= set(r["extra"])
        assert r["extra"]["rewards/saw_columns/mean"] == 0.5
    exact = [r["extra"]["rewards/exact_match/mean"] for r in found]
    assert max(exact) > 0 and min(exact) < 1, exact  # partly right
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(seen) == stopped_at  # once per batch of completions
    for call in seen:
        assert len(call["answer"]) == 8 and len(call["completions"]) == 8
        assert all(isinstance(c, str) for c in call["completions"])
        # Each completion comes with its own row's columns.
        sounds = dict(SOUNDS)
        for prompt, topic, answer in zip(call["prompts"], call["topic"], call["answer"], strict=True):
            animal = topic.removeprefix("sound-")
            assert prompt.endswith(f"\n\n{animal}\n") and answer == sounds[animal]


def test_grpo_without_reward_spread_warns_once_while_it_runs(tiny_model: Path, tmp_path: Path) -> None:
    # Issue 38, finding 9: the bundled prompts' answers ("orange orange orange", "nedrag", ...) are beyond the tiny
    # model, so exact_match gives every completion of a group the same 0: no step has anything to learn from.
    run = method_job(tiny_model, tmp_path / "out", DATA / "prompts.jsonl", method="grpo", max_steps=FLAT_STEPS,
                     batch_size=4, num_generations=2, max_completion_length=4, reward_functions=["exact_match"])
    found = records(run)
    assert [r["extra"][ZERO_STD_KEY] for r in found] == [1.0] * FLAT_STEPS
    warned = [e.message for e in run.of(WarningEvent) if "no signal" in e.message]
    assert len(warned) == 1, run.messages()
    assert f"steps 1 to {FLAT_STEPS}" in warned[0] and "num_generations, now 2" in warned[0]
    at = next(i for i, e in enumerate(run.events) if isinstance(e, WarningEvent) and e.message == warned[0])
    steps_before = [e.step for e in run.events[:at] if isinstance(e, Progress)]
    assert steps_before[-1] == FLAT_STEPS and at < len(run.events) - 1  # while it runs, at the step that made it


def test_every_method_saves_an_adapter_plain_peft_loads(
    dpo_run: Run, other_runs: dict[str, Run], grpo_run: tuple[Run, Path], tiny_model: Path
) -> None:
    outputs = [dpo_run.completed.output_dir, grpo_run[0].completed.output_dir,
               *(run.completed.output_dir for run in other_runs.values())]
    for out in outputs:
        assert not (Path(out) / "ref").exists()  # one adapter: no copy of it as DPO/KTO's reference
    script = f"""
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
for out in {outputs!r}:
    tok = AutoTokenizer.from_pretrained(out)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(tiny_model)!r}), out)
    ids = tok("Add the two numbers.\\n\\n2 + 3\\n", return_tensors="pt")
    new = model.generate(**ids, max_new_tokens=4, do_sample=False)[0, ids["input_ids"].shape[1]:]
    assert len(new) > 0
    print("LOADED", out)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("LOADED") == 5


def test_dpo_stopped_with_save_through_the_manager_resumes_at_the_next_step(tiny_model: Path, tmp_path: Path) -> None:
    from tunestudio.jobs.manager import JobManager
    from tunestudio.jobs.status import JobStatus
    from tunestudio.settings import Settings

    rows = [{"prompt": f"{a} + {b} =", "chosen": str(a + b), "rejected": str(a + b + 11)} for a, b in additions(16)]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    cfg = job_config(tiny_model, tmp_path / "home" / "out", method="dpo", local_datasets=[str(data)], max_steps=8,
                     batch_size=4, max_seq_length=32, learning_rate=1e-3)
    with JobManager(Settings(home=tmp_path / "home")) as manager:
        job = manager.submit(cfg)
        with manager.subscribe(job.id) as stream:
            while not (item := stream.get(timeout=180)).is_end:
                if item.kind == "progress" and item.data["step"] == 2:
                    manager.stop(job.id, save=True)
        stopped = manager.get(job.id)
        assert stopped.status is JobStatus.stopped and stopped.resumable, stopped.error
        saved_step = int(Path(stopped.checkpoint).name.split("-")[1])
        assert 2 <= saved_step < 8
        first = manager.metrics(job.id)
        assert all("rewards/margins" in r["extra"] for r in first)  # the method's metrics, stored per step

        resumed = manager.resume(job.id)
        with manager.subscribe(resumed.id) as stream:
            while not stream.get(timeout=180).is_end:
                pass
        final = manager.get(resumed.id)
        assert final.status is JobStatus.completed, final.error
        steps = [r["step"] for r in manager.metrics(resumed.id)]
        assert steps[0] == saved_step + 1 and steps[-1] == 8
        # The reference is the model before any training, also after the resume: margins go on from where they were.
        assert manager.metrics(resumed.id)[0]["extra"]["rewards/margins"] != 0.0
        assert (Path(final.output_dir) / "adapter_model.safetensors").is_file()

