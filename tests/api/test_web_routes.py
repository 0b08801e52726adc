"""The web page's own routes (/api/web/*, /vendor) and its metric bookkeeping, without a browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import STATIC, create_app
from tunestudio.settings import Settings

from ..helpers.jobs import DATA


@pytest.fixture
def client(tmp_path: Path):
    settings = Settings(home=tmp_path / "home", dataset_roots=[DATA, tmp_path])
    # The app answers only to its own Host names; TestClient's default "testserver" is not one.
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        yield client


def test_defaults_offer_the_tiny_model_the_bundled_dataset_and_jobconfig_fields(client: TestClient) -> None:
    got = client.get("/api/web/defaults").json()
    assert got["model_name"].endswith("models/tiny-llama")
    assert got["dataset"] == str(DATA / "alpaca.jsonl")
    fields = {f["name"]: f for f in got["fields"]}
    assert (fields["batch_size"]["kind"], fields["batch_size"]["default"], fields["batch_size"]["minimum"]) == (
        "integer", 2, 1)
    assert fields["training_type"]["choices"] == ["lora", "qlora", "full"]
    assert fields["format_type"]["default"] == "auto"
    assert fields["gradient_checkpointing"]["choices"] == [False, True, "unsloth"]
    assert fields["hf_token"]["kind"] == "secret" and fields["hf_token"]["default"] is None
    assert fields["warmup_steps"]["nullable"] and fields["model_name"]["required"]


@pytest.mark.timeout(180)
def test_preview_reads_the_first_rows_as_the_detected_format_does(client: TestClient, tmp_path: Path) -> None:
    got = client.post("/api/web/preview", json={"local_datasets": [str(DATA / "alpaca.jsonl")], "rows": 2}).json()
    assert (got["format"], got["detected"], got["total_rows"], len(got["rows"])) == ("alpaca", True, 400, 2)
    first = got["rows"][0]
    assert first["raw"]["output"] == first["converted"]["completion"][0]["content"]

    chosen = client.post("/api/web/preview", json={"local_datasets": [str(DATA / "sharegpt.json")],
                                                   "format_type": "alpaca", "rows": 1}).json()
    assert chosen["format"] == "alpaca" and not chosen["detected"]
    assert "instruction" in chosen["rows"][0]["problem"]  # would be dropped, and the page says why

    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    assert "not a format tunestudio knows" in client.post("/api/web/preview",
                                                          json={"local_datasets": [str(odd)]}).json()["error"]


def test_preview_refuses_what_a_job_would_refuse(client: TestClient) -> None:
    outside = client.post("/api/web/preview", json={"local_datasets": ["/etc/hostname"]})
    assert outside.status_code == 422 and outside.json()["detail"]["code"] == "path_not_allowed"
    missing = client.post("/api/web/preview", json={"local_datasets": ["/nope/x.jsonl"]})
    assert missing.status_code == 422
    assert missing.json()["detail"]["errors"][0]["field"] == "local_datasets"
    hub = client.post("/api/web/preview", json={"hf_dataset": "tatsu-lab/alpaca"}).json()
    assert hub["rows"] == [] and "local files" in hub["unavailable"]


def test_page_and_vendored_uplot_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "/vendor/uplot/uPlot.iife.min.js" in page.text
    assert client.get("/vendor/uplot/uPlot.iife.min.js").status_code == 200
    assert client.get("/vendor/uplot/uPlot.min.css").status_code == 200
    assert client.get("/js/app.js").headers["content-type"].startswith("text/javascript")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_metric_series_drops_what_it_has_and_keeps_order() -> None:
    """The page's reload rule, in its own module: a record at or before the last step of its kind is dropped."""
    script = f"""
import {{MetricSeries}} from "{(STATIC / 'js' / 'metrics.js').as_uri()}";
const s = new MetricSeries();
const t = (step) => ({{step, loss: 1 / step, learning_rate: 0.1, grad_norm: 1}});
s.addAll([t(1), t(2), t(3), {{step: 2, eval_loss: 0.5}}]);
const dup = s.add(t(3)), old = s.add(t(2)), next = s.add(t(4)), ev = s.add({{step: 2, eval_loss: 0.4}});
console.log(JSON.stringify({{steps: s.lossSteps(), dup, old, next, ev, loss: s.lossData(),
                             lr: s.seriesData("learning_rate")}}));
"""
    proc = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["steps"] == [1, 2, 3, 4]
    assert (got["dup"], got["old"], got["next"], got["ev"]) == (False, False, True, False)
    xs, raw, avg, evals = got["loss"]
    assert xs == [1, 2, 3, 4] and evals == [None, 0.5, None, None] and raw[0] == 1 and len(avg) == 4
    assert got["lr"] == [[1, 2, 3, 4], [0.1] * 4]
