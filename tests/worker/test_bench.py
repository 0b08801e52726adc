"""worker/bench.py without a model: the user's eval file as harness task YAML (read back by the harness's own
TaskManager), its refusals naming the row, which harness model runs which task, and the before/after comparison
of two harness results (tests/api/test_benchmarks.py runs them against a server)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tunestudio.bench_tasks import TASK_INDEX_FILE, bundled_tasks, unknown_tasks
from tunestudio.worker.bench import (
    CHAT,
    COMPLETIONS,
    HarnessRun,
    _check_task,
    compare,
    custom_task,
    merge,
    plan,
    task_manager,
)
from tunestudio.worker.errors import UserError


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_multiple_choice_file_becomes_a_task_the_harness_finds(tmp_path: Path) -> None:
    source = write(tmp_path / "my-questions.jsonl", [
        {"question": "What sound does this animal make?\n\ncow", "choices": ["moo", "woof", "baa"], "answer": "moo"},
        {"question": "What colour is it?\n\nbanana", "choices": ["red", "yellow"], "answer": 1},
    ])
    name = custom_task(source, tmp_path / "tasks", chat=True)
    assert name == "tunestudio_my_questions"
    task = yaml.safe_load((tmp_path / "tasks" / f"{name}.yaml").read_text())
    assert task["output_type"] == "multiple_choice" and task["target_delimiter"] == ""
    assert task["dataset_path"] == "json" and task["metric_list"][0]["metric"] == "acc"
    rows = [json.loads(line) for line in Path(task["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()]
    assert [row["answer"] for row in rows] == [0, 1]  # the right choice's text became its index

    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tmp_path / "tasks"))
    assert name in manager.task_index
    # The benchmark's own: the bundled tasks' index cached on its first run, read back on the next; each the same
    # as the harness's fresh TaskManager.
    # A copy half-written by a benchmark stopped while writing (its process gone) is removed; a running one's stays.
    cache = tmp_path / "cache"
    cache.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (cache / f"lm_eval-tasks.{gone.pid}.tmp").write_text("{")
    (cache / f"lm_eval-tasks.{os.getppid()}.tmp").write_text("{")
    for _ in range(2):
        ours = task_manager(tmp_path / "tasks", cache)
        assert ours.task_index == manager.task_index
        assert (ours.all_tasks, ours.all_subtasks, ours.all_groups, ours.all_tags) == \
            (manager.all_tasks, manager.all_subtasks, manager.all_groups, manager.all_tags)
        assert {p.name for p in cache.iterdir()} == {TASK_INDEX_FILE, f"lm_eval-tasks.{os.getppid()}.tmp"}
    # The parent reads the names of that cached index without the harness, and says an unknown one as the worker
    # does (the worker's index also holds the eval file's task, which contains none of these).
    import lm_eval.tasks

    assert bundled_tasks() == Path(lm_eval.tasks.__file__).parent
    assert unknown_tasks(["arc_easy", "hellaswag", "mmlu"], cache) == []
    refused = unknown_tasks(["arc_eas", "no_such_task_xyz"], cache)
    for asked, said in zip(["arc_eas", "no_such_task_xyz"], refused, strict=True):
        with pytest.raises(UserError) as worker:
            _check_task(ours, asked)
        assert str(worker.value) == f"tasks: {said}"
    assert "(did you mean arc_easy, " in refused[0] and refused[1].endswith("named 'no_such_task_xyz'")
    manager = ours
    loaded = manager.load([name])["tasks"][name]
    docs = list(loaded.test_docs())
    assert loaded.doc_to_text(docs[0]) == rows[0]["question"]
    assert loaded.doc_to_choice(docs[0]) == ["moo", "woof", "baa"]


def test_a_generation_file_is_scored_by_exact_match(tmp_path: Path) -> None:
    source = write(tmp_path / "gen.jsonl", [{"question": "What number comes next?\n\none", "answer": "two"}])
    task = yaml.safe_load((tmp_path / "t" / f"{custom_task(source, tmp_path / 't', chat=False)}.yaml").read_text())
    assert task["output_type"] == "generate_until" and task["metric_list"][0]["metric"] == "exact_match"
    assert task["generation_kwargs"]["until"] == ["\n"] and task["target_delimiter"] == " "


@pytest.mark.parametrize(("rows", "says"), [
    ([{"question": "q", "choices": ["a", "b"], "answer": "c"}], "row 1: 'answer' 'c' is not one of its choices"),
    ([{"question": "q", "choices": ["a", "b"], "answer": 0}, {"question": "q", "choices": ["a"], "answer": 0}],
     "row 2: 'choices' must be a list of at least 2"),
    ([{"question": "q", "answer": "a"}, {"question": "", "answer": "b"}], "row 2 has no 'question'"),
    ([{"question": "q", "answer": "a"}, {"question": "r", "choices": ["a", "b"], "answer": 0}],
     "all rows are one kind"),
    ([{"question": "q", "choices": ["a", "b"], "answer": 2}], "is not a choice's index (0 to 1)"),
    ([], "has no rows"),
])
def test_a_bad_eval_file_is_refused_naming_the_row(tmp_path: Path, rows: list[object], says: str) -> None:
    with pytest.raises(UserError) as caught:
        custom_task(write(tmp_path / "bad.jsonl", rows), tmp_path / "tasks", chat=False)
    assert says in str(caught.value) and str(tmp_path / "bad.jsonl") in str(caught.value)


def test_compare_gives_the_difference_and_its_standard_error() -> None:
    def result(acc: float, se: float) -> dict:
        return {"results": {"t": {"alias": "t", "acc,none": acc, "acc_stderr,none": se,
                                  "exact_match,strip": acc / 2, "exact_match_stderr,strip": "N/A"}},
                "versions": {"t": 1.0}, "n-samples": {"t": {"original": 30, "effective": 20}}}

    compared = compare(result(0.25, 0.03), result(0.75, 0.04))["tasks"]["t"]
    assert compared["version"] == 1.0 and compared["samples"] == 20
    acc = compared["metrics"]["acc"]
    assert (acc["before"], acc["after"], acc["difference"]) == (0.25, 0.75, 0.5)
    assert math.isclose(acc["stderr"], 0.05) and acc["stderr_before"] == 0.03
    assert compared["metrics"]["exact_match (strip)"]["stderr"] is None  # the harness's "N/A"


def test_generation_goes_to_chat_completions_and_loglikelihoods_to_completions() -> None:
    kinds = {"mc": {"multiple_choice"}, "gen": {"generate_until"}, "mixed": {"generate_until", "loglikelihood"},
             "ppl": {"loglikelihood_rolling"}}
    completions, chat = "http://s/v1/completions", "http://s/v1/chat/completions"
    assert plan(kinds, True, completions, chat) == [HarnessRun(COMPLETIONS, completions, ["mc", "mixed", "ppl"]),
                                                    HarnessRun(CHAT, chat, ["gen"])]
    # without the chat template (chat completions always apply it) or a chat address: one run on completions
    assert plan(kinds, False, completions, chat) == [HarnessRun(COMPLETIONS, completions, list(kinds))]
    assert plan(kinds, True, completions, None) == [HarnessRun(COMPLETIONS, completions, list(kinds))]
    assert plan({"gen": {"generate_until"}}, True, completions, chat) == [HarnessRun(CHAT, chat, ["gen"])]


def test_two_runs_of_a_side_merge_into_one_result_naming_each_tasks_run() -> None:
    def result(task: str, metric: str, value: float) -> dict:
        return {"results": {task: {f"{metric},none": value}}, "versions": {task: 1.0},
                "n-samples": {task: {"original": 4, "effective": 4}}, "date": 0.0}

    runs = [HarnessRun(COMPLETIONS, "c", ["mc"]), HarnessRun(CHAT, "h", ["gen"])]
    before = merge(list(zip(runs, [result("mc", "acc", 0.25), result("gen", "exact_match", 0.0)], strict=True)))
    after = merge(list(zip(runs, [result("mc", "acc", 0.5), result("gen", "exact_match", 0.75)], strict=True)))
    assert after["via"] == {"mc": COMPLETIONS, "gen": CHAT}
    tasks = compare(before, after)["tasks"]
    assert tasks["mc"]["via"] == COMPLETIONS and tasks["mc"]["metrics"]["acc"]["difference"] == 0.25
    assert tasks["gen"]["via"] == CHAT and tasks["gen"]["metrics"]["exact_match"]["after"] == 0.75
    assert tasks["gen"]["samples"] == 4
