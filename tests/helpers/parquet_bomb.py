"""A Parquet decompression bomb, and reading a dataset in a fresh process as the worker or the preview reads it:
for tests/worker/test_dataset_bounds.py (what is refused, and how much memory it took) and
bench/dataset_bounds.py (how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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


def read_in_child(reader: str, path: Path) -> dict[str, Any]:
    """{answer, seconds, peak_mb} of reading `path` as `reader` ("worker" or "preview") does, in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, reader, str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
