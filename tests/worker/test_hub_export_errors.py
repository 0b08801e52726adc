"""Hub exports, offline: the hub's HTTP refusals are named for what they are (token refused, hub fault), not
"unreachable"; the model card never holds a local path; repository names follow the hub's rule."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import huggingface_hub
import pytest
from huggingface_hub.errors import HfHubHTTPError
from pydantic import ValidationError

from tunestudio.export_config import ExportConfig, ExportOptions
from tunestudio.worker.errors import UserError
from tunestudio.worker.export import hub as export_hub

from ..helpers.channel import ListChannel

TOKEN = "hf_NOT_A_REAL_TOKEN_1234567890"


def _config(repo: str = "me/tiny-export") -> ExportConfig:
    return ExportConfig(source_dir="/somewhere/jobs/a/output", target="hub", repo=repo, hf_token=TOKEN)


def _hub_answering(monkeypatch: pytest.MonkeyPatch, status: int | None, where: str = "create_repo") -> None:
    """HfApi whose `where` call fails: with an HTTP answer of `status`, or (None) a broken connection."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        if status is None:
            raise httpx2.ConnectError("connection reset by peer")
        request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
        raise HfHubHTTPError(f"{status} error", response=httpx2.Response(status, request=request),
                             server_message="the hub's own words")

    class FakeApi:
        def __init__(self, **kwargs: Any) -> None:
            pass

        def create_repo(self, repo_id: str, **kwargs: Any) -> Any:
            if where == "create_repo":
                fail()
            return SimpleNamespace(repo_id=repo_id, __str__=lambda self: repo_id)

        def upload_folder(self, **kwargs: Any) -> None:
            fail()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)


def _failure(tmp_path: Path) -> str:
    with pytest.raises(UserError) as caught:
        export_hub._upload(_config(), tmp_path, ListChannel())
    message = str(caught.value)
    assert TOKEN not in message
    return message


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_is_said_to_be_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    _hub_answering(monkeypatch, status)
    message = _failure(tmp_path)
    assert message.startswith(f"the hub refused the token: {status}") and "unreachable" not in message
    assert "write access" in message and "me/tiny-export" in message


@pytest.mark.parametrize("status", [500, 503])
def test_a_hub_fault_is_the_hubs_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    _hub_answering(monkeypatch, status, where="upload_folder")
    message = _failure(tmp_path)
    assert message.startswith(f"the hub answered {status}") and "unreachable" not in message


def test_other_refusals_name_the_status_and_only_a_broken_connection_is_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hub_answering(monkeypatch, 409)
    message = _failure(tmp_path)
    assert "HTTP 409" in message and "the hub's own words" in message and "unreachable" not in message
    _hub_answering(monkeypatch, None)
    assert _failure(tmp_path).startswith("hub unreachable")


def _source(base_model: str | None, model_name: str, tmp_path: Path) -> Any:
    job = {"model_name": model_name, "training_type": "lora", "local_datasets": [str(tmp_path / "data.jsonl")],
           "output_dir": str(tmp_path / "out")}
    return SimpleNamespace(path=tmp_path / "out", adapter=base_model is not None, base_model=base_model,
                           job_config=job)


def test_the_model_card_names_a_local_base_by_its_folder_only(tmp_path: Path) -> None:
    local = str(tmp_path / "models" / "my-base")
    card = export_hub.model_card(_source(local, local, tmp_path), _config())
    assert str(tmp_path) not in card and "/models/" not in card
    assert "my-base" in card and "base_model:" not in card  # the hub's metadata takes hub ids only
    full = export_hub.model_card(_source(None, local, tmp_path), _config())  # a full fine-tune of a local model
    assert str(tmp_path) not in full and "my-base" in full
    on_disk = _source(local, local, tmp_path)
    on_disk.job_config["hf_dataset"] = str(tmp_path / "sets" / "my-set")  # hf_dataset may name a local folder
    card = export_hub.model_card(on_disk, _config())
    assert str(tmp_path) not in card and "`my-set`" in card
    hub_card = export_hub.model_card(_source("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B", tmp_path), _config())
    assert "base_model: Qwen/Qwen2.5-0.5B" in hub_card and "`Qwen/Qwen2.5-0.5B`" in hub_card


@pytest.mark.parametrize("repo", ["../x", "me/../x", "..", "me/.x", "me/x.", "-x", "me/x-", "a--b", "a..b",
                                  "me/x y", "me/x/y", "/x", "x/", "me/", "me/x.git", "é/x", "x" * 97,
                                  "me\\x"])
def test_a_repository_name_follows_the_hubs_rule(repo: str) -> None:
    with pytest.raises(ValidationError, match="repo"):
        ExportOptions(target="hub", repo=repo)


@pytest.mark.parametrize("repo", ["x", "me/tiny-export", "Org_1/Model.v2", "a/b", "1/2", "x" * 96])
def test_good_repository_names_are_taken(repo: str) -> None:
    assert ExportOptions(target="hub", repo=repo).repo == repo
