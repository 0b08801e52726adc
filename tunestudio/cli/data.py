"""`tunestudio data inspect FILE…` (or `--hf-dataset ID`): the dataset report in the terminal, or as one JSON
object (--json, the same object `POST /api/datasets/report` answers): both ask tunestudio/data_report/, through
its face, for the report (made in a bounded child).

Exit codes: 0 with a report; 1 when the report could not be made (the dataset cannot be read, it took too
long or too much memory); 2 for arguments a job would refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from tunestudio.cli.common import console, err
from tunestudio.config import ReportSpec, format_validation_error
from tunestudio.data_report import ReportError, resolved, run_report
from tunestudio.paths import PathRefused

data_app = typer.Typer(no_args_is_help=True, help="Look at a dataset before training on it.")
SHOWN = 8  # refused rows, duplicate groups and overlapping rows shown in the terminal (--json has more)
SHOWN_COPIES = 4  # rows named per group of duplicates
BAR = 40  # characters of the longest histogram bar


@data_app.command("inspect")
def inspect(
    files: Annotated[list[Path] | None, typer.Argument(help="Dataset files or folders (.jsonl .json .csv "
                                                            ".parquet).")] = None,
    hf_dataset: Annotated[str | None, typer.Option(help="Instead of FILES: a `datasets` dataset, as a job's "
                                                        "hf_dataset (a hub id, read from the cache or the hub, or a "
                                                        "folder).")] = None,
    subset: Annotated[str | None, typer.Option(help="The hf_dataset's subset (configuration).")] = None,
    model: Annotated[str | None, typer.Option(help="Model whose tokenizer measures the rows (folder or hub id).")]
    = None,
    max_seq_length: Annotated[int | None, typer.Option(help="As the job's (default: JobConfig's).")] = None,
    format_type: Annotated[str | None, typer.Option("--format", help="auto, alpaca, sharegpt, messages, "
                                                                     "prompt_completion, text, ...")] = None,
    method: Annotated[str | None, typer.Option(help="Training method (sft, dpo, orpo, kto, grpo, pretrain).")]
    = None,
    eval_split: Annotated[str | None, typer.Option("--eval", help="An eval file, or a split name (among FILES, "
                                                                  "or of --hf-dataset): its overlap with the "
                                                                  "training rows.")] = None,
    held_out: Annotated[bool, typer.Option(help="The rows a job with eval_steps > 0 holds out: their overlap with "
                                                "the training rows.")] = False,
    seed: Annotated[int | None, typer.Option(help="random_seed of the job (the held-out split).")] = None,
    eval_fraction: Annotated[float | None, typer.Option(help="eval_fraction of the job: the share held out.")]
    = None,
    held_out_rows: Annotated[str | None, typer.Option(help="held_out_rows of the job: a job's held_out.json, "
                                                           "whose rows are held out.")] = None,
    dedupe: Annotated[str, typer.Option(help="The job's dedupe (off, exact, near): removed before the held-out "
                                             "split.")] = "off",
    max_image_size: Annotated[int | None, typer.Option(help="Image rows: the job's max_image_size (the longest "
                                                            "side the processor resizes to).")] = None,
    image_splitting: Annotated[bool, typer.Option(help="Image rows: the job's image_splitting.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Rows, refused rows, duplicates, token lengths, eval overlap, columns and roles (and for image rows: the
    images' sizes, formats, unreadable files, repeats and tokens): the data as a job reads it."""
    given = {"local_datasets": [str(f) for f in files or []], "hf_dataset": hf_dataset, "subset": subset,
             "model_name": model, "max_seq_length": max_seq_length, "format_type": format_type, "method": method,
             "eval_split": eval_split, "held_out": held_out, "random_seed": seed, "eval_fraction": eval_fraction,
             "held_out_rows": held_out_rows, "dedupe": dedupe, "max_image_size": max_image_size,
             "image_splitting": image_splitting or None}
    try:  # an option left out takes the job's default
        spec = resolved(ReportSpec.model_validate({k: v for k, v in given.items() if v is not None}))
    except ValidationError as exc:
        for error in format_validation_error(exc):
            err.print(f"[red]{escape(error['field'] or 'arguments')}: {escape(error['message'])}[/red]")
        raise typer.Exit(2) from None
    except PathRefused as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2) from None
    try:
        report = run_report(spec)
    except ReportError as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        show(report)


def _where(place: dict[str, Any]) -> str:
    return f"{Path(place['file']).name}:{place['line']}"


