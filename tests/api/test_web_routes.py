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
    assert fields["gradient_checkpointing"]["choices"] == [False, True, "auto", "unsloth"]
    assert fields["gradient_checkpointing"]["default"] == "auto"
    assert fields["padding_free"]["choices"] == [False, True, "auto"]
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


@pytest.mark.timeout(180)
def test_preview_reads_each_file_once_and_only_its_start_and_cuts_long_cells(client: TestClient,
                                                                            tmp_path: Path) -> None:
    from tunestudio.api import preview

    big = tmp_path / "big.jsonl"
    with big.open("w") as fh:  # ~3 MB of rows, the first with a 100k-character answer
        fh.write(json.dumps({"instruction": "long", "output": "x" * 100_000}) + "\n")
        for i in range(30_000):
            fh.write(json.dumps({"instruction": f"row {i}", "output": "y" * 80}) + "\n")
    got = client.post("/api/web/preview", json={"local_datasets": [str(big)] * 40, "rows": 2}).json()
    assert got["description"] == "1 file(s): big.jsonl"  # forty times the same file is one file
    assert got["partial"] is True and got["total_rows"] < 30_001  # only the first READ_BYTES were read
    assert got["total_rows"] <= preview.READ_BYTES // 100
    raw = got["rows"][0]["raw"]["output"]
    assert raw.startswith("x" * preview.CELL_CHARS) and raw.endswith("(98,000 more characters)")
    assert len(got["rows"][0]["converted"]["completion"][0]["content"]) < preview.CELL_CHARS + 40

    one_line = tmp_path / "one_line.jsonl"  # a single row bigger than what the preview reads
    one_line.write_text(json.dumps({"instruction": "i", "output": "z" * (preview.READ_BYTES * 2)}) + "\n")
    answer = client.post("/api/web/preview", json={"local_datasets": [str(one_line)], "format_type": "alpaca"}).json()
    assert "longer than the 1,000,000 bytes the preview reads" in answer["rows"][0]["problem"]

    whole = client.post("/api/web/preview", json={"local_datasets": [str(DATA / "alpaca.jsonl")]}).json()
    assert whole["partial"] is False and whole["total_rows"] == 400


def test_preview_runs_at_most_two_children_and_says_so_beyond(client: TestClient, monkeypatch) -> None:
    from tunestudio.api import preview

    monkeypatch.setattr(preview, "SLOT_WAIT_S", 0.2)
    assert preview.MAX_CHILDREN == 2
    held = [preview._slots.acquire(timeout=5) for _ in range(preview.MAX_CHILDREN)]  # two previews running
    try:
        assert all(held)
        busy = client.post("/api/web/preview", json={"local_datasets": [str(DATA / "alpaca.jsonl")]})
        assert busy.status_code == 429 and busy.json()["detail"]["code"] == "busy"
    finally:
        for _ in held:
            preview._slots.release()
