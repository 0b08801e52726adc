"""Issue 30: a Parquet decompression bomb is refused by what it decodes to, not by its size on disk, in the
worker and in the preview, before it is decoded (how fast: bench/dataset_bounds.py); a file that local_datasets
reach twice is refused. Issue 38: the dataset report streams its rows and keeps a few hundred bytes a row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tunestudio.config import JobConfig
from tunestudio.worker.data.sources import read_file_head, read_rows
from tunestudio.worker.errors import UserError

from ..helpers.parquet_bomb import read_in_child, write_bomb

REPO = Path(__file__).resolve().parents[2]

@pytest.mark.timeout(300)
@pytest.mark.parametrize(("compression", "stored_under", "preview_says"), [
    ("zstd", 10_000, "decompression bomb"),  # the reviewer's: 2 KB; its metadata alone gives it away
    ("snappy", 5_000_000, "longer than the 1,000,000 bytes the preview reads"),  # 2.3 MB: found as rows decode
])
@pytest.mark.parametrize("reader", ["worker", "preview"])
def test_a_parquet_bomb_is_refused_quickly_naming_the_file_and_decodes_little(
        tmp_path: Path, reader: str, compression: str, stored_under: int, preview_says: str) -> None:
    bomb = write_bomb(tmp_path / f"bomb-{compression}.parquet", compression)
    assert bomb.stat().st_size < stored_under
    got = read_in_child(reader, bomb)
    print(f"{reader}, {compression} bomb of {bomb.stat().st_size:,} bytes: {got}")
    assert str(bomb) in got["answer"], got
    assert (preview_says if reader == "preview" else "decompression bomb") in got["answer"], got
    assert got["peak_mb"] < 500, got  # decoding it took minutes and 3.9 GB


def test_the_preview_of_a_parquet_file_decodes_whole_rows_up_to_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "long.parquet"  # 10 rows of 300 kB (incompressible: no bomb), 2 row groups
    rows = [{"instruction": f"row {i}", "output": os.urandom(150_000).hex()} for i in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5, compression="zstd")
    got, total = read_file_head(path, 50, 1_000_000)
    assert total == 10 and [r.data for r in got] == rows[:3]  # 3 x 300 kB fit in 1 MB, a fourth does not
    got, _ = read_file_head(path, 50, 100_000)
    assert got[0].data is None and "longer than the 100,000 bytes the preview reads" in (got[0].problem or "")


def test_a_file_that_local_datasets_reach_twice_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"instruction": "i", "output": "o"}) + "\n")
    (tmp_path / "alias.jsonl").symlink_to(folder / "a.jsonl")
    for listed in ([folder, folder / "a.jsonl"], [folder / "a.jsonl", tmp_path / "alias.jsonl"]):
        cfg = JobConfig.model_validate({"model_name": "org/model", "local_datasets": [str(p) for p in listed]})
        with pytest.raises(UserError, match="is reached twice through local_datasets"):
            read_rows(cfg)


# Builds the report (no model) on N generated short rows in a fresh process and prints what its memory grew by
# while it read them, past what the imports took.
REPORT_SCRIPT = textwrap.dedent("""
    import json, re, sys
    from tunestudio.config import ReportSpec
    from tunestudio.worker.data.report import build

    def status(field):
        with open("/proc/self/status") as fh:
            return int(re.search(field + r":\\s+(\\d+) kB", fh.read()).group(1)) * 1024

    rows, path = int(sys.argv[1]), sys.argv[2]
    with open(path, "w") as fh:  # the finding's file: every row distinct, short
        fh.writelines(json.dumps({"instruction": f"q{i}", "output": f"a{i % 1000}"}) + "\\n" for i in range(rows))
    before = status("VmRSS")
    report = build(ReportSpec(local_datasets=[path], held_out=True))
    print(json.dumps({"usable": report["usable"], "grew": status("VmHWM") - before}))
""")


@pytest.mark.timeout(120)
def test_the_report_streams_its_rows_and_keeps_a_few_hundred_bytes_a_row(tmp_path: Path) -> None:
    """Issue 38 finding 5: the report held every row as Python objects (about 7 KB a row of this file: 1M rows
    ran into its 4 GiB bound); it streams them and keeps a hash, a signature and a few numbers a row in arrays
    (about 300 bytes; the 1M-row figure, with a tokenizer, is in bench/dataset_report.py --shape short)."""
    rows = 100_000
    proc = subprocess.run([sys.executable, "-c", REPORT_SCRIPT, str(rows), str(tmp_path / "short.jsonl")], cwd=REPO,
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{rows:,} short rows: memory grew {got['grew'] / rows:.0f} bytes a row")
    assert got["usable"] == rows
    assert got["grew"] < 1500 * rows, got
