"""The held-out rows of a job, with real tiny-model workers: recorded before training, held out again by its resume
and by a clone that names the record (another seed, even), evaluated row by row; changed data fails the clone
with a message naming the rows it lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.events import EVAL_ROWS_FILE, HELD_OUT_FILE
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus
from tunestudio.settings import Settings

from ..helpers.jobs import job_config
from ..helpers.wait import wait_until

S = JobStatus


def wait_end(manager: JobManager, job_id: str, timeout: float = 400) -> Job:
    wait_until(lambda: manager.get(job_id).status.is_terminal, timeout, f"job {job_id} to end")
    return manager.get(job_id)


def held(folder: str | Path) -> list[dict]:
    return json.loads((Path(folder) / HELD_OUT_FILE).read_text())["rows"]


def dataset(path: Path) -> Path:
    # 200 distinct rows (16 held out); prompt and completion, so every held-out row is answered and scored
    path.write_text("".join(json.dumps({"prompt": f"What comes after {n}?", "completion": f" {n + 1}"}) + "\n"
                            for n in range(200)))
    return path


@pytest.mark.timeout(900)  # four real jobs on a shared machine
def test_a_resume_and_a_clone_hold_out_exactly_the_first_jobs_rows(tiny_model: Path, tmp_path: Path) -> None:
    data = dataset(tmp_path / "data.jsonl")
    cfg = job_config(tiny_model, tmp_path / "first", local_datasets=[str(data)], max_steps=30, save_steps=4,
                     eval_steps=10, eval_generate_rows=4)
    with JobManager(Settings(home=tmp_path / "home")) as manager:
        first = manager.submit(cfg)
        wait_until(lambda: (manager.get(first.id).progress or {}).get("step", 0) >= 6, 400, "a few steps")
        manager.stop(first.id, save=True)
        stopped = wait_end(manager, first.id)
        assert stopped.status is S.stopped, stopped.error
        record = tmp_path / "first" / HELD_OUT_FILE
        original = held(tmp_path / "first")
        assert len(original) == 16
        assert stopped.result and stopped.result["held_out"] == {"file": str(record), "rows": 16, "seed": 7,
                                                                 "source": None}

        resumed = manager.resume(first.id)
        assert resumed.config.held_out_rows == str(record)
        done = wait_end(manager, resumed.id)
        assert done.status is S.completed, done.error
        assert done.output_dir and done.output_dir != str(tmp_path / "first")
        assert held(done.output_dir) == original  # the same rows: file, line and content
        assert done.result and done.result["held_out"]["source"] == str(record)
        # its evaluation is on exactly those rows
        rows = json.loads((Path(done.output_dir) / EVAL_ROWS_FILE).read_text())["rows"]
        assert [(r["file"], r["line"]) for r in rows] == [(e["file"], e["line"]) for e in original]
        assert done.result["evaluation"]["rows_file"] == str(Path(done.output_dir) / EVAL_ROWS_FILE)

        # a clone with another seed: the record, not the seed, decides
        clone_cfg = cfg.model_copy(update={"output_dir": str(tmp_path / "clone"), "random_seed": 1234,
                                           "max_steps": 2, "eval_generate_rows": 0, "save_steps": 0,
                                           "held_out_rows": str(Path(done.output_dir) / HELD_OUT_FILE)})
        clone = wait_end(manager, manager.submit(clone_cfg).id)
        assert clone.status is S.completed, clone.error
        assert held(tmp_path / "clone") == original

        # the data changed: one held-out row's reply is edited, and the clone says which row it lost
        line = original[3]["line"]
        lines = data.read_text().splitlines()
        lines[line - 1] = json.dumps({"prompt": f"What comes after {line - 1}?", "completion": " edited"})
        data.write_text("\n".join(lines) + "\n")
        again = wait_end(manager, manager.submit(clone_cfg.model_copy(
            update={"output_dir": str(tmp_path / "clone-2")})).id)
        assert again.status is S.failed
        assert again.error is not None and again.error.startswith(
            f"held_out_rows: the data changed since {Path(done.output_dir) / HELD_OUT_FILE} was written: 1 of its "
            f"16 held-out rows are not among this job's usable rows any more ({data} row {line};")
