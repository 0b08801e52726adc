"""The explicit paths step: resolve, confine, protect the data directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.paths import PathRefused, Roots, confine, looks_like_path, protect_data_dir, resolve, tensorboard_path

from .helpers.jobs import DATA

ALPACA = str(DATA / "alpaca.jsonl")


def cfg(**overrides: Any) -> JobConfig:
    return JobConfig.model_validate({"model_name": "org/model", "local_datasets": [ALPACA], **overrides})


def refused(call: Any) -> PathRefused:
    with pytest.raises(PathRefused) as info:
        call()
    return info.value


def test_resolve_makes_paths_absolute_and_checks_they_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    got = resolve(cfg(model_name="models/m", output_dir="out", local_datasets=[ALPACA]))
    assert got.model_name == str(model) and got.output_dir == str(tmp_path / "out")
    assert resolve(cfg(model_name="org/model")).model_name == "org/model"  # a hub id stays one
    assert refused(lambda: resolve(cfg(local_datasets=[str(tmp_path / "nope.jsonl")]))).field == "local_datasets"
    missing_model = refused(lambda: resolve(cfg(model_name="./models/gone")))
    assert missing_model.field == "model_name" and "does not exist" in missing_model.message
    assert refused(lambda: resolve(cfg(eval_split="data/val.jsonl"))).field == "eval_split"
    assert resolve(cfg(eval_split="test")).eval_split == "test"  # a split name, not a path


def test_names_no_filesystem_takes_are_refused_or_left_to_the_hub_never_raised() -> None:
    """Path.exists() raises for a 300-byte name (ENAMETOOLONG): such a path does not exist, it is not an error."""
    long = "x" * 300
    assert refused(lambda: resolve(cfg(local_datasets=[long + ".jsonl"]))).field == "local_datasets"
    assert refused(lambda: resolve(cfg(model_name="./" + long))).field == "model_name"
    assert resolve(cfg(model_name=long)).model_name == long  # not a path: a hub id the worker will look up


def test_looks_like_path() -> None:
    assert looks_like_path("./m") and looks_like_path("/abs/m") and looks_like_path("~/m") and looks_like_path("a/b/c")
    assert not looks_like_path("org/name") and not looks_like_path("gpt2")


def roots(tmp_path: Path) -> Roots:
    data = tmp_path / "home"
    (tmp_path / "work").mkdir(exist_ok=True)
    return Roots(data, (data, tmp_path / "work"), (data, tmp_path / "models"))


def test_confine_keeps_every_path_inside_its_roots(tmp_path: Path) -> None:
    r = roots(tmp_path)
    inside = str(tmp_path / "work" / "d.jsonl")
    confine(cfg(local_datasets=[inside], output_dir=str(tmp_path / "work" / "out")), r)
    cases = {
        "local_datasets": {"local_datasets": ["/etc/passwd"]},
        "eval_split": {"local_datasets": [inside], "eval_split": "/etc/val.jsonl"},
        "hf_dataset": {"local_datasets": [], "hf_dataset": "/srv/data/set"},
        "model_name": {"local_datasets": [inside], "model_name": "/opt/models/m"},
        "output_dir": {"local_datasets": [inside], "output_dir": str(tmp_path / "work")},  # a root itself
        "resume_from_checkpoint": {"local_datasets": [inside], "resume_from_checkpoint": "/var/ckpt"},
        "tensorboard_dir": {"local_datasets": [inside], "output_dir": str(tmp_path / "work" / "o"),
                            "enable_tensorboard": True, "tensorboard_dir": "/tmp/tb"},
    }
    for field, overrides in cases.items():
        assert refused(lambda o=overrides: confine(cfg(**o), r)).field == field, field


def test_a_refusal_does_not_tell_whether_an_outside_path_exists(tmp_path: Path) -> None:
    r = roots(tmp_path)
    there = tmp_path / "secret.jsonl"
    there.write_text("{}")
    a = refused(lambda: confine(cfg(local_datasets=[str(there)]), r)).message.replace(str(there), "P")
    b = refused(lambda: confine(cfg(local_datasets=[str(tmp_path / "absent.jsonl")]), r)).message
    assert a == b.replace(str(tmp_path / "absent.jsonl"), "P")


def test_tensorboard_relative_lands_in_output_dir() -> None:
    assert tensorboard_path(cfg(output_dir="/x/out")) == Path("/x/out/runs")
    assert tensorboard_path(cfg(output_dir="/x/out", tensorboard_dir="/y/tb")) == Path("/y/tb")


def test_protect_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "home"
    for bad in (data, tmp_path, data / "jobs", data / "jobs" / "x" / "output", data / "data" / "o", data / "slots"):
        assert refused(lambda b=bad: protect_data_dir(cfg(output_dir=str(b)), data, [])).field == "output_dir"
    other = str(data / "outs" / "a")
    protect_data_dir(cfg(output_dir=str(data / "outs" / "b")), data, [(other, True)])
    for bad, live in ((data / "outs", False), (data / "outs" / "a" / "sub", False), (data / "outs" / "a", True)):
        assert refused(lambda b=bad, v=live: protect_data_dir(cfg(output_dir=str(b)), data, [(other, v)]))
    protect_data_dir(cfg(output_dir=other), data, [(other, False)])  # running a finished job's file again


def test_a_tilde_of_no_user_is_left_as_written() -> None:
    """pathlib raises RuntimeError for "~nosuchuser"; a shell leaves it as written, and so does expand()."""
    from tunestudio.paths import expand

    assert expand("~no-such-user-here/x") == Path("~no-such-user-here/x")
    assert expand("~/x") == Path.home() / "x"


def test_one_dataset_under_two_spellings_is_refused_at_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text('{"instruction": "x", "output": "y"}\n')
    monkeypatch.chdir(tmp_path)
    cfg = JobConfig(model_name="org/m", local_datasets=["a.jsonl", str(data)])
    with pytest.raises(PathRefused, match="listed twice") as info:
        resolve(cfg)
    assert info.value.field == "local_datasets"


def test_a_reward_model_folder_is_made_absolute_must_exist_and_lies_in_the_model_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "rm").mkdir(parents=True)
    grpo = {"method": "grpo", "batch_size": 4, "gradient_accumulation_steps": 1}
    done = resolve(cfg(**grpo, reward_functions=["model:models/rm", "exact_match"]))
    assert done.reward_functions == [f"model:{tmp_path / 'models' / 'rm'}", "exact_match"]
    missing = refused(lambda: resolve(cfg(**grpo, reward_functions=["model:models/none"])))
    assert missing.field == "reward_functions" and "does not exist" in str(missing)
    roots = Roots(tmp_path / "home", (DATA,), (tmp_path / "models",))
    confine(cfg(**grpo, reward_functions=[f"model:{tmp_path / 'models' / 'rm'}"]), roots)
    outside = refused(lambda: confine(cfg(**grpo, reward_functions=[f"model:{tmp_path}"]), roots))
    assert outside.field == "reward_functions" and "model folders" in str(outside)
