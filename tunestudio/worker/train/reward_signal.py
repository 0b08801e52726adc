"""Whether a GRPO job gets a learning signal, read from its logged records (issue 38, finding 9).

GRPO learns from the spread of rewards inside each group of completions of one prompt: the advantage is a
completion's reward minus its group's mean. A group whose completions all got the same reward (TRL logs the
share of such groups as `frac_reward_zero_std`) gives every completion an advantage of 0, so it does not move
the model. When most groups are like that for several logged steps in a row the job trains on nothing, and it
would still complete as if it had trained: the worker warns once, with what helps.

Pure: records in (as `Progress.record()` makes them, metrics.jsonl's rows), a message or None out; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# "Most groups": the share of groups with no reward spread at which a logged step counts as giving no signal.
FLAT_SHARE = 0.8
# How many logged training steps in a row must give no signal before the job is warned (one step alone can be
# a hard batch; a few in a row, from the first step on, is the pattern of a reward the model never varies on).
FLAT_STEPS = 3
ZERO_STD_KEY = "frac_reward_zero_std"  # TRL GRPOTrainer's name: share of groups whose rewards are all equal


def flat_streak(records: Sequence[dict[str, Any]], longest: int = FLAT_STEPS) -> list[dict[str, Any]]:
    """The last training records (those with a loss), at most `longest`, in which most groups had no reward
    spread, in step order; it ends at the first record from the end with spread. Read from the end: cheap at
    every log of a long run."""
    streak: list[dict[str, Any]] = []
    for record in reversed(records):
        extra = record.get("extra") or {}
        if record.get("loss") is None or ZERO_STD_KEY not in extra:
            continue  # eval records and methods without groups do not break or extend a run
        if extra[ZERO_STD_KEY] < FLAT_SHARE or len(streak) == longest:
            break
        streak.append(record)
    return streak[::-1]


def no_signal_warning(records: Sequence[dict[str, Any]], num_generations: int, temperature: float,
                      rewards: Sequence[str]) -> str | None:
    """The warning when the last FLAT_STEPS logged steps had most groups without reward spread, else None."""
    streak = flat_streak(records)
    if len(streak) < FLAT_STEPS:
        return None
    shares = [r["extra"][ZERO_STD_KEY] for r in streak]
    means = [r["extra"].get("reward") for r in streak]
    seen = sorted({round(m, 3) for m in means if m is not None})
    reward_said = f"; mean reward {seen[0]:g} throughout" if len(seen) == 1 else ""
    return (
        f"GRPO is getting no signal: in each of the last {len(streak)} logged steps (steps {streak[0]['step']} to "
        f"{streak[-1]['step']}) {min(shares):.0%} or more of the prompts' groups of {num_generations} completions "
        f"got the same reward from {', '.join(rewards)} ({ZERO_STD_KEY} ≥ {FLAT_SHARE}{reward_said}), so those "
        "steps barely change the model: GRPO learns only from differences within a group. What helps: train "
        "with SFT first so that some answers score; a reward with partial credit (e.g. contains_answer instead of "
        f"exact_match, or your own function); more completions per prompt (num_generations, now "
        f"{num_generations}); a higher sampling temperature (generation_temperature, now {temperature:g})."
    )
