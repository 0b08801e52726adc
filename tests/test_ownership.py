"""A job owns only what it made: take, seal and release of an output folder (tunestudio/ownership.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunestudio import ownership


def test_a_folder_the_job_created_is_removed_with_its_files_and_the_parents_it_made(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b" / "out"
    (tmp_path / "a").mkdir()
    ownership.take(folder, "j1")
    (folder / "model.bin").write_bytes(b"x")
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "state.json").write_text("{}")
    assert ownership.seal(folder, "j1") == ["checkpoint-1", "model.bin"]
    removed = ownership.release(folder, "j1")
    assert not folder.exists() and not (tmp_path / "a" / "b").exists()
    assert (tmp_path / "a").is_dir()  # it was there before the job
    assert folder in removed and tmp_path / "a" / "b" in removed


def test_a_folder_with_files_of_its_own_is_not_taken(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(ownership.NotOurs, match="did not write"):
        ownership.take(tmp_path, "j1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]  # no marker either
    assert ownership.release(tmp_path, "j1") == []
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_a_folder_found_empty_stays_and_files_added_later_are_not_the_jobs(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    ownership.take(folder, "j1")
    (folder / "adapter.bin").write_bytes(b"x")
    ownership.seal(folder, "j1")
    (folder / "notes.txt").write_text("the user's")  # after the job ended
    ownership.release(folder, "j1")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    ownership.take(tmp_path / "empty", "j2")
    (tmp_path / "found").mkdir()
    ownership.take(tmp_path / "found", "j3")
    ownership.seal(tmp_path / "found", "j3")
    ownership.release(tmp_path / "found", "j3")
    assert (tmp_path / "found").is_dir() and not any((tmp_path / "found").iterdir())  # found empty: kept


def test_a_second_job_in_an_earlier_output_owns_only_what_it_added(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    ownership.take(folder, "j1")
    (folder / "adapter.bin").write_bytes(b"1")
    ownership.seal(folder, "j1")
    ownership.take(folder, "j2")  # an earlier tunestudio output: allowed
    (folder / "adapter.bin").write_bytes(b"2")
    (folder / "checkpoint-9").mkdir()
    assert ownership.seal(folder, "j2") == ["checkpoint-9"]
    ownership.release(folder, "j2")
    assert sorted(p.name for p in folder.iterdir()) == [ownership.MARKER, "adapter.bin"]
    ownership.release(folder, "j1")
    assert not folder.exists()


def test_a_file_where_a_folder_should_be_is_not_taken(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ownership.NotOurs, match="not a folder"):
        ownership.take(tmp_path / "f", "j1")


def test_replaced_entries_become_the_replacing_jobs_and_leave_the_earlier_ones(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    ownership.take(folder, "e1")
    (folder / "model.gguf").write_bytes(b"1")
    ownership.seal(folder, "e1")
    (folder / "notes.txt").write_text("the user's")
    ownership.take(folder, "e2")
    ownership.replaced(folder, ["model.gguf"])
    (folder / "model.gguf").write_bytes(b"2")
    assert ownership.seal(folder, "e2") == ["model.gguf"] and ownership.files(folder, "e1") == []
    assert ownership.owners(folder) == {"e1", "e2"}


def test_only_a_staging_folder_tunestudio_made_is_discarded(tmp_path: Path) -> None:
    folder = tmp_path / "sub" / "out"
    staging = ownership.stage(folder)
    assert staging == tmp_path / "sub" / ".out.partial" and (staging / ownership.PARTIAL).is_file()
    (staging / "half.bin").write_bytes(b"x")
    assert ownership.stage(folder) == staging and not (staging / "half.bin").exists()  # a killed job's: replaced
    assert ownership.discard_staging(folder) and not staging.exists()
    staging.mkdir()
    (staging / "draft.txt").write_text("the user's")
    assert not ownership.discard_staging(folder)
    with pytest.raises(ownership.NotOurs, match="did not make"):
        ownership.stage(folder)
    assert (staging / "draft.txt").read_text() == "the user's"
