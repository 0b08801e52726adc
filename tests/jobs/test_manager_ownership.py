"""A job owns only what it made (issue 30): what submit refuses, what delete removes, exports beside sources."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tunestudio import ownership
from tunestudio.export_config import ExportOptions
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.models import JobConflict
from tunestudio.jobs.status import JobStatus
from tunestudio.paths import PathRefused
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from ..helpers import fake_workers
from ..helpers.jobs import DATA, job_config
from ..helpers.wait import wait_until

S = JobStatus


def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", prewarm=False)


def _end(manager: JobManager, job_id: str) -> JobStatus:
    wait_until(lambda: manager.get(job_id).status.is_terminal, 30, f"job {job_id} to end")
    return manager.get(job_id).status


def test_a_folder_holding_the_users_files_is_refused_and_never_deleted(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        with pytest.raises(PathRefused, match="did not write") as info:
            manager.submit(job_config("org/fake", user))
        assert info.value.field == "output_dir" and manager.count() == 0
    # The folder fills between the submit and the start: the job fails at start and records nothing as its own.
    late = tmp_path / "late"
    manager = JobManager(settings(tmp_path), worker_target=fake_workers.writes_output)
    job = manager.submit(job_config("org/fake", late))
    late.mkdir()
    (late / "notes.txt").write_text("the user's")
    manager.start()
    try:
        assert _end(manager, job.id) is S.failed
        assert "output_dir" in manager.get(job.id).message
        manager.delete(job.id, delete_artifacts=True)
        assert sorted(p.name for p in late.iterdir()) == ["notes.txt"]
    finally:
        manager.close()


def test_delete_removes_what_the_job_wrote_and_not_what_came_later(tmp_path: Path) -> None:
    found = tmp_path / "found"
    found.mkdir()  # an empty folder the user made for the job
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        made = manager.submit(job_config("org/fake", tmp_path / "made" / "out"))
        used = manager.submit(job_config("org/fake", found))
        assert _end(manager, made.id) is S.completed and _end(manager, used.id) is S.completed
        (found / "later.txt").write_text("added after the job")
        manager.delete(made.id, delete_artifacts=True)
        manager.delete(used.id, delete_artifacts=True)
        assert not (tmp_path / "made").exists()  # created by the job, parents too
        assert sorted(p.name for p in found.iterdir()) == ["later.txt"]
        assert not (tmp_path / "home" / "jobs" / made.id).exists()


def test_a_job_never_writes_into_its_own_inputs(tmp_path: Path, tiny_model: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((DATA / "alpaca.jsonl").read_text())
    rewards = tmp_path / "code"
    rewards.mkdir()
    (rewards / "r.py").write_text("def f(**kw):\n    return [0.0]\n")
    manager = JobManager(settings(tmp_path), worker_target=fake_workers.instant)  # not started: nothing runs
    try:
        train = [str(data / "train.jsonl")]
        cases = [  # (model, output_dir, other fields, the input it clashes with)
            (model, model, {"training_type": "full"}, "model_name"),  # the case
            (model, model / "out", {}, "model_name"),
            (model, tmp_path, {}, "model_name"),  # holds the model folder
            (tiny_model, data, {"local_datasets": train}, "local_datasets"),
            (tiny_model, data, {"eval_split": train[0]}, "eval_split"),
            (tiny_model, rewards, {"method": "grpo", "local_datasets": [str(DATA / "prompts.jsonl")],
                                   "reward_functions": [f"{rewards / 'r.py'}:f"]}, "reward_functions"),
        ]
        for model_name, output_dir, fields, other in cases:
            with pytest.raises(PathRefused) as info:
                manager.submit(job_config(str(model_name), output_dir, **fields))
            assert info.value.fields == ["output_dir", other], (output_dir, fields)
        checkpoint = tmp_path / "old" / "checkpoint-3"
        checkpoint.mkdir(parents=True)
        with pytest.raises(PathRefused) as info:
            manager.submit(job_config(str(tiny_model), tmp_path / "old", resume_from_checkpoint=str(checkpoint)))
        assert info.value.fields == ["output_dir", "resume_from_checkpoint"]
        # beside the data is fine; the data directory's cache/ is not
        manager.submit(job_config(str(tiny_model), data.parent / "outputs",
                                  local_datasets=[str(data / "train.jsonl")]))
        with pytest.raises(PathRefused, match="cache/"):
            manager.submit(job_config(str(tiny_model), tmp_path / "home" / "cache" / "x"))
    finally:
        manager.close()


def test_exports_and_their_source_delete_independently(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        source = manager.submit(job_config("org/fake", tmp_path / "run"))
        assert _end(manager, source.id) is S.completed
        merged = manager.export(source.id, ExportOptions(target="merged"))
        assert _end(manager, merged.id) is S.completed
        exports = tmp_path / "run" / "exports"
        assert (exports / "merged-fp32" / "weights.bin").is_file()
        manager.delete(merged.id, delete_artifacts=True)  # the source exists and refers to a folder around it
        assert not exports.exists() and (tmp_path / "run" / "weights.bin").is_file()

        gguf = manager.export(source.id, ExportOptions(target="gguf-lora"))
        hub = manager.export(source.id, ExportOptions(target="hub", repo="me/x"))
        assert _end(manager, gguf.id) is S.completed and _end(manager, hub.id) is S.failed
        with pytest.raises(JobConflict) as info:  # the failed hub export wrote nothing: it is not named
            manager.delete(source.id, delete_artifacts=True)
        assert info.value.exports == [gguf.id]
        assert (exports / "gguf-lora-f16" / "weights.bin").is_file()
        manager.delete(source.id, delete_artifacts=True, delete_exports=True)
        assert not (tmp_path / "run").exists()
        assert {job.id for job in manager.list()} == {hub.id}
        manager.delete(hub.id, delete_artifacts=True)


def test_an_export_into_a_users_folder_is_refused_and_never_deleted(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "photo.jpg").write_bytes(b"\xff\xd8")
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        source = manager.submit(job_config("org/fake", tmp_path / "run"))
        assert _end(manager, source.id) is S.completed
        with pytest.raises(PathRefused, match="did not write"):
            manager.export(source.id, ExportOptions(target="merged", output_dir=str(user)))
        with pytest.raises(PathRefused) as info:  # the checkpoint it exports
            manager.export(source.id, ExportOptions(target="merged", checkpoint="checkpoint-1",
                                                    output_dir=str(tmp_path / "run" / "checkpoint-1" / "x")))
        assert info.value.fields == ["output_dir", "checkpoint"]
        with pytest.raises(PathRefused, match="no such folder"):
            manager.export(source.id, ExportOptions(target="merged", checkpoint="checkpoint-9"))
        assert [p.name for p in user.iterdir()] == ["photo.jpg"]
        assert ownership.owns(tmp_path / "run", source.id)


def test_ranks_beyond_the_machine_and_keys_of_another_request_are_refused(tmp_path: Path) -> None:
    from tunestudio.process import gpu_count, usable_cores

    too_many = max(usable_cores(), gpu_count()) + 1
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        with pytest.raises(PathRefused, match="ranks on a machine") as info:
            manager.submit(job_config("org/fake", tmp_path / "big", num_processes=too_many))
        assert info.value.field == "num_processes" and manager.count() == 0
        source = manager.submit(job_config("org/fake", tmp_path / "run"), request_id="key-1")
        assert manager.submit(job_config("org/fake", tmp_path / "run"), request_id="key-1").id == source.id
        assert _end(manager, source.id) is S.completed
        with pytest.raises(JobConflict, match="used for another request"):  # a training job's key, on an export
            manager.export(source.id, ExportOptions(target="merged"), request_id="key-1")
        export = manager.export(source.id, ExportOptions(target="merged"), request_id="key-2")
        assert manager.export(source.id, ExportOptions(target="merged"), request_id="key-2").id == export.id
        with pytest.raises(JobConflict, match="used for another request"):
            manager.submit(job_config("org/fake", tmp_path / "other"), request_id="key-2")
        _end(manager, export.id)
    ray = Settings(home=tmp_path / "home", prewarm=False, executor="ray")
    manager = JobManager(ray, worker_target=fake_workers.instant)  # not started: a cluster places its own ranks
    try:
        manager.submit(job_config("org/fake", tmp_path / "cluster", num_processes=too_many))
    finally:
        manager.close()


def test_an_export_never_writes_into_its_sources_inputs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((DATA / "alpaca.jsonl").read_text())
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "val.jsonl").write_text((DATA / "alpaca.jsonl").read_text())
    hub = tmp_path / "hub"  # a dataset saved with save_to_disk or a folder of files: hf_dataset as a local path
    hub.mkdir()
    (hub / "train.jsonl").write_text((DATA / "alpaca.jsonl").read_text())
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        local = manager.submit(job_config("org/fake", tmp_path / "run", local_datasets=[str(data)],
                                          eval_split=str(evals / "val.jsonl")))
        remote = manager.submit(job_config("org/fake", tmp_path / "run2", local_datasets=[], hf_dataset=str(hub)))
        assert _end(manager, local.id) is S.completed and _end(manager, remote.id) is S.completed
        cases = [  # (source, output_dir, the input it clashes with)
            (local, data / "exported", "local_datasets"),  # inside the dataset folder: new, so takeable
            (local, data, "local_datasets"),
            (local, evals, "eval_split"),  # holds the eval file
            (remote, hub / "exported", "hf_dataset"),
        ]
        for source, output_dir, field in cases:
            with pytest.raises(PathRefused) as info:
                manager.export(source.id, ExportOptions(target="merged", output_dir=str(output_dir)))
            assert info.value.fields == ["output_dir", field], (output_dir, str(info.value))
        assert not (data / "exported").exists() and not (hub / "exported").exists()
        assert sorted(p.name for p in data.iterdir()) == ["train.jsonl"]


def test_an_export_never_writes_into_its_sources_model_folder(tmp_path: Path, tiny_model: Path) -> None:
    model = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_model, model)
    with JobManager(settings(tmp_path), worker_target=fake_workers.writes_output) as manager:
        source = manager.submit(job_config(str(model), tmp_path / "run"))
        assert _end(manager, source.id) is S.completed
        for output_dir in (model / "exported", model, tmp_path / "models"):  # inside, the folder, around it
            with pytest.raises(PathRefused) as info:
                manager.export(source.id, ExportOptions(target="merged", output_dir=str(output_dir)))
            assert info.value.fields == ["output_dir", "model_name"], output_dir
        assert sorted(p.name for p in model.iterdir()) == sorted(p.name for p in tiny_model.iterdir())


def test_a_job_never_writes_into_its_dataset_folder_hub_folder_or_around_its_held_out_record(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((DATA / "alpaca.jsonl").read_text())
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "train.jsonl").write_text((DATA / "alpaca.jsonl").read_text())
    record = tmp_path / "earlier" / "held_out.json"
    record.parent.mkdir()
    record.write_text("{}")
    manager = JobManager(settings(tmp_path), worker_target=fake_workers.instant)  # not started: nothing runs
    try:
        cases = [  # (output_dir, other fields, the input it clashes with)
            (data / "out", {"local_datasets": [str(data)]}, "local_datasets"),  # a dataset given as a folder
            (hub / "out", {"local_datasets": [], "hf_dataset": str(hub)}, "hf_dataset"),  # a local hub dataset
            (record.parent, {"eval_steps": 5, "held_out_rows": str(record)}, "held_out_rows"),
            (tmp_path, {"eval_steps": 5, "held_out_rows": str(record)}, "held_out_rows"),  # holds it deeper
        ]
        for output_dir, fields, other in cases:
            with pytest.raises(PathRefused) as info:
                manager.submit(job_config("org/fake", output_dir, **fields))
            assert info.value.fields == ["output_dir", other], (output_dir, str(info.value))
        assert manager.count() == 0 and not (data / "out").exists() and not (hub / "out").exists()
    finally:
        manager.close()


def killed_while_staging(args: WorkerArgs) -> None:
    """A training job writes as fake_workers.writes_output; an export stages half a file and is killed (SIGKILL)."""
    if args.kind == "train":
        fake_workers.writes_output(args)
        return
    child.become_worker(args)
    (ownership.stage(Path(args.public_config["output_dir"])) / "model.gguf").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_exports_staging_folder_goes_and_never_one_the_user_made(tmp_path: Path) -> None:
    with JobManager(settings(tmp_path), worker_target=killed_while_staging) as manager:
        source = manager.submit(job_config("org/fake", tmp_path / "run"))
        assert _end(manager, source.id) is S.completed
        killed = manager.export(source.id, ExportOptions(target="gguf-lora"))
        assert _end(manager, killed.id) is S.failed
        out = Path(manager.get(killed.id).output_dir or "")
        assert not ownership.staging(out).exists()  # removed when it ended, with the folders it made
        assert not (tmp_path / "run" / "exports").exists()
        (ownership.stage(out) / "model.gguf").write_bytes(b"half")  # one a crash of the studio itself left
        manager.delete(killed.id, delete_artifacts=True)
        assert not ownership.staging(out).exists()

        other = manager.export(source.id, ExportOptions(target="merged"))
        assert _end(manager, other.id) is S.failed
        theirs = ownership.staging(Path(manager.get(other.id).output_dir or ""))
        theirs.mkdir(parents=True)  # a folder of that name with no marker of ours
        (theirs / "draft.txt").write_text("the user's")
        manager.delete(other.id, delete_artifacts=True)
        assert (theirs / "draft.txt").read_text() == "the user's"
