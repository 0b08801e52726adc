"""Early stopping and keep-best (worker/train/best.py): the watch's arithmetic, the callback's decisions, a real job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from tunestudio.events import Progress
from tunestudio.worker.train.best import EarlyStopper, Watch

from ..helpers.channel import ListChannel
from ..helpers.jobs import job_config, run_job


def test_patience_counts_evaluations_without_an_improvement_by_more_than_min_delta() -> None:
    watch = Watch("exact_match", "max", patience=2, min_delta=0.05)
    assert watch.observe(5, 0.30) and watch.stalls == 0  # the first value is the best so far
    assert watch.observe(10, 0.32) and watch.stalls == 1  # a new best, but by less than min_delta: a stall
    assert not watch.observe(15, float("nan")) and watch.stalls == 2 and watch.exhausted
    assert (watch.best_step, watch.best_value) == (10, 0.32)  # keep-best keeps the best seen, small gain or not
    watch = Watch("eval_loss", "min", patience=1)
    assert watch.observe(5, 2.0) and not watch.observe(10, 2.0)  # a tie is no improvement: the earlier step stays
    assert watch.exhausted and watch.describe() == "best at step 5: eval_loss 2.0000"


def test_the_callback_saves_each_best_marks_it_stops_and_a_resumed_job_goes_on_counting(tmp_path: Path) -> None:
    cfg = job_config("org/model", tmp_path / "out", eval_steps=5, early_stopping={"metric": "eval_loss", "patience": 2})
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    channel = ListChannel()
    stopper, state = EarlyStopper(cfg, channel, None, None), TrainerState()

    def evaluate(stopper: EarlyStopper, state: TrainerState, step: int, loss: float) -> TrainerControl:
        state.global_step, control = step, TrainerControl()
        stopper.on_log(args, state, control, logs={"eval_loss": loss})
        return control

    evaluate(stopper, state, 0, 0.1)  # before training (the base model's evaluation): not watched
    stopper.on_train_begin(args, state, TrainerControl())
    assert evaluate(stopper, state, 5, 2.0).should_save
    assert state.best_model_checkpoint == str(tmp_path / "out" / "checkpoint-5")  # rotation never deletes it
    assert evaluate(stopper, state, 10, 1.5).should_save
    assert stopper.checkpoint == str(tmp_path / "out" / "checkpoint-10")
    first = evaluate(stopper, state, 15, 1.6)
    assert not first.should_save and not first.should_training_stop
    saved = stopper.state()  # what the checkpoint of step 15 would carry (trainer_state.json)
    last = evaluate(stopper, state, 20, 1.7)
    assert last.should_training_stop and not last.should_save
    assert stopper.reason == ("stopped early at step 20: eval_loss did not improve for 2 evaluations; "
                              "best at step 10: eval_loss 1.5000")
    best = stopper.best()
    assert best is not None and (best.step, best.metric, best.value) == (10, "eval_loss", 1.5)
    assert any("1 of 2 evaluations without an improvement" in line for line in channel.lines)

    resumed, state = EarlyStopper(cfg, ListChannel(), None, None), TrainerState(global_step=15)
    state.stateful_callbacks = {"EarlyStopper": saved}
    resumed.on_train_begin(args, state, TrainerControl())
    assert evaluate(resumed, state, 20, 1.55).should_training_stop  # one stall was counted before the resume
    assert resumed.best() == best


@dataclass
class Watched:
    stopper: EarlyStopper
    saves: list[int]  # the steps whose evaluation asked for a save
    trainer: SimpleNamespace  # at step 20; its loader of the best checkpoint records each call in `loads`
    loads: list[str | None]


def watched(tmp_path: Path, channel: ListChannel, **overrides: object) -> Watched:
    """A stopper that saw eval_loss 2.0, 1.5, 1.6, 1.7 at steps 5 to 20: best at 10, stopped at 20."""
    cfg = job_config("org/model", tmp_path / "out", eval_steps=5, early_stopping={"metric": "eval_loss", "patience": 2},
                     **overrides)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    stopper, state = EarlyStopper(cfg, channel, None, None), TrainerState()
    stopper.on_train_begin(args, state, TrainerControl())
    saves = []
    for step, loss in ((5, 2.0), (10, 1.5), (15, 1.6), (20, 1.7)):
        state.global_step, control = step, TrainerControl()
        stopper.on_log(args, state, control, logs={"eval_loss": loss})
        saves += [step] if control.should_save else []
    assert stopper.stopped_at == 20 and stopper.watch.best_step == 10
    loads: list[str | None] = []
    trainer = SimpleNamespace(state=state, _load_best_model=lambda: loads.append(state.best_model_checkpoint))
    return Watched(stopper, saves, trainer, loads)


def test_keep_best_false_saves_nothing_for_the_best_and_restores_nothing(tmp_path: Path) -> None:
    channel = ListChannel()
    run = watched(tmp_path, channel, keep_best=False)
    assert run.saves == []  # no checkpoint at a new best
    assert run.stopper.restore_best(run.trainer) == 20 and run.loads == []
    best = run.stopper.best()
    assert best is not None and (best.step, best.checkpoint) == (10, None)  # the best is said, its weights not kept
    assert not any("keep_best" in line for line in channel.lines) and channel.warnings() == []


def test_a_missing_best_checkpoint_is_a_warning_and_the_artefacts_are_the_last_steps(tmp_path: Path) -> None:
    channel = ListChannel()
    run = watched(tmp_path, channel)
    assert run.saves == [5, 10]  # each new best saved; checkpoint-10 is then missing (never written here)
    assert run.stopper.restore_best(run.trainer) == 20 and run.loads == []
    assert channel.warnings() == ["keep_best: the checkpoint of step 10 is missing; the artefacts are the weights "
                                  "of the last step (20)"]
    best = run.stopper.best()
    assert best is not None and best.checkpoint is None  # nothing was loaded: no checkpoint is claimed
    assert not any("keep_best: the artefacts are" in line for line in channel.lines)


@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
def test_early_stopping_stops_when_exact_match_stalls_and_the_artefacts_are_the_best_weights(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A real LoRA job on the bundled tasks, watched by exact match on 16 held-out rows every 5 steps.

    min_delta 0.25 bounds the improvements an exact match (0 to 1) can make to 4, so with patience 1 the job
    stops by its 5th evaluation (step 25 of 40) whatever this machine's arithmetic makes of the training.
    """
    out = tmp_path / "out"
    cfg = job_config(tiny_model, out, max_steps=40, eval_steps=5, eval_generate_rows=16, precision="fp32",
                     early_stopping={"metric": "exact_match", "patience": 1, "min_delta": 0.25})
    run = run_job(cfg, timeout=540)
    done = run.completed
    assert run.outcome.kind == "completed" and not done.stopped, run.outcome
    assert done.global_step <= 25 < cfg.max_steps
    assert done.reason.startswith(f"stopped early at step {done.global_step}: exact_match did not improve by "
                                  "more than 0.25 for 1 evaluation") and run.outcome.message == done.reason

    # Every evaluation during training scored the answers; the best is the best seen, at its first step.
    scores = {e.step: e.extra["eval_exact_match"] for e in run.of(Progress) if e.eval_loss is not None and e.step}
    assert sorted(scores) == list(range(5, done.global_step + 1, 5))
    best = done.best
    assert best is not None and best.metric == "exact_match" and best.value == max(scores.values())
    # the best is the highest score, at its first step; it may be the stopping evaluation's own, when that one
    # improved by min_delta or less (not enough to go on, still the best weights)
    assert best.step == min(step for step, value in scores.items() if value == best.value) <= done.global_step
    assert best.checkpoint == str(out / f"checkpoint-{best.step}")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{best.step}"]  # only the best kept
    said = f"keep_best: the artefacts are the weights of step {best.step}"
    restored = any(m.startswith(said) for m in run.messages())
    assert restored == (best.step < done.global_step)  # the last step's weights are the best ones already

    # The artefacts are the best checkpoint's adapter, and it scores the best value: reloaded with plain peft.
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunestudio.worker import data as data_mod
    from tunestudio.worker.train.evaluation import eval_rows, generate_answers, score

    kept, at_best = load_file(out / "adapter_model.safetensors"), load_file(Path(best.checkpoint) /
                                                                              "adapter_model.safetensors")
    assert kept.keys() == at_best.keys() and all(torch.equal(kept[k], at_best[k]) for k in kept)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), out)
    rows = eval_rows(data_mod.prepare(cfg, tokenizer).eval, 16)
    answers = generate_answers(model, tokenizer, rows)
    assert answers is not None
    assert score(answers, [r.reference for r in rows])["exact_match"] == best.value
    assert done.evaluation is not None and done.evaluation.metrics["exact_match"].after == best.value


