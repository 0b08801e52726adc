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


def test_tasks_not_yet_made_are_refused_naming_the_field(tmp_path: Path) -> None:
    for task in ("preference", "tools"):
        with pytest.raises(ValidationError, match=rf"task\n.*task '{task}' is not yet supported"):
            recipe(tmp_path, task=task)
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


def test_confine_keeps_every_path_inside_the_roots(tmp_path: Path) -> None:
    roots = Roots(data_dir=tmp_path / "home", dataset_roots=(tmp_path,), model_roots=())
    confine(recipe(tmp_path), roots)
    with pytest.raises(PathRefused, match=r"sources: /etc must be inside"):
        confine(recipe(tmp_path, sources=["/etc"]), roots)
    with pytest.raises(PathRefused, match=r"output: /tmp/x.jsonl must be strictly inside"):
        confine(recipe(tmp_path, output="/tmp/x.jsonl"), roots)
