"""The held-out split by identity (worker/data/held_out.py): recorded, and held out again by a job that names the
record (a resume, a clone), whatever the order of the file; changed data says which rows are gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.config import JobConfig
from tunestudio.config.report import ReportSpec
from tunestudio.worker import data
from tunestudio.worker.data import held_out
from tunestudio.worker.errors import UserError

# 400 distinct rows (the bundled alpaca.jsonl repeats most of its rows: a row removed there is still in it)
ROWS = [json.dumps({"instruction": f"What comes after {n}?", "input": "", "output": str(n + 1)}) for n in range(400)]


def config(dataset: Path, **overrides: object) -> JobConfig:
    return JobConfig.model_validate({"model_name": "org/none", "local_datasets": [str(dataset)], "eval_steps": 5,
                                     "random_seed": 11, **overrides})


def spec(cfg: JobConfig) -> ReportSpec:
    """What the dataset report of the job's files is asked (as the API and the CLI ask it)."""
    fields = ("local_datasets", "eval_fraction", "held_out_rows", "random_seed", "eval_split")
    return ReportSpec.model_validate({**{f: getattr(cfg, f) for f in fields}, "held_out": cfg.eval_steps > 0})


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def recorded(tmp_path: Path, prepared: data.PreparedData, name: str = "held_out.json") -> Path:
    assert prepared.held_out is not None
    path = tmp_path / name
    held_out.write(path, prepared.held_out)
    return path


def contents(prepared: data.PreparedData) -> list[str]:
    assert prepared.eval is not None
    return sorted(json.dumps(row, sort_keys=True) for row in prepared.eval.to_list())


def test_the_split_is_seeded_and_recorded_by_place_and_content(tmp_path: Path) -> None:
    dataset = write(tmp_path / "a.jsonl", ROWS)
    first, again = data.prepare(config(dataset)), data.prepare(config(dataset))
    assert first.held_out == again.held_out
    record = first.held_out
    assert record is not None and record["seed"] == 11 and record["source"] is None
    assert len(record["rows"]) == data.auto_eval_size(len(ROWS)) == 20
    assert record["train_rows"] == len(ROWS) - 20
    # each recorded row is the row at its place, and the eval rows' places are the recorded ones
    for entry in record["rows"]:
        assert entry["key"] == held_out.row_key(json.loads(ROWS[entry["line"] - 1]))
    assert first.eval_places == [{"file": e["file"], "line": e["line"]} for e in record["rows"]]
    other_seed = data.prepare(config(dataset, random_seed=12)).held_out
    assert other_seed is not None and other_seed["rows"] != record["rows"]


def test_a_record_holds_out_the_same_rows_again_even_from_a_reordered_file(tmp_path: Path) -> None:
    dataset = write(tmp_path / "a.jsonl", ROWS)
    first = data.prepare(config(dataset))
    path = recorded(tmp_path, first)
    same = data.prepare(config(dataset, held_out_rows=str(path), random_seed=99))  # a clone with another seed
    assert same.held_out is not None and first.held_out is not None
    assert same.held_out["rows"] == first.held_out["rows"]  # same places, same contents
    assert same.held_out["source"] == str(path) and same.held_out["seed"] == 11
    assert same.train.to_list() == first.train.to_list()  # the very same training rows, in their order
    assert not same.warnings

    shuffled = write(tmp_path / "b.jsonl", list(reversed(ROWS)))
    moved = data.prepare(config(shuffled, held_out_rows=str(path)))
    assert contents(moved) == contents(first)
    assert sorted(map(json.dumps, moved.train.to_list())) == sorted(map(json.dumps, first.train.to_list()))
    assert moved.warnings == []  # the same rows, another order: the data is the same


def test_changed_data_names_the_held_out_rows_it_lost_and_says_added_rows_only_train(tmp_path: Path) -> None:
    dataset = write(tmp_path / "a.jsonl", ROWS)
    first = data.prepare(config(dataset))
    path = recorded(tmp_path, first)
    assert first.held_out is not None
    lost = sorted(e["line"] for e in first.held_out["rows"])[:2]  # two held-out rows edited
    edited = [r.replace('"output": "', '"output": "edited ') if n in lost else r for n, r in enumerate(ROWS, 1)]
    write(dataset, edited)
    with pytest.raises(UserError) as caught:
        data.prepare(config(dataset, held_out_rows=str(path)))
    message = str(caught.value)
    assert message.startswith(f"held_out_rows: the data changed since {path} was written: 2 of its 20 held-out "
                              "rows are not among this job's usable rows any more")
    assert f"{dataset} row {lost[0]}; {dataset} row {lost[1]}" in message
    assert "unset held_out_rows for a new seeded split" in message

    extra = json.dumps({"instruction": "Say it.", "input": "new", "output": "row"})
    write(dataset, [*ROWS, extra])
    grown = data.prepare(config(dataset, held_out_rows=str(path)))
    assert contents(grown) == contents(first)
    assert len(grown.train) == len(first.train) + 1
    assert grown.warnings == [f"held_out_rows: the training rows changed since {path} was written "
                              f"({len(ROWS) - 20 + 1} now, {len(ROWS) - 20} then); the same 20 rows are held "
                              "out, the rest train"]


