"""The data-making recipe (tunestudio/make_data_config.py): validated before anything runs, paths checked and
confined, the key read from the variable it names and never stored, an output file the studio did not write
never taken."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tunestudio.make_data_config import MakeDataConfig, check_output, confine, recipe_file, resolve, with_key
from tunestudio.paths import PathRefused, Roots


def recipe(tmp_path: Path, **fields: object) -> MakeDataConfig:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "a.md").write_text("# A\n\nsome text\n", encoding="utf-8")
    return MakeDataConfig.model_validate({
        "sources": [str(tmp_path / "docs")], "task": "qa", "rows": 10,
        "teacher": {"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": "TEACHER_KEY"},
        "output": str(tmp_path / "out" / "qa.jsonl"), **fields})


def test_each_task_s_own_fields_are_asked_for_and_refused_elsewhere_naming_the_field(tmp_path: Path) -> None:
    weaker = {"base_url": "http://127.0.0.1:1/v1", "model": "base"}
    with pytest.raises(ValidationError, match=r"gates\n.*preference needs rejected_by .* or gates.judge"):
        recipe(tmp_path, task="preference")
    recipe(tmp_path, task="preference", rejected_by=weaker)
    recipe(tmp_path, task="preference", gates={"judge": {}})  # the judge ranks two answers
    with pytest.raises(ValidationError, match=r"rejected_by\n.*is for the preference task, not 'qa'"):
        recipe(tmp_path, rejected_by=weaker)
    with pytest.raises(ValidationError, match=r"tools\n.*the tools task needs `tools`"):
        recipe(tmp_path, task="tools")
    with pytest.raises(ValidationError, match=r"tools\n.*is for the tools task, not 'answer'"):
        recipe(tmp_path, task="answer", tools="t.json")
    with pytest.raises(ValidationError, match=r"gates\n.*gates.judge gates nothing"):
        recipe(tmp_path, gates={"judge": {"rubric": "be right"}})
    with pytest.raises(ValidationError, match=r"gates\n.*task 'answer' has no chunk"):
        recipe(tmp_path, task="answer", gates={"judge": {"grounding": True}})
    with pytest.raises(ValidationError, match=r"gates.judge.min_score\n"):
        recipe(tmp_path, gates={"judge": {"min_score": 11}})
    with pytest.raises(ValidationError, match=r"colour\n.*Extra inputs are not permitted"):
        recipe(tmp_path, colour="red")
    with pytest.raises(ValidationError, match=r"chunk_overlap .300. must be below chunk_size .300."):
        recipe(tmp_path, chunk_size=300, chunk_overlap=300)
    with pytest.raises(ValidationError, match=r"is not an environment variable's name"):
        recipe(tmp_path, teacher={"base_url": "http://x/v1", "model": "m", "api_key_env": "sk-123 secret"})
    with pytest.raises(ValidationError, match=r"JSON lines file"):
        recipe(tmp_path, output=str(tmp_path / "out.csv"))
    assert recipe(tmp_path).budget == 30 and recipe(tmp_path, max_requests=7).budget == 7


def test_the_key_comes_from_the_environment_and_is_never_public(tmp_path: Path) -> None:
    cfg = recipe(tmp_path)
    with pytest.raises(PathRefused, match=r"TEACHER_KEY is not set"):
        with_key(cfg, {})
    keyed = with_key(cfg, {"TEACHER_KEY": "sk-very-secret"})
    assert keyed.secrets() == {"api_key": "sk-very-secret"}
    assert "sk-very-secret" not in json.dumps(keyed.public_dict())
    assert MakeDataConfig.from_parts(keyed.public_dict(), keyed.secrets()) == keyed
    # a judge on another endpoint has its own key; on the teacher's, the teacher's
    judged = recipe(tmp_path, gates={"judge": {"base_url": "https://judge.example/v1", "model": "j",
                                               "api_key_env": "JUDGE_KEY", "min_score": 7}})
    with pytest.raises(PathRefused, match=r"gates.judge.api_key_env: the environment variable JUDGE_KEY is not set"):
        with_key(judged, {"TEACHER_KEY": "sk-t"})
    both = with_key(judged, {"TEACHER_KEY": "sk-t", "JUDGE_KEY": "sk-j"})
    assert both.secrets() == {"api_key": "sk-t", "judge_api_key": "sk-j"}
    assert "sk-j" not in json.dumps(both.public_dict())
    same = recipe(tmp_path, gates={"judge": {"min_score": 7}}).gates.judge
    assert same is not None and same.endpoint(cfg.teacher).api_key_env == "TEACHER_KEY"


def test_sources_must_exist_and_an_output_not_ours_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PathRefused, match=r"sources: .*missing does not exist"):
        resolve(recipe(tmp_path, sources=[str(tmp_path / "missing")]))
    with pytest.raises(PathRefused, match=r"output: .* is one of the sources, or inside one"):
        resolve(recipe(tmp_path, output=str(tmp_path / "docs" / "x.jsonl")))
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text('{"messages": []}\n', encoding="utf-8")
    with pytest.raises(PathRefused, match=r"exists and tunestudio did not write it"):
        resolve(recipe(tmp_path, output=str(theirs)))
    recipe_file(theirs).write_text(json.dumps({"made_by": "tunestudio"}), encoding="utf-8")
    check_output(resolve(recipe(tmp_path, output=str(theirs))))  # ours: a resume appends to it
    # a new output whose rejected file (or recipe, or report) is someone else's: refused, the file untouched
    beside = tmp_path / "new.jsonl.rejected.jsonl"
    beside.write_text("mine\n", encoding="utf-8")
    with pytest.raises(PathRefused, match=r"new.jsonl.rejected.jsonl exists and tunestudio did not write it"):
        resolve(recipe(tmp_path, output=str(tmp_path / "new.jsonl")))
    assert beside.read_text(encoding="utf-8") == "mine\n"


def test_a_tools_file_is_read_and_a_bad_one_refused_naming_it(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}]), encoding="utf-8")
    (tmp_path / "p.txt").write_text("weather in Paris?\n", encoding="utf-8")
    cfg = resolve(recipe(tmp_path, task="tools", tools=str(tools), sources=[str(tmp_path / "p.txt")]))
    assert cfg.tools == str(tools)
    tools.write_text(json.dumps([{"name": "f", "parameters": {"type": "string"}}]), encoding="utf-8")
    with pytest.raises(PathRefused, match=r"tools: .*tools.json: tool 1 of 'tools' \('f'\): its 'parameters' has type"):
        resolve(recipe(tmp_path, task="tools", tools=str(tools), sources=[str(tmp_path / "p.txt")]))
    tools.write_text("{not json", encoding="utf-8")
    with pytest.raises(PathRefused, match=r"tools: .*is not JSON"):
        resolve(recipe(tmp_path, task="tools", tools=str(tools), sources=[str(tmp_path / "p.txt")]))


def test_confine_keeps_every_path_inside_the_roots(tmp_path: Path) -> None:
    roots = Roots(data_dir=tmp_path / "home", dataset_roots=(tmp_path,), model_roots=())
    confine(recipe(tmp_path), roots)
    with pytest.raises(PathRefused, match=r"sources: /etc must be inside"):
        confine(recipe(tmp_path, sources=["/etc"]), roots)
    with pytest.raises(PathRefused, match=r"output: /tmp/x.jsonl must be strictly inside"):
        confine(recipe(tmp_path, output="/tmp/x.jsonl"), roots)