def show(report: dict[str, Any]) -> None:
    """The report for a person: one section per part, the first SHOWN items of each list."""
    console.print(f"[bold]{escape(report['description'])}[/]: format {report['format']}"
                  + (" (detected)" if report["detected"] else ""))
    console.print(f"rows: {report['rows']:,} read, {report['usable']:,} usable, {report['refused_count']:,} refused")
    for item in report["refused"][:SHOWN]:
        console.print(f"  [yellow]{escape(_where(item))}[/] {escape(item['reason'])}")
    if report["refused_count"] > SHOWN:
        console.print(f"  … and {report['refused_count'] - SHOWN:,} more (--json lists up to 100)")
    if report.get("images"):
        console.print("\n[bold]images[/]: " + escape(image_line(report["images"])))
        for line in image_details(report["images"]):
            console.print(f"  {escape(line)}")

    if report.get("audio"):
        console.print("\n[bold]audio[/]: " + escape(audio_line(report["audio"])))
        for line in audio_details(report["audio"]):
            console.print(f"  {escape(line)}")
    dup = report["duplicates"] or {"exact": 0, "near": 0, "method": "", "dedupe": "off", "examples": []}
    how = "" if report.get("images") else " (after normalising whitespace)"
    if report["duplicates"] is not None:
        console.print(f"\n[bold]duplicates[/]: {dup['exact']:,} exact{how}, {dup['near']:,} near "
                      f"({escape(dup['method'])})"
                      + (f"; dedupe {dup['dedupe']} removes {dup['removed']:,}" if dup["dedupe"] != "off" else ""))
    for example in dup["examples"][:SHOWN]:
        rows = ", ".join(_where(r) for r in example["rows"][:SHOWN_COPIES]) + (
            ", …" if example["count"] > SHOWN_COPIES else "")
        what = f"{example['count']} copies" if example["kind"] == "exact" else f"similarity {example['similarity']}"
        console.print(f"  {example['kind']} ({what}): {escape(rows)}  [dim]{escape(example['text'][:80])!r}[/dim]")

    lengths = report["lengths"]
    if lengths and lengths["rows"]:
        console.print(f"\n[bold]lengths[/] ({lengths['unit']}, {escape(str(report.get('model')))}): min "
                      f"{lengths['min']:,}, median {lengths['median']:,}, mean {lengths['mean']:,}, "
                      f"max {lengths['max']:,}")
        what = (f"refuses {lengths['cut_rows']:,} rows (image rows are never cut)" if lengths.get("never_cut") else
                f"cuts {lengths['cut_rows']:,} rows ({lengths['cut_tokens']:,} tokens lost)")
        console.print(f"  max_seq_length {lengths['max_seq_length']:,} {what}; {lengths['keep_95']:,} keeps 95 % of "
                      f"rows whole, {lengths['keep_99']:,} keeps 99 %")
        _histogram(lengths)
    overlap = report["eval_overlap"] or {"source": None, "note": "", "rows": []}
    if report["eval_overlap"] is not None:
        console.print("\n[bold]eval overlap[/]: " + (
            f"{overlap['eval_rows']:,} eval rows ({escape(overlap['source'])}): {overlap['exact']:,} exact and "
            f"{overlap['near']:,} near copies of training rows"
            + (f"; {overlap['images']:,} more show a training row's picture" if overlap.get("images") else "")
            if overlap["source"] else escape(overlap["note"])))
    for item in overlap["rows"][:SHOWN]:
        console.print(f"  {item['kind']}: eval {escape(_where(item['eval']))} = train {escape(_where(item['train']))}")

    table = Table("column", "rows", "empty", box=None, title_justify="left")
    for name, counts in report["columns"].items():
        table.add_row(escape(name), f"{counts['rows']:,}", f"{counts['empty']:,}")
    console.print()
    console.print(table)
    if report["roles"]:
        roles = Table("role", "turns", "empty", box=None)
        for name, counts in report["roles"].items():
            roles.add_row(escape(name), f"{counts['turns']:,}", f"{counts['empty']:,}")
        console.print(roles)
    if line := tool_line(report.get("tools")):
        console.print(f"\n[bold]tool calls[/]: {escape(line)}")
    for note in report["notes"]:
        console.print(f"[dim]{escape(note)}[/dim]")


def audio_line(audio: dict[str, Any]) -> str:
    """The report's recordings in one line: clips, minutes, per-clip seconds, rates, channels."""
    line = f"{audio['clips']:,} clips, {audio['total_seconds'] / 60:.1f} min"
    if audio["seconds"]:
        spread = audio["seconds"]
        line += f"; {spread['min']}–{spread['max']} s a clip (median {spread['median']})"
    line += "; " + ", ".join(f"{rate} Hz {n:,}" for rate, n in audio["sample_rates"].items())
    line += "; " + ", ".join(f"{'mono' if c == '1' else c + ' channels'} {n:,}" for c, n in audio["channels"].items())
    return line


