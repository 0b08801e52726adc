"""`tunestudio arena export | votes | leaderboard` on an arena database made by the service with scripted models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunestudio.arena import FILE, Arena
from tunestudio.cli import app
from tunestudio.settings import Settings

SAYS = {"left-model": "Paris.", "right-model": "Rome."}


@pytest.fixture
def voted() -> Settings:
    """Three votes in the data directory's arena (TUNESTUDIO_HOME is the test's own): Paris wins twice, one tie; the
    Paris answer edited once."""
    settings = Settings()
    arena = Arena(settings.data_dir() / FILE, settings.arena_exports(),
                  lambda model, _p: lambda _m: SAYS[model], lambda _m: None)
    try:
        for choice in ("good", "good-edited", "tie"):
            battle = arena.wait(arena.start([{"role": "user", "content": "Capital of France?"}], list(SAYS),
                                            blind=False)["id"], 30)
            side = "a" if battle["answers"]["a"] == "Paris." else "b"
            if choice == "tie":
                arena.vote(battle["id"], "tie")
            else:
                arena.vote(battle["id"], side, "Paris, the capital." if choice == "good-edited" else None)
    finally:
        arena.close()
    return settings


def test_export_writes_a_new_file_and_never_over_one(voted: Settings, tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["arena", "export", "--format", "dpo"])
    assert done.exit_code == 0, done.output
    assert "2 dpo rows written to" in done.output and "(left out: 1 tie)" in done.output
    (written,) = voted.arena_exports().glob("arena-dpo-*.jsonl")
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert sorted(r["chosen"][0]["content"] for r in rows) == ["Paris, the capital.", "Paris."]
    assert {r["rejected"][0]["content"] for r in rows} == {"Rome."}

    mine = tmp_path / "mine.jsonl"
    mine.write_text("my own file\n")
    refused = runner.invoke(app, ["arena", "export", "--format", "sft", "--out", str(mine)])
    assert refused.exit_code == 1 and "never writes over a file" in refused.output
    assert mine.read_text() == "my own file\n"
    sft = runner.invoke(app, ["arena", "export", "--format", "sft", "--out", str(tmp_path / "sft.jsonl")])
    assert sft.exit_code == 0 and json.loads((tmp_path / "sft.jsonl").read_text())["messages"][-1] == {
        "role": "assistant", "content": "Paris, the capital."}
    bad = runner.invoke(app, ["arena", "export", "--format", "csv"])
    assert bad.exit_code == 2 and "format: 'csv' is not one of dpo, kto, sft" in bad.output


def test_votes_and_leaderboard(voted: Settings) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["arena", "votes", "--json"])
    assert listed.exit_code == 0
    votes = [json.loads(line) for line in listed.output.splitlines()]
    assert [v["vote"]["choice"] == "tie" for v in votes] == [False, False, True]
    board = json.loads(runner.invoke(app, ["arena", "leaderboard", "--json"]).output)
    assert [s["model"] for s in board["standings"]] == ["left-model", "right-model"]
    table = runner.invoke(app, ["arena", "leaderboard"]).output
    assert "left-model" in table and "2 / 0 / 1" in table
