"""A GRPO job that gets no reward spread is warned once (issue 38, finding 9): the rule on logged records, and the
reporting callback that applies it while the job trains (the real GRPO job: test_methods.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tunestudio.worker.train.reward_signal import FLAT_SHARE, FLAT_STEPS, ZERO_STD_KEY, flat_streak, no_signal_warning


def train(step: int, zero_std: float, reward: float = 0.0) -> dict[str, Any]:
    return {"step": step, "loss": 0.0, "extra": {"reward": reward, "reward_std": 0.0, ZERO_STD_KEY: zero_std}}


def evaluation(step: int) -> dict[str, Any]:
    return {"step": step, "loss": None, "eval_loss": 1.0, "extra": {f"eval_{ZERO_STD_KEY}": 0.0}}


def warning(records: list[dict[str, Any]]) -> str | None:
    return no_signal_warning(records, num_generations=4, temperature=0.7, rewards=["exact_match"])


def test_most_groups_flat_for_several_logged_steps_warns_with_what_helps() -> None:
    records = [train(step, 1.0) for step in range(1, FLAT_STEPS + 1)]
    assert warning(records[:-1]) is None  # one step short
    said = warning(records)
    assert said is not None
    assert f"steps 1 to {FLAT_STEPS}" in said and "100%" in said and "exact_match" in said
    assert "mean reward 0 throughout" in said
    for remedy in ("SFT first", "partial credit", "num_generations, now 4", "generation_temperature, now 0.7"):
        assert remedy in said, remedy


def test_a_step_with_spread_breaks_the_run_and_eval_records_do_not() -> None:
    flat = [train(1, 1.0), train(2, FLAT_SHARE), evaluation(2), train(3, 0.9)]
    assert [r["step"] for r in flat_streak(flat)] == [1, 2, 3]
    assert warning(flat) is not None
    broken = [train(1, 1.0), train(2, FLAT_SHARE - 0.05), train(3, 1.0), train(4, 1.0)]  # half the groups learn
    assert [r["step"] for r in flat_streak(broken)] == [3, 4] and warning(broken) is None
    # The last FLAT_STEPS of a long flat run are named, not the whole run.
    assert [r["step"] for r in flat_streak([train(s, 1.0) for s in range(1, 50)])] == list(range(50 - FLAT_STEPS, 50))


def test_records_without_groups_never_warn() -> None:
    sft = [{"step": s, "loss": 1.0, "extra": None} for s in range(1, 10)]
    assert flat_streak(sft) == [] and warning(sft) is None


def test_the_reporting_callback_warns_once_while_it_reports() -> None:
    from tunestudio.worker.train.train import ReportingCallback

    class Channel:
        def __init__(self) -> None:
            self.warned: list[str] = []
            self.stop_request = None

        def progress(self, **fields: Any) -> Any:
            return SimpleNamespace(record=lambda: {k: v for k, v in fields.items()})

        def warn(self, message: str) -> None:
            self.warned.append(message)

    channel = Channel()
    callback = ReportingCallback(channel, warning)  # type: ignore[arg-type]
    args = SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=1, world_size=1)
    for step in range(1, 2 * FLAT_STEPS + 2):
        state = SimpleNamespace(global_step=step, max_steps=20, epoch=0.1 * step)
        callback.on_log(args, state, None, logs={"loss": 0.0, "reward": 0.0, ZERO_STD_KEY: 1.0})  # type: ignore[arg-type]
    assert len(channel.warned) == 1 and f"steps 1 to {FLAT_STEPS}" in channel.warned[0]
