"""`tunestudio arena`: the arena's votes from the command line (the page and /api/arena make them).

- `arena export [--format dpo|kto|sft] [--out FILE]`: the votes as a new JSONL dataset (DPO pairs, KTO rows, the
  edited answers as SFT rows): at FILE, or a new name in the data directory's data/arena/; never over a file.
- `arena votes [--json]`: the stored votes, oldest first.
- `arena leaderboard [--json]`: Bradley-Terry scores with 95% intervals, pairwise win rates, position bias.

It reads the arena's database in the data directory (TUNESTUDIO_HOME) and answers no battle, so a server using
the same directory is left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tunestudio.arena import EXPORTS, FILE, Arena, ArenaInvalid
from tunestudio.cli.common import console, err, load_settings

arena_app = typer.Typer(no_args_is_help=True, help="The arena's votes: export them as datasets, list them, rank "
                                                   "the models.")


def _arena() -> Arena:
    settings = load_settings()

    def answers_nothing(*_: Any) -> Any:
        raise RuntimeError("the command line answers no battle")

    return Arena(settings.data_dir() / FILE, settings.arena_exports(), answers_nothing, lambda _m: None,
                 serving=False)


@arena_app.command("export")
def export(
    format: Annotated[str, typer.Option(help=f"What the votes become: {', '.join(EXPORTS)} (dpo: chosen/rejected "
                                             "pairs for DPO, ORPO and reward jobs; kto: labelled rows; sft: the "
                                             "edited answers).")] = "dpo",
    out: Annotated[Path | None, typer.Option(help="The file to write (it must not exist); default: a new file "
                                                  "in the data directory's data/arena/.")] = None,
) -> None:
    """Write the arena's votes as a new JSONL dataset, ready for a job's local_datasets."""
    arena = _arena()
    try:
        done = arena.export(format, out.expanduser().resolve() if out else None)
    except ArenaInvalid as exc:
        err.print(f"[red]{exc}[/red]", soft_wrap=True)
        raise typer.Exit(2 if not exc.conflict else 1) from None
    finally:
        arena.close()
    skipped = ", ".join(f"{n} {why}" for why, n in done["skipped"].items())
    console.print(f"{done['rows']} {format} rows written to {done['path']}" + (f" (left out: {skipped})" if skipped
                                                                                else ""), soft_wrap=True)


@arena_app.command("votes")
def votes(json_out: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False) -> None:
    """The stored votes, oldest first: the prompt, the two models, the choice."""
    arena = _arena()
    try:
        stored = arena.votes()
    finally:
        arena.close()
    if json_out:
        for vote in stored:
            print(json.dumps(vote, ensure_ascii=False))
        return
    table = Table("battle", "A", "B", "vote", "prompt")
    for vote in stored:
        table.add_row(vote["id"], vote["models"]["a"], vote["models"]["b"],
                      vote["vote"]["choice"] + (" (edited)" if vote["vote"]["edited"] else ""), vote["prompt"][:60])
    console.print(table)
    console.print(f"{len(stored)} votes")


@arena_app.command("leaderboard")
def leaderboard(
    json_out: Annotated[bool, typer.Option("--json", help="The board as one JSON object.")] = False,
) -> None:
    """The arena's models ranked by Bradley-Terry score (Elo scale), with 95% bootstrap intervals."""
    arena = _arena()
    try:
        board = arena.leaderboard([r["model"] for r in arena.roster()])
    finally:
        arena.close()
    if json_out:
        print(json.dumps(board))
        return
    table = Table("#", "model", "score", "95% interval", "votes", "won / lost / tied")
    for i, s in enumerate(board["standings"], 1):
        interval = "–" if s["low"] is None else f"{s['low']:.0f}–{s['high']:.0f}"
        table.add_row(str(i), s["model"], f"{s['score']:.0f}", interval, str(s["votes"]),
                      f"{s['wins']} / {s['losses']} / {s['ties'] + s['both_bad']}")
    console.print(table)
    left = board["position"]["left_rate"]
    if left["value"] is not None:
        console.print(f"left answer (A) won {left['value']:.0%} of {board['position']['decisive']} decided votes "
                      f"(95%: {left['low']:.0%}–{left['high']:.0%})")
