"""GRPO reward functions (worker/rewards.py): the built-ins, and the user's own loaded from a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.worker import rewards
from tunestudio.worker.errors import UserError


def grpo_config(*functions: str, **overrides: Any) -> JobConfig:
    return JobConfig.model_validate({"model_name": "m", "hf_dataset": "d", "method": "grpo", "batch_size": 4,
                                     "gradient_accumulation_steps": 1, "reward_functions": list(functions),
                                     **overrides})


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_exact_match_compares_after_normalisation() -> None:
    completions = ["  Paris. ", "PARIS", "paris france", chat("Paris")]
    assert rewards.exact_match(completions, answer=["Paris"] * 4) == [1.0, 1.0, 0.0, 1.0]


def test_contains_answer_looks_inside_the_completion() -> None:
    assert rewards.contains_answer(["The answer is Paris.", "London"], answer=["paris", "paris"]) == [1.0, 0.0]


@pytest.mark.parametrize(("completion", "answer", "reward"), [
    ("so 3 + 4 = 7", "7", 1.0),
    ("the total is 1,234.0 dollars", "1234", 1.0),
    ("7 then 8", 7, 0.0),  # the last number counts
    ("-2.5", "-2.5", 1.0),
    ("no number here", "3", 0.0),
])
def test_numeric_match_reads_the_last_number(completion: str, answer: Any, reward: float) -> None:
    assert rewards.numeric_match([completion], answer=[answer]) == [reward]


def test_format_regex_and_length_penalty_come_from_the_config() -> None:
    cfg = grpo_config("format_regex", "length_penalty", reward_format_pattern=r"^<answer>.*</answer>$",
                      max_completion_length=10)
    format_regex, length_penalty = rewards.build(cfg)
    assert format_regex.__name__ == "format_regex" and length_penalty.__name__ == "length_penalty"
    assert format_regex(["<answer>4</answer>", "4"]) == [1.0, 0.0]
    assert length_penalty(["ab", "abcd"], completion_ids=[[1, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]) == [-0.2, -1.0]


def test_a_user_function_from_a_file_is_called_with_the_rows_columns(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    source = tmp_path / "my_rewards.py"
    source.write_text(f"""
import json

def shorter_is_better(prompts, completions, answer, topic, **kwargs):
    with open({str(log)!r}, "a") as fh:
        fh.write(json.dumps({{"prompts": prompts, "completions": completions, "answer": answer,
                              "topic": topic, "others": sorted(kwargs)}}) + "\\n")
    return [1.0 / (1 + len(c)) for c in completions]
""")
    (reward,) = rewards.build(grpo_config(f"{source}:shorter_is_better"))
    assert reward.__name__ == "shorter_is_better"  # TRL logs it as rewards/shorter_is_better/mean
    got = reward(prompts=["p1", "p1"], completions=[chat("a"), chat("abc")], completion_ids=[[1], [1, 2]],
                 answer=["x", "x"], topic=["geo", "geo"], trainer_state=None)
    assert got == [0.5, 0.25]
    call = json.loads(log.read_text())
    # Completions arrive as text, whatever the dataset's shape; every column arrives as a keyword.
    assert call == {"prompts": ["p1", "p1"], "completions": ["a", "abc"], "answer": ["x", "x"],
                    "topic": ["geo", "geo"], "others": ["completion_ids", "trainer_state"]}


@pytest.mark.parametrize(("body", "says"), [
    ("def other(**kw):\n    return []\n", "defines no function 'score'"),
    ("raise RuntimeError('boom')\n", "importing"),
])
def test_a_user_file_that_cannot_give_the_function_is_named(body: str, says: str, tmp_path: Path) -> None:
    source = tmp_path / "r.py"
    source.write_text(body)
    with pytest.raises(UserError) as info:
        rewards.build(grpo_config(f"{source}:score"))
    assert f"{source}:score" in str(info.value) and says in str(info.value)


def test_a_missing_file_is_named() -> None:
    with pytest.raises(UserError, match=r"no/such/file\.py:score: there is no file"):
        rewards.build(grpo_config("no/such/file.py:score"))


@pytest.mark.parametrize(("body", "says"), [
    ("def score(prompts, completions, missing_column, **kw):\n    return [0.0] * len(completions)\n",
     "raised TypeError"),
    ("def score(completions, **kw):\n    return [1.0]\n", "returned 1 rewards for 2 completions"),
    ("def score(completions, **kw):\n    return ['high'] * len(completions)\n", "returned 'high'"),
])
def test_a_user_function_that_misbehaves_fails_naming_itself(body: str, says: str, tmp_path: Path) -> None:
    source = tmp_path / "r.py"
    source.write_text(body)
    (reward,) = rewards.build(grpo_config(f"{source}:score"))
    with pytest.raises(UserError) as info:
        reward(prompts=["p", "p"], completions=["a", "b"], answer=["x", "x"])
    assert f"reward function {source}:score" in str(info.value) and says in str(info.value)
