"""bench_tasks.py: the harness's task names read from a benchmark's cached index, in the parent, without lm_eval.

The index here is written in the worker's format with the installed lm_eval's key; tests/worker/test_bench.py
reads one the worker built from the real harness, and tests/test_cli_bench.py and tests/api/test_benchmarks.py
refuse a task through the CLI and the API after a real benchmark cached it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tunestudio.bench_tasks as bench_tasks
from tunestudio.bench_tasks import (
    TASK_INDEX_FILE,
    UnknownTasks,
    bundled_tasks,
    check_tasks,
    eval_task_name,
    index_key,
    unknown_task,
    unknown_tasks,
)

NAMES = ["arc_challenge", "arc_easy", "hellaswag", "mmlu", "mmlu_abstract_algebra"]


def cache(folder: Path, names: list[str] = NAMES, key: str | None = None) -> Path:
    """An index as the worker writes it: [name, kind, yaml_path, cfg, tags] per entry."""
    folder.mkdir(parents=True, exist_ok=True)
    bundled = bundled_tasks()
    assert bundled is not None, "lm_eval is a dependency: make setup installs it"
    entries = [[name, "TASK", str(bundled / f"{name}.yaml"), None, []] for name in names]
    path = folder / TASK_INDEX_FILE
    path.write_text(json.dumps({"key": key or index_key(bundled), "entries": entries}))
    return path


def test_a_task_the_cached_index_lacks_is_said_with_the_names_that_contain_it(tmp_path: Path) -> None:
    cache(tmp_path)
    assert unknown_tasks(["arc_easy", "mmlu"], tmp_path) == []
    assert unknown_tasks(["arc_eas", "mmlu", "no_such_task_xyz"], tmp_path) == [
        "lm-evaluation-harness has no task or group named 'arc_eas' (did you mean arc_easy?)",
        "lm-evaluation-harness has no task or group named 'no_such_task_xyz'",
    ]
    # the hint: names containing the asked one (case aside), those starting with it first, the shortest first;
    # five at most; else the closest spellings
    assert unknown_task("ARC", [*NAMES, "arabic_mt_arc_easy"]) == (
        "lm-evaluation-harness has no task or group named 'ARC' (did you mean arc_easy, arc_challenge, "
        "arabic_mt_arc_easy?)")
    many = [f"task_{n}" for n in range(9)]
    assert unknown_task("task", many).endswith("(did you mean task_0, task_1, task_2, task_3, task_4?)")
    assert unknown_task("hellaswg", NAMES).endswith("(did you mean hellaswag?)")
    assert unknown_task("zzz", NAMES).endswith("named 'zzz'")


def test_a_refusal_names_the_field_and_spares_the_eval_files_own_task(tmp_path: Path) -> None:
    cache(tmp_path)
    with pytest.raises(UnknownTasks) as refused:
        check_tasks(["arc_easy", "nope", "tunestudio_my_questions"], tmp_path)
    assert refused.value.field == "tasks" and len(refused.value.messages) == 2
    assert str(refused.value) == ("tasks: lm-evaluation-harness has no task or group named 'nope'; "
                                  "tasks: lm-evaluation-harness has no task or group named 'tunestudio_my_questions'")
    # the worker adds the eval file's task (named as it names it) to the index: asking for it by name is no error
    assert eval_task_name("/data/my-questions.jsonl") == "tunestudio_my_questions"
    assert eval_task_name("/data/---.jsonl") == "tunestudio_eval"
    check_tasks(["arc_easy", "tunestudio_my_questions"], tmp_path, "/data/my-questions.jsonl")


def test_without_a_current_index_nothing_is_refused_here(tmp_path: Path) -> None:
    assert unknown_tasks(["no_such_task_xyz"], tmp_path) == []  # no benchmark yet: the worker decides
    cache(tmp_path, key="lm_eval 0.0.1 at /elsewhere of 1")  # another lm_eval's index: rebuilt by the worker
    assert unknown_tasks(["no_such_task_xyz"], tmp_path) == []
    (tmp_path / TASK_INDEX_FILE).write_text('{"key": "lm_eval')  # half-written
    assert unknown_tasks(["no_such_task_xyz"], tmp_path) == []
    cache(tmp_path)
    assert unknown_tasks(["no_such_task_xyz"], tmp_path) != []


def test_an_index_of_another_lm_eval_is_read_once_until_it_changes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cache(tmp_path, key="lm_eval 0.0.1 at /elsewhere of 1")
    reads, loads = [], json.loads
    monkeypatch.setattr(bench_tasks.json, "loads", lambda text: reads.append(1) or loads(text))
    for _ in range(3):  # every benchmark request: the 19 MB file is parsed once, not each time
        assert unknown_tasks(["nope"], tmp_path) == []
    assert len(reads) == 1


def test_an_index_rebuilt_since_it_was_read_is_read_again(tmp_path: Path) -> None:
    path = cache(tmp_path, names=["arc_easy"])
    assert unknown_tasks(["new_task"], tmp_path) != []
    cache(tmp_path, names=["arc_easy", "new_task"])
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a later write, even within a tick
    assert unknown_tasks(["new_task"], tmp_path) == []


def test_the_names_are_read_without_importing_the_harness(tmp_path: Path) -> None:
    cache(tmp_path)
    code = ("import sys; from pathlib import Path; from tunestudio.bench_tasks import unknown_tasks; "
            f"said = unknown_tasks(['nope'], Path({str(tmp_path)!r})); "
            "heavy = sorted(m for m in ('lm_eval', 'datasets', 'torch', 'transformers') if m in sys.modules); "
            "print(len(said), heavy)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "[]"]


def test_no_harness_installed_is_no_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache(tmp_path)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what find_spec reads first: as if it were not there
    assert bundled_tasks() is None and unknown_tasks(["nope"], tmp_path) == []
