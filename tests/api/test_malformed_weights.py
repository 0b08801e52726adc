"""A model folder whose model.safetensors is truncated or garbage: listed with the reason, the other models still
listed, and the estimate a 422 that says why (both were 500s)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app, modelinfo
from tunestudio.jobs.manager import JobManager
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.jobs import DATA

BASE = "http://127.0.0.1:8765"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


def _header(header: object) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


GOOD = _header({"embed": {"dtype": "F32", "shape": [100, 64], "data_offsets": [0, 0]}})
# Each of these once raised past the reader's except clause, or was silently taken as "no count".
BAD = {
    "list-header": _header([1, 2]),  # AttributeError: a list has no .items()
    "tensor-not-a-dict": _header({"embed": 5}),  # TypeError
    "shape-of-dicts": _header({"embed": {"dtype": "F32", "shape": [{}], "data_offsets": [0, 0]}}),  # TypeError
    "absurd-shape": _header({"embed": {"dtype": "F32", "shape": [10**200, 10**200], "data_offsets": [0, 0]}}),
    "truncated-data": _header({"embed": {"dtype": "F32", "shape": [100, 64], "data_offsets": [0, 25600]}}),
    "truncated-header": GOOD[:20],
    "garbage": b"\xff" * 64,
    "short": b"abc",
}


def _model(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA], model_roots=[tmp_path / "models"],
                        prewarm=False)
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        yield client
    manager.close()


def test_a_malformed_safetensors_file_is_listed_with_its_reason(client: TestClient, tmp_path: Path) -> None:
    _model(tmp_path / "models" / "good", GOOD)
    for name, weights in BAD.items():
        _model(tmp_path / "models" / name, weights)
    listed = client.get("/api/models")
    assert listed.status_code == 200, listed.text
    # the models under this test's folder (the embedded tiny model is listed too, wherever it is built)
    local = {m["name"]: m for m in listed.json()["local"] if m["path"].startswith(str(tmp_path))}
    assert local["good"]["parameters"] == 6400 and local["good"]["error"] is None
    assert set(local) == {"good", *BAD}
    for name in BAD:
        assert local[name]["parameters"] is None, name
        assert "model.safetensors" in local[name]["error"] and "Traceback" not in local[name]["error"], name
    assert "truncated" in local["truncated-data"]["error"]


def test_the_estimate_of_a_malformed_model_is_a_422_that_says_why(client: TestClient, tmp_path: Path) -> None:
    for name, weights in BAD.items():
        folder = _model(tmp_path / "models" / name, weights)
        got = client.post("/api/models/estimate", json={"model_name": str(folder)})
        assert got.status_code == 422, (name, got.status_code, got.text)
        detail = got.json()["detail"]
        assert detail["field"] == "model_name" and "model.safetensors" in detail["message"], name
        assert "Traceback" not in got.text
    good = _model(tmp_path / "models" / "good", GOOD)
    assert client.post("/api/models/estimate", json={"model_name": str(good)}).json()["parameters"] == 6400


def test_the_reader_names_the_file_and_the_fault(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", BAD["list-header"])
    with pytest.raises(modelinfo.BadWeights, match=r"model\.safetensors: .*header"):
        modelinfo.safetensors_parameters(folder)
    assert modelinfo.safetensors_parameters(tmp_path) is None  # no safetensors file at all: no count, no fault
