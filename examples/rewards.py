"""A user reward function for examples/grpo.yaml.

GRPO calls it once per batch with `prompts` and `completions` (the completions'
text, one per completion) and every other dataset column as a keyword argument
holding one value per completion (here `answer` and `task`). It returns one
number per completion (or None where it does not apply). Accept **kwargs: TRL
passes more (completion_ids, trainer_state, ...).
"""

from __future__ import annotations


def one_line(prompts: list[str], completions: list[str], task: list[str], **kwargs: object) -> list[float]:
    """1 for a reply on one line (the tasks all have one-line answers), else 0."""
    return [1.0 if completion.strip() and "\n" not in completion.strip() else 0.0 for completion in completions]
