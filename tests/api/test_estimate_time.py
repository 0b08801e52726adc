"""The estimate's time (api/estimate_time.py): the formula's parts, and how a finished job of this machine corrects
them. Arithmetic only: no job runs here (bench/estimate.py holds the figures against real jobs)."""

from __future__ import annotations

from typing import Any

import pytest

from tunestudio.api.estimate import estimate
from tunestudio.api.estimate_time import Measured, measured_from

CPU = {"cpu": {"physical_cores": 2}, "memory": {"available_mb": 16_000}, "gpus": []}
LLAMA = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 12,
         "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 128_256, "tie_word_embeddings": True}
TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 770, "tie_word_embeddings": False}
JOB: dict[str, Any] = {
    "model_name": "/models/llama", "training_type": "lora", "method": "sft", "batch_size": 2, "max_seq_length": 96,
    "gradient_accumulation_steps": 1, "lora_r": 8, "target_modules": None, "finetune_attention_modules": True,
    "finetune_mlp_modules": True, "gradient_checkpointing": "auto", "precision": "auto", "optim": "adamw_torch",
    "max_steps": 6, "num_epochs": 3.0, "eval_steps": 3, "eval_generate_rows": 2, "sample_prompts": ["hello"],
}
ROWS = {"rows": 400, "tokens_per_row": 15.0, "eval_rows": 20, "held_out": 20}


def _records(steps: int, step_s: float, eval_every: int, eval_s: float, tokens_a_step: int) -> list[dict]:
    """A job's metric records as the worker logs them: one a step, an eval-only record after every eval_every."""
    out, clock = [{"step": 0, "loss": None, "eval_loss": 3.0, "elapsed_seconds": 0.4}], 0.0
    for step in range(1, steps + 1):
        clock += step_s
        out.append({"step": step, "loss": 2.0, "eval_loss": None, "elapsed_seconds": clock,
                    "num_tokens": step * tokens_a_step})
        if step % eval_every == 0:
            clock += eval_s
            out.append({"step": step, "loss": None, "eval_loss": 1.5, "elapsed_seconds": clock})
    return out


def test_a_finished_jobs_steps_leave_its_evaluations_out_even_when_its_last_record_is_one() -> None:
    # The last record of a job that evaluates at its last step is an eval-only one, with no tokens: the estimate
    # once learnt nothing from such a job (it read the speed of the last record only).
    records = _records(steps=6, step_s=0.2, eval_every=3, eval_s=0.8, tokens_a_step=30)
    found = measured_from("a", "/models/llama", JOB, LLAMA, records, wall_seconds=20.0, eval_rows=20)
    assert found is not None and records[-1]["loss"] is None
    assert found.steps == 6 and found.step_seconds == pytest.approx(1.2)
    assert found.tokens_per_row == pytest.approx(15.0) and found.rest_seconds == pytest.approx(18.8)
    assert measured_from("b", "/models/llama", JOB, LLAMA, records[:1], 5.0, None) is None  # no timed step
    assert measured_from("c", "/models/llama", JOB, LLAMA, records, None, 20).rest_seconds is None  # stopped


def test_with_nothing_run_here_the_formula_names_every_part() -> None:
    got = estimate(LLAMA, JOB, CPU, dataset=ROWS)
    assert got.seconds_source == "arithmetic" and got.steps == 6 and got.tokens_per_step == 30
    parts = (got.train_seconds, got.evaluation_seconds, got.generation_seconds, got.other_seconds)
    assert all(p is not None and p > 0 for p in parts) and got.total_seconds == pytest.approx(sum(parts))
    assert any("no job has run on this machine" in line for line in got.basis)
    # A token decoded reads the weights once: ~0.5 GB here, so answers cost far more a token than a step's token.
    assert any("ms a token" in line for line in got.basis)
    # The tiny model's step is mostly fixed cost, not FLOPs; its whole job takes seconds, not minutes.
    tiny = estimate(TINY, {**JOB, "model_name": "/models/tiny", "batch_size": 8, "max_steps": 30}, CPU, dataset=ROWS)
    assert 0.01 < tiny.seconds_per_step < 0.05 and 1 < tiny.total_seconds < 20
    unknown = estimate(LLAMA, {**JOB, "max_steps": 0}, CPU)  # no rows, no max_steps: no total
    assert unknown.total_seconds is None and unknown.seconds_per_step > 0


def test_the_same_job_again_is_predicted_as_it_went_and_a_bigger_one_scaled_by_the_formula() -> None:
    records = _records(steps=6, step_s=0.5, eval_every=3, eval_s=2.0, tokens_a_step=30)
    done = measured_from("job-a", "/models/llama", JOB, LLAMA, records, wall_seconds=60.0, eval_rows=20)
    again = estimate(LLAMA, JOB, CPU, measured=[done], dataset=ROWS)
    assert again.seconds_source == "measured" and any("job-a" in line for line in again.basis)
    assert again.seconds_per_step == pytest.approx(0.5) and again.total_seconds == pytest.approx(60.0, rel=1e-3)
    bigger = estimate(LLAMA, {**JOB, "batch_size": 4, "max_steps": 12}, CPU, measured=[done], dataset=ROWS)
    assert bigger.tokens_per_step == 60 and 0.5 < bigger.seconds_per_step < 1.0  # twice the tokens, a fixed part
    assert bigger.total_seconds > 60.0
    # Another model's job: its ratios carry over to this model's formula.
    other = Measured("job-t", "/models/tiny", "lora", "sft", TINY, {**JOB, "model_name": "/models/tiny"}, 6, 0.6,
                     15.0, 20, 12.0)
    scaled = estimate(LLAMA, JOB, CPU, measured=[other], dataset=ROWS)
    assert scaled.seconds_source == "scaled" and any("job-t" in line for line in scaled.basis)
    assert scaled.seconds_per_step != pytest.approx(estimate(LLAMA, JOB, CPU, dataset=ROWS).seconds_per_step)
