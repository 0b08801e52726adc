"""What a judgement asks: every held-out row the job's evaluation wrote (more than the five its record shows), a
chat row as its whole conversation before the reference, and a prompt file's conversations the same way; a
conversation reaches both models and the judge whole."""

from __future__ import annotations

import json
from pathlib import Path

from tunestudio.judge.core import judge_row
from tunestudio.judge.prompts import held_out, read
from tunestudio.worker.train.evaluation import SHOWN_EXAMPLES, Evaluator, eval_rows, write_rows

SYSTEM = {"role": "system", "content": "Answer in one word."}


def chat(question: str, answer: str, *earlier: dict[str, str]) -> dict[str, object]:
    return {"messages": [*earlier, {"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def rows_file(tmp_path: Path) -> Path:
    """A rows file as the worker's final evaluation writes it: 8 chat rows (one of them three turns with a system
    prompt), one prompt-completion row and one plain text row; three of them answered."""
    examples = [chat(f"What number comes after {n}?", str(n + 1)) for n in range(7)]
    examples.insert(2, chat("And after that?", "three", SYSTEM, {"role": "user", "content": "What follows one?"},
                            {"role": "assistant", "content": "two"}))
    examples.append({"prompt": "Say moo.", "completion": [{"role": "assistant", "content": "moo"}]})
    examples.append({"text": "a plain text row has nothing to answer"})
    scored = eval_rows(examples, 100, text=True)
    evaluator = Evaluator(scored[:3], scored)
    evaluator.before = ["x", "y", "z"]
    path = tmp_path / "eval_rows.json"
    write_rows(path, evaluator.table(["a", "b", "c"], [1.0] * len(scored)))
    return path


def test_every_held_out_row_is_asked_a_chat_row_with_its_earlier_turns(tmp_path: Path) -> None:
    path = rows_file(tmp_path)
    shown = [{"prompt": f"shown {i}", "reference": "r", "before": "b", "after": "a"} for i in range(SHOWN_EXAMPLES)]
    prompts = held_out({"evaluation": {"rows_file": str(path), "examples": shown}})
    assert len(prompts) == 9 > SHOWN_EXAMPLES  # every row but the plain text one
    assert prompts[0] == [{"role": "user", "content": "What number comes after 0?"}]
    assert prompts[2] == [SYSTEM, {"role": "user", "content": "What follows one?"},
                          {"role": "assistant", "content": "two"}, {"role": "user", "content": "And after that?"}]
    assert prompts[8] == "Say moo."  # a text prompt as it is
    assert all("three" not in json.dumps(p) for p in prompts)  # the reference reply is never asked


def test_a_job_without_a_rows_file_is_asked_its_shown_examples(tmp_path: Path) -> None:
    shown = [{"prompt": "cow", "reference": "moo", "before": "b", "after": "a"}]
    assert held_out({"evaluation": {"examples": shown}}) == ["cow"]
    gone = {"evaluation": {"rows_file": str(tmp_path / "gone.json"), "examples": shown}}
    assert held_out(gone) == ["cow"]
    assert held_out(None) == [] and held_out({"evaluation": None}) == []


def test_a_prompt_files_conversation_is_kept_up_to_its_last_user_turn(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(chat("And after that?", "three", SYSTEM)) + "\n" + json.dumps("plain") + "\n")
    assert read(path) == [[SYSTEM, {"role": "user", "content": "And after that?"}], "plain"]


def test_a_conversation_reaches_both_models_and_the_judge_whole() -> None:
    conversation = [SYSTEM, {"role": "user", "content": "What follows one?"},
                    {"role": "assistant", "content": "two"}, {"role": "user", "content": "And after that?"}]
    answered: list[list[dict[str, str]]] = []
    judged: list[str] = []

    def model(messages: list[dict[str, str]]) -> str:
        answered.append(messages)
        return "three"

    def judge(messages: list[dict[str, str]]) -> str:
        judged.append(messages[-1]["content"])
        return "tie"

    row = judge_row(0, conversation, model, model, judge)
    assert answered == [conversation, conversation] and row.outcome == "tie"
    assert row.prompt == "And after that?" and row.messages == conversation
    for question in judged:
        assert "System: Answer in one word." in question and "User: What follows one?" in question
        assert "Assistant: two" in question and question.index("two") < question.index("And after that?")