def audio_details(audio: dict[str, Any]) -> list[str]:
    """The lines under it: the duration histogram, the clips over the window, the transcripts' lengths."""
    lines = []
    if audio["histogram"]:
        edges, counts = audio["histogram"]["edges"], audio["histogram"]["counts"]
        top = max(counts) or 1
        lines += [f"{edges[i]:7.2f}–{edges[i + 1]:<7.2f} s {'█' * round(20 * c / top):<20} {c:,}"
                  for i, c in enumerate(counts)]
    if audio["window_seconds"] is not None:
        lines.append(f"{audio['over_window_count']:,} clips over the model's {audio['window_seconds']:g} s window "
                     "(refused: a training clip is never cut)")
        lines += [f"  {_where(x)}: {x['seconds']} s" for x in audio["over_window"][:SHOWN]]
    if audio.get("untranscribed_count"):
        lines.append(f"{audio['untranscribed_count']:,} recordings have no transcript (no row names them): "
                     + ", ".join(audio["untranscribed"][:SHOWN]))
    for name, unit in (("transcript_words", "words"), ("transcript_chars", "characters"),
                       ("transcript_tokens", "tokens")):
        if spread := audio[name]:
            lines.append(f"transcripts: {spread['min']:g}–{spread['max']:g} {unit} (mean {spread['mean']:g})")
    return lines


def image_line(images: dict[str, Any]) -> str:
    """The report's images in one line: how many, read, unreadable, a row, sizes, formats."""
    per_row, width, height = images["per_row"], images["width"], images["height"]
    line = (f"{images['count']:,} named, {images['read']:,} read, {images['unreadable_count']:,} unreadable or "
            f"missing")
    if per_row:
        line += f"; {per_row['mean']} a row (at most {per_row['max']})"
    if width and height:
        line += (f"; width {width['min']}–{width['max']} px (median {width['median']}), height {height['min']}–"
                 f"{height['max']} (median {height['median']})")
    if images["formats"]:
        line += "; " + ", ".join(f"{fmt} {n:,}" for fmt, n in images["formats"].items())
    return line


def image_details(images: dict[str, Any]) -> list[str]:
    """The lines under it: the unreadable images (file:line, which image, why), the pictures shown more than once,
    the image tokens."""
    lines = [f"{_where(x)} image {x['image']}: {x['reason']}" for x in images["unreadable"][:SHOWN]]
    if images["unreadable_count"] > SHOWN:
        lines.append(f"… and {images['unreadable_count'] - SHOWN:,} more unreadable (--json lists up to 100)")
    if images["repeated"]:
        lines.append(f"{images['repeated']:,} showings repeat a picture shown before ({images['distinct']:,} distinct "
                     "pictures, by content)")
        for repeat in images["repeats"][:SHOWN]:
            rows = ", ".join(_where(r) for r in repeat["rows"][:SHOWN_COPIES]) + (
                ", …" if repeat["count"] > SHOWN_COPIES else "")
            lines.append(f"  {repeat['image']} ×{repeat['count']}: {rows}")
    tokens = images["tokens"]
    if tokens and tokens["per_row"]:
        spread = tokens["per_row"]
        lines.append(f"image tokens a row: min {spread['min']:,}, median {spread['median']:,}, max {spread['max']:,} "
                     f"({tokens['per_image_mean']} an image; {tokens['share']:.1%} of the rows' tokens)")
    return lines


def tool_line(tools: dict[str, Any] | None) -> str | None:
    """The report's tools, calls and reasoning in one line; None when the rows have none of them."""
    if not tools:
        return None
    per_row, per_chat = tools["tools_per_row"], tools["calls_per_conversation"]
    bad = (tools["undeclared_call_rows"], tools["arguments_not_json_rows"], tools["unanswered_tool_result_rows"],
           tools["bad_tool_schema_rows"])
    if not (per_row["rows"] or per_chat["rows"] or tools["reasoning_turns"] or any(bad)):
        return None
    share = f" ({tools['reasoning_share']:.1%} of the tokens)" if tools["reasoning_share"] is not None else ""
    return (f"{per_row['rows']:,} rows with tools ({per_row['mean']} a row, at most {per_row['max']}); "
            f"{per_chat['rows']:,} conversations with calls ({per_chat['mean']} each, at most {per_chat['max']}); "
            f"refused: {bad[0]:,} calling undeclared functions, {bad[1]:,} with arguments that are not JSON, "
            f"{bad[2]:,} with a tool result answering no call, {bad[3]:,} with tools that are not JSON Schema; "
            f"{tools['reasoning_turns']:,} turns with reasoning{share}")


def _histogram(lengths: dict[str, Any]) -> None:
    edges, counts = lengths["histogram"]["edges"], lengths["histogram"]["counts"]
    top = max(counts, default=0) or 1
    for low, high, count in zip(edges, edges[1:], counts, strict=False):
        cut = "[red]" if low > lengths["max_seq_length"] else ""  # every length in the bin is cut (report.py)
        console.print(f"  {low:>7,}–{high - 1:<7,} {cut}{'█' * round(BAR * count / top)}{'[/red]' if cut else ''}"
                      f" {count:,}")
