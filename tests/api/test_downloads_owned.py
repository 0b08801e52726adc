"""A job lists and serves only what it wrote (issue 30): never a file the user put in its folder, nothing of a
folder it never took; and a job that holds no folder (refused at start, or one that wrote nothing and gave it
back) blocks no later job. Scripted workers behind a real server."""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path
from typing import Any

import httpx

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from ..helpers.jobs import DATA, job_config
from ..helpers.server import running_server
from ..helpers.wait import wait_until

JSON = {"Content-Type": "application/json"}
QUIET_STEPS = 7  # a training job of this many steps writes nothing


def writes_an_adapter(args: WorkerArgs) -> None:
    """A training job writes an adapter (none when it has QUIET_STEPS steps), an export `model.gguf`; both
    complete."""
    from tunestudio.worker.channel import QueueChannel

    child.become_worker(args)
    channel = QueueChannel(args.events, args.commands)
    channel.phase("training" if args.kind == "train" else "saving")
    output = Path(args.public_config["output_dir"])
    if args.kind == "export":
        (output / "model.gguf").write_bytes(b"gguf")
    elif args.public_config.get("max_steps") != QUIET_STEPS:
        (output / "adapter_config.json").write_text("{}")
        (output / "adapter_model.safetensors").write_bytes(b"weights")
    channel.completed(output_dir=str(output), global_step=1)
    channel.close()
    sys.exit(0)


def settings(tmp_path: Path) -> Settings:
    # spawned: a fake job's spawn imports only tunestudio, and a cold forkserver would make the first job wait for
    # its whole preload within `ended`'s bound
    return Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path], prewarm=False)


def body(output_dir: Path, **overrides: Any) -> dict[str, Any]:
    cfg = job_config("org/fake", output_dir, **overrides).public_dict()
    return {k: v for k, v in cfg.items() if v is not None}


def ended(client: httpx.Client, job_id: str) -> dict[str, Any]:
    return wait_until(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["is_terminal"] and j, 30,
                      f"job {job_id} to end")


def submitted(client: httpx.Client, output_dir: Path, **overrides: Any) -> dict[str, Any]:
    created = client.post("/api/jobs", json=body(output_dir, **overrides), headers=JSON)
    assert created.status_code == 201, created.text
    return ended(client, created.json()["id"])


def names(client: httpx.Client, job_id: str) -> set[str]:
    return {f["name"] for f in client.get(f"/api/jobs/{job_id}/files").json()}


def test_a_job_lists_and_serves_only_what_it_wrote(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=writes_an_adapter)
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        run = tmp_path / "run"
        source = submitted(client, run)
        assert source["status"] == "completed"
        export = client.post(f"/api/jobs/{source['id']}/exports", json={"target": "gguf-lora"}, headers=JSON)
        assert export.status_code == 201, export.text
        export = ended(client, export.json()["id"])
        assert export["status"] == "completed"
        # The user puts files of their own into both folders afterwards.
        (run / "notes.txt").write_text("the user's")
        (run / "mine").mkdir()
        (run / "mine" / "plan.txt").write_text("the user's")
        (Path(export["output_dir"]) / "readme-mine.txt").write_text("the user's")

        adapter = {"adapter_config.json", "adapter_model.safetensors"}
        assert names(client, source["id"]) == adapter  # not the user's, nor the export's files under exports/
        # The job's artefacts are the same (issue 38, finding 18): what it wrote, not what came later.
        assert {a["name"] for a in client.get(f"/api/jobs/{source['id']}").json()["artefacts"]} == adapter
        assert [a["name"] for a in client.get(f"/api/jobs/{export['id']}").json()["artefacts"]] == ["model.gguf"]
        found = client.get(f"/api/jobs/{source['id']}/downloads").json()
        assert {f["name"] for f in found["files"]} == adapter
        assert {f["name"] for f in found["weights"]["files"]} == adapter
        assert [{f["name"] for f in e["files"]} for e in found["exports"]] == [{"model.gguf"}]
        zipped = client.get(f"/api/jobs/{source['id']}/download")
        assert set(zipfile.ZipFile(io.BytesIO(zipped.content)).namelist()) == adapter
        assert names(client, export["id"]) == {"model.gguf"}
        for job_id, name in ((source["id"], "notes.txt"), (source["id"], "mine/plan.txt"),
                             (export["id"], "readme-mine.txt")):
            answer = client.get(f"/api/jobs/{job_id}/files/{name}")
            assert answer.status_code == 404 and b"the user's" not in answer.content, name
    manager.close()


def test_a_job_refused_at_start_claims_nothing_and_blocks_nothing(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=writes_an_adapter)
    late = tmp_path / "late"
    refused = manager.submit(job_config("org/fake", late))  # queued: its folder is still free
    late.mkdir()
    (late / "notes.txt").write_text("the user's")  # the folder fills before the job starts
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        job = ended(client, refused.id)
        assert job["status"] == "failed" and "output_dir" in job["message"]
        assert job["output_dir"] is None and job["artefacts"] == []  # it never took the folder
        assert names(client, refused.id) == set()
        found = client.get(f"/api/jobs/{refused.id}/downloads").json()
        assert found["files"] == [] and found["weights"] is None
        assert client.get(f"/api/jobs/{refused.id}/files/notes.txt").status_code == 404

        (late / "notes.txt").unlink()  # the user empties it: a later job takes it and owns what it writes
        later = submitted(client, late)
        assert later["status"] == "completed" and names(client, later["id"]) == {"adapter_config.json",
                                                                              "adapter_model.safetensors"}
        gone = client.delete(f"/api/jobs/{later['id']}", params={"delete_artifacts": True}, headers=JSON)
        assert gone.status_code == 204, gone.text
        assert late.is_dir() and not any(late.iterdir())  # found empty: it stays, empty
    manager.close()


def test_a_job_that_wrote_nothing_gives_its_folder_back_and_blocks_nothing(tmp_path: Path) -> None:
    quick = settings(tmp_path)
    manager = JobManager(quick, worker_target=writes_an_adapter)
    shared = tmp_path / "shared"
    shared.mkdir()  # the user's empty folder
    with running_server(quick, manager) as url, httpx.Client(base_url=url, timeout=30) as client:
        quiet = submitted(client, shared, max_steps=QUIET_STEPS)
        assert quiet["status"] == "completed" and quiet["artefacts"] == []
        inner = submitted(client, shared / "inner")  # inside the folder the quiet job gave back
        assert inner["status"] == "completed"
        assert client.delete(f"/api/jobs/{inner['id']}", params={"delete_artifacts": True},
                             headers=JSON).status_code == 204
        again = submitted(client, shared)
        assert again["status"] == "completed"
        gone = client.delete(f"/api/jobs/{again['id']}", params={"delete_artifacts": True}, headers=JSON)
        assert gone.status_code == 204, gone.text  # the quiet job refers to a folder it no longer holds
        assert shared.is_dir() and not any(shared.iterdir())
        assert client.get(f"/api/jobs/{quiet['id']}").status_code == 200
    manager.close()
