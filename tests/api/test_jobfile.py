"""Job files over HTTP: a job's settings and the form's as the YAML `tunestudio train` reads, as a shell command
that runs it, and a pasted job file read back, against a real server. The copied YAML is loaded by the CLI's own
reader (`load_config`, then `paths.resolve`, as `tunestudio train` does) and must give the same config."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tunestudio.api.jobfile import JOB_OWN
from tunestudio.config import JobConfig, load_config
from tunestudio.jobs.models import Job
from tunestudio.paths import resolve
from tunestudio.settings import Settings

from ..helpers.chat import ChatHome
from ..helpers.jobs import DATA
from ..helpers.server import running_server

pytestmark = pytest.mark.timeout(900)  # the first chat-job module of a session waits for its training
SECRET = "hf_DoNotLeakThisToken123"


@pytest.fixture(scope="module")
def home(chat_home: ChatHome) -> Path:
    return chat_home.home


@pytest.fixture(scope="module")
def job(chat_home: ChatHome) -> Job:
    return chat_home.job


@pytest.fixture(scope="module")
def server(job: Job, home: Path, tiny_model: Path) -> Iterator[str]:
    with running_server(Settings(home=home, dataset_roots=[DATA], model_roots=[tiny_model.parent])) as url:
        yield url


def stored(job: Job) -> dict:
    """The job's config as JSON data (a dict, or a typed config, as the job holds it)."""
    return JobConfig.model_validate(job.config).public_dict()


def run_like_the_cli(text: str, folder: Path) -> JobConfig:
    """What `tunestudio train FILE` makes of the text saved to FILE."""
    path = folder / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return resolve(load_config(path))


