"""Issue 30: a Parquet decompression bomb is refused by what it decodes to, not by its size on disk, in the
worker and in the preview, before it is decoded; a file that local_datasets reach twice is refused."""

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

REPO = Path(__file__).resolve().parents[2]

# Reads the dataset as the worker does (prepare) or as the preview does (its child), in a fresh process, and
# reports the answer, the time it took and the peak memory of whoever decoded it: this process's own peak
# (VmHWM: ru_maxrss would count the pytest process it was forked from) or the preview child's.
SCRIPT = textwrap.dedent("""
    import json, re, resource, sys, time
    from tunestudio.config import JobConfig

    cfg = JobConfig.model_validate({"model_name": "org/model", "local_datasets": [sys.argv[2]]})
    start = time.monotonic()
    if sys.argv[1] == "worker":
        from tunestudio.worker.data import prepare
        from tunestudio.worker.errors import UserError
        try:
            answer = f"read {len(prepare(cfg).train)} rows"
        except UserError as exc:
            answer = str(exc)
        with open("/proc/self/status") as status:
            peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
    else:
        from tunestudio.api.preview import preview_rows
        from tunestudio.config import DataSpec
        spec = DataSpec(local_datasets=cfg.local_datasets)  # what the route hands the preview
        answer = preview_rows(spec.model_dump(mode="json"), 5).get("error") or "previewed"
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the preview's child
    print(json.dumps({"answer": answer, "seconds": time.monotonic() - start, "peak_mb": peak / 1024}))
""")


def write_bomb(path: Path, compression: str) -> Path:
    """20 rows of one 50 MB string each: 1 GB of rows, stored once as a dictionary entry (written without
    building the 1 GB)."""
    column = pa.DictionaryArray.from_arrays(pa.array([0] * 20, pa.int32()), pa.array(["a" * 50_000_000]))
    pq.write_table(pa.table({"instruction": ["Repeat this"] * 20, "output": column}), path, compression=compression)
    return path


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
    proc = subprocess.run([sys.executable, "-c", SCRIPT, reader, str(bomb)], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{reader}, {compression} bomb of {bomb.stat().st_size:,} bytes: {got}")
    assert str(bomb) in got["answer"], got
    assert (preview_says if reader == "preview" else "decompression bomb") in got["answer"], got
    assert got["seconds"] < 30, got  # decoding it took minutes and 3.9 GB
    assert got["peak_mb"] < 500, got


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