@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
def test_keep_best_restores_an_earlier_best_steps_weights_as_the_artefacts(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real worker in this process, with the scores at each evaluation scripted (EarlyStopper._answer, which
    only evaluations during training call; the final evaluation scores for real): exact match 0.5, 0.75, 0.75,
    0.625 at steps 5, 10, 15, 20 with patience 2. The best is step 10, training stops at step 20, and the saved
    adapter is checkpoint-10's, not the last step's (checkpoint-20, saved by save_steps 20)."""
    from safetensors.torch import load_file

    from tunestudio.events import Completed, Log, parse_event
    from tunestudio.worker import main

    scores = iter([0.5, 0.75, 0.75, 0.625])
    answered: list[int] = []

    def scripted(self: EarlyStopper, model: object) -> dict[str, float]:
        answered.append(len(answered))
        value = next(scores)
        return {"exact_match": value, "token_f1": value, "rouge_l": value}

    monkeypatch.setattr(EarlyStopper, "_answer", scripted)
    out = tmp_path / "out"
    cfg = job_config(tiny_model, out, max_steps=30, eval_steps=5, save_steps=20, eval_generate_rows=4,
                     precision="fp32", early_stopping={"metric": "exact_match", "patience": 2})
    channel = ListChannel()
    assert main.run(cfg, channel) == 0, channel.lines[-3:]
    events = [parse_event(line) for line in channel.lines]
    done = events[-1]
    assert isinstance(done, Completed) and not done.stopped
    assert len(answered) == 4 and done.global_step == 20
    assert done.reason == ("stopped early at step 20: exact_match did not improve for 2 evaluations; best at step "
                           "10: exact_match 0.7500")
    assert done.best is not None and (done.best.step, done.best.value) == (10, 0.75)
    assert done.best.checkpoint == str(out / "checkpoint-10")
    logs = [e.message for e in events if isinstance(e, Log)]
    assert ("keep_best: the artefacts are the weights of step 10, not of the last step 20 (best at step 10: "
            "exact_match 0.7500)") in logs, logs

    kept = load_file(out / "adapter_model.safetensors")
    at_best = load_file(out / "checkpoint-10" / "adapter_model.safetensors")
    at_last = load_file(out / "checkpoint-20" / "adapter_model.safetensors")
    assert kept.keys() == at_best.keys() == at_last.keys() and kept
    assert all(torch.equal(kept[k], at_best[k]) for k in kept)
    assert not all(torch.equal(kept[k], at_last[k]) for k in kept)  # training moved on after step 10
