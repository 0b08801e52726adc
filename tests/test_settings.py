"""The data directory and what the studio writes in it are its owner's only: another local user reads no job,
dataset, metric or sweep."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tunestudio.jobs.store import Store
from tunestudio.settings import Settings


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_data_directory_the_studio_makes_and_its_folders_and_database_are_owner_only(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "new" / "home")
    home = settings.data_dir()
    assert mode(home) == 0o700
    assert (mode(settings.jobs_dir()), mode(settings.uploads_dir())) == (0o700, 0o700)
    store = Store(home / "tunestudio.db")
    try:  # SQLite gives its WAL and shared-memory files the database's mode
        assert {p.name: mode(p) for p in home.glob("tunestudio.db*")} == {
            name: 0o600 for name in ("tunestudio.db", "tunestudio.db-wal", "tunestudio.db-shm")}
    finally:
        store.close()


def test_a_home_the_user_gave_keeps_its_mode_and_the_studios_own_files_in_it_are_tightened(tmp_path: Path) -> None:
    """A TUNESTUDIO_HOME that was there keeps the mode its user chose; the studio's own folders and database in it
    (an older version's, made with the umask's modes) are made owner-only."""
    home = tmp_path / "shared"
    (home / "jobs").mkdir(parents=True, mode=0o755)
    home.chmod(0o755)
    (home / "tunestudio.db").touch(mode=0o644)
    (home / "tunestudio.db").chmod(0o644)
    settings = Settings(home=home)
    assert settings.data_dir() == home and mode(home) == 0o755
    assert mode(settings.jobs_dir()) == 0o700
    Store(home / "tunestudio.db").close()
    assert mode(home / "tunestudio.db") == 0o600


def test_the_default_data_directory_is_the_studios_own_and_is_tightened(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNESTUDIO_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".tunestudio").mkdir(mode=0o755)
    (tmp_path / ".tunestudio").chmod(0o755)
    assert Settings(_env_file=None).data_dir() == tmp_path / ".tunestudio"
    assert mode(tmp_path / ".tunestudio") == 0o700