def test_a_jobs_file_is_what_train_reads_as_its_config_less_its_own_folder(server: str, job: Job,
                                                                          tmp_path: Path) -> None:
    answer = httpx.get(f"{server}/api/jobs/{job.id}/jobfile", timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["yaml"].startswith(f"# job {job.id}")
    fields = yaml.safe_load(body["yaml"])
    assert fields["model_name"] == stored(job)["model_name"]
    assert not set(JOB_OWN) & set(fields)  # a run of it writes a folder of its own, never over this job's
    loaded = run_like_the_cli(body["yaml"], tmp_path)
    expected = JobConfig.model_validate({k: v for k, v in stored(job).items() if k not in JOB_OWN})
    assert loaded.public_dict() == expected.public_dict()
    # only what differs from JobConfig's defaults is written (the file reads as the user's choices)
    assert len(fields) < len(expected.public_dict()) / 2


def test_the_command_is_a_shell_line_that_writes_the_file_and_runs_train(server: str, job: Job, home: Path,
                                                                         tmp_path: Path) -> None:
    body = httpx.get(f"{server}/api/jobs/{job.id}/jobfile", timeout=30).json()
    # The server's own `tunestudio` by its absolute path: a shell without the venv activated has none on its PATH
    # (issue 38, finding 15).
    cli = Path(sys.executable).absolute().with_name("tunestudio")
    assert cli.is_file() and os.access(cli, os.X_OK)
    assert body["command"].rstrip().endswith(f"{shlex.quote(str(cli))} train {body['filename']}")
    command = body["command"].replace(shlex.quote(str(cli)), "tunestudio")
    assert f"TUNESTUDIO_HOME={home.resolve()}" in body["command"] or f"TUNESTUDIO_HOME='{home.resolve()}'" \
        in body["command"]
    # bash runs it as pasted, with `tunestudio` standing for a check that reads the file as the CLI does
    check = ("import sys, os; from tunestudio.config import load_config; c = load_config(sys.argv[1]); "
             "print(os.environ['TUNESTUDIO_HOME']); print(c.model_name)")
    stub = f'tunestudio() {{ shift; "{sys.executable}" -c "{check}" "$1"; }}\n'
    done = subprocess.run([shutil.which("bash") or "/bin/bash", "-c", stub + command], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(home.resolve()), stored(job)["model_name"]]
    assert (tmp_path / body["filename"]).read_text() == body["yaml"]
    # pasted again where that file now is (the user's, maybe edited): it is not overwritten, and nothing runs
    (tmp_path / body["filename"]).write_text("mine\n")
    again = subprocess.run([shutil.which("bash") or "/bin/bash", "-c", stub + command], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and again.stdout == "" and "exist" in again.stderr
    assert (tmp_path / body["filename"]).read_text() == "mine\n"


def test_the_forms_config_becomes_a_file_without_its_secret(server: str, tiny_model: Path, tmp_path: Path) -> None:
    config = {"model_name": str(tiny_model), "local_datasets": [str(DATA / "alpaca.jsonl")], "method": "sft",
              "learning_rate": 0.003, "max_steps": 12, "hf_token": SECRET, "sample_prompts": ["Say: 'hi' #1"],
              "eval_steps": 10}
    answer = httpx.post(f"{server}/api/jobfile", json=config, params={"name": " lr 3e-3, cow "}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert SECRET not in answer.text and "hf_token" not in body["yaml"]
    loaded = run_like_the_cli(body["yaml"], tmp_path)
    assert loaded.public_dict() == JobConfig.model_validate(config).public_dict()
    assert loaded.secrets() == {}
    # The form's integer stays one, and the job's name is a field of the file (issue 38, finding 16): pasted
    # back, the file gives the same config and the name.
    assert "eval_steps: 10\n" in body["yaml"] and yaml.safe_load(body["yaml"])["name"] == "lr 3e-3, cow"
    pasted = httpx.post(f"{server}/api/jobfile/parse", json={"text": body["yaml"]}, timeout=30).json()
    assert pasted["name"] == "lr 3e-3, cow"
    assert pasted["config"] == JobConfig.model_validate(config).public_dict()


def test_the_forms_bad_field_or_path_is_named(server: str, tiny_model: Path) -> None:
    bad = httpx.post(f"{server}/api/jobfile", json={"model_name": str(tiny_model), "local_datasets":
                                                    [str(DATA / "alpaca.jsonl")], "learning_rate": -1}, timeout=30)
    assert bad.status_code == 422
    assert [e["field"] for e in bad.json()["detail"]["errors"]] == ["learning_rate"]
    outside = httpx.post(f"{server}/api/jobfile", json={"model_name": str(tiny_model),
                                                        "local_datasets": ["/etc/passwd"]}, timeout=30)
    assert outside.status_code == 422
    assert outside.json()["detail"]["errors"][0]["field"] == "local_datasets"


def test_a_pasted_file_gives_every_field_and_names_each_bad_one(server: str, tiny_model: Path) -> None:
    text = (f"model_name: {tiny_model}\nlocal_datasets: [{DATA / 'alpaca.jsonl'}]\nmethod: dpo\nbeta: 0.2\n"
            f"hf_token: {SECRET}\n")
    answer = httpx.post(f"{server}/api/jobfile/parse", json={"text": text}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert SECRET not in answer.text
    parsed = answer.json()
    assert parsed["secrets_left_out"] == ["hf_token"]
    assert parsed["config"]["method"] == "dpo" and parsed["config"]["beta"] == 0.2
    assert "learning_rate" in parsed["config"]  # every field: the form fills them all

    bad = httpx.post(f"{server}/api/jobfile/parse", json={"text": f"model_name: {tiny_model}\n"
                     f"local_datasets: [a.jsonl]\nlearning_rate: lots\nbatch_sise: 4\n"}, timeout=30)
    assert bad.status_code == 422
    said = {e["field"]: e["message"] for e in bad.json()["detail"]["errors"]}
    assert {"learning_rate", "batch_sise"} <= set(said)
    assert "did you mean `batch_size`?" in said["batch_sise"]  # what the form's paste shows (issue 38, 14)
    for text in ("model_name: [unclosed\n", "- a list\n"):
        broken = httpx.post(f"{server}/api/jobfile/parse", json={"text": text}, timeout=30)
        assert broken.status_code == 422 and broken.json()["detail"]["message"]


def test_an_unknown_job_has_no_job_file(server: str) -> None:
    assert httpx.get(f"{server}/api/jobs/nope/jobfile", timeout=30).status_code == 404