def test_a_repeated_row_is_held_out_at_its_own_place(tmp_path: Path) -> None:
    # rows 1 and 2 are the same; whichever copy the seed held out, the record holds out that copy again
    lines = [ROWS[0], *ROWS[:79]]
    dataset = write(tmp_path / "a.jsonl", lines)
    for seed in range(6):
        first = data.prepare(config(dataset, random_seed=seed))
        path = recorded(tmp_path, first)
        again = data.prepare(config(dataset, held_out_rows=str(path)))
        assert again.held_out is not None and first.held_out is not None
        assert again.held_out["rows"] == first.held_out["rows"]


def test_a_record_that_is_not_one_is_refused(tmp_path: Path) -> None:
    dataset = write(tmp_path / "a.jsonl", ROWS)
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"rows": 3}')
    with pytest.raises(UserError, match="is not a held-out record of tunestudio"):
        data.prepare(config(dataset, held_out_rows=str(bogus)))


def test_the_config_takes_a_record_only_for_rows_it_holds_out() -> None:
    with pytest.raises(ValueError, match=r"held_out_rows: .* set eval_steps above 0"):
        JobConfig.model_validate({"model_name": "m", "local_datasets": ["a.jsonl"], "held_out_rows": "h.json"})
    with pytest.raises(ValueError, match=r"held_out_rows: .* unset eval_split"):
        JobConfig.model_validate({"model_name": "m", "local_datasets": ["a.jsonl"], "held_out_rows": "h.json",
                                  "eval_steps": 5, "eval_split": "test"})


@pytest.mark.parametrize(("rows", "fraction", "size"), [(400, None, 20), (20, None, 0), (400, 0.1, 40), (20, 0.1, 2),
                                                        (3, 0.01, 1), (2, 0.99, 1), (1, 0.5, 0)])
def test_eval_fraction_sizes_the_split_and_leaves_a_row_to_train(rows: int, fraction: float | None, size: int) -> None:
    assert data.eval_size(rows, fraction) == size


def test_eval_fraction_holds_out_its_share_and_the_report_names_the_same_rows(tmp_path: Path) -> None:
    from tunestudio.worker.data import report

    dataset = write(tmp_path / "a.jsonl", ROWS[:50])
    cfg = config(dataset, eval_fraction=0.2)
    prepared = data.prepare(cfg)
    assert prepared.held_out is not None and len(prepared.held_out["rows"]) == 10 and len(prepared.train) == 40
    overlap = report.build(spec(cfg))["eval_overlap"]
    assert overlap["eval_rows"] == 10 and overlap["source"].startswith("held-out split: 10 of 50 rows, seed 11")
    with pytest.raises(ValueError, match="eval_fraction: held_out_rows decides which rows are held out"):
        config(dataset, eval_fraction=0.2, held_out_rows="h.json")
    with pytest.raises(ValueError, match=r"eval_fraction: .* unset eval_split"):
        config(dataset, eval_fraction=0.2, eval_split="test")


def test_the_report_holds_out_a_records_rows_as_the_clone_does(tmp_path: Path) -> None:
    from tunestudio.worker.data import report

    dataset = write(tmp_path / "a.jsonl", ROWS)
    first = data.prepare(config(dataset))
    path = recorded(tmp_path, first)
    assert first.held_out is not None
    copies = [ROWS[e["line"] - 1] for e in first.held_out["rows"]]
    write(dataset, [*ROWS, *copies])  # every held-out row now also a training row, at the end of the file
    cfg = config(dataset, held_out_rows=str(path), random_seed=1)
    assert contents(data.prepare(cfg)) == contents(first)
    overlap = report.build(spec(cfg))["eval_overlap"]
    assert overlap["source"] == f"held-out rows of {path}: 20 of 420 rows (as the job holds them out)"
    assert overlap["eval_rows"] == overlap["exact"] == 20  # the very rows the clone holds out, each leaked

    gone = first.held_out["rows"][0]["line"]  # a held-out row edited: the report says what the job would
    write(dataset, [r.replace('"output": "', '"output": "x') if n == gone else r for n, r in enumerate(ROWS, 1)])
    changed = report.build(spec(cfg))["eval_overlap"]
    assert changed["source"] is None and changed["note"].startswith(
        f"held_out_rows: the data changed since {path} was written: 1 of its 20 held-out rows")


def test_a_record_that_would_leave_nothing_to_train_says_so(tmp_path: Path) -> None:
    dataset = write(tmp_path / "a.jsonl", ROWS)
    first = data.prepare(config(dataset))
    path = recorded(tmp_path, first)
    assert first.held_out is not None
    write(dataset, [ROWS[e["line"] - 1] for e in first.held_out["rows"]])  # only the held-out rows are left
    with pytest.raises(UserError, match="every usable row of this job is one of the 20 rows"):
        data.prepare(config(dataset, held_out_rows=str(path)))
