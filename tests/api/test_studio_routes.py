"""The studio's routes without a browser: a job's log, uploads, name and notes, what a job allows, the estimate."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunestudio.api import create_app, modelinfo
from tunestudio.jobs.manager import JobManager
from tunestudio.jobs.status import CANCELLABLE, STOPPABLE, JobStatus
from tunestudio.settings import Settings
from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from ..helpers import fake_workers
from ..helpers.jobs import DATA
from ..helpers.vision import FAMILIES
from ..helpers.wait import wait_until

S = JobStatus
BASE = "http://127.0.0.1:8765"  # the server's own origin: the guard answers only to it


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", dataset_roots=[DATA], model_roots=[tmp_path], prewarm=False,
                    max_upload_bytes=4096)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    manager = JobManager(settings, worker_target=fake_workers.instant)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        yield client
    manager.close()


def _finished_job(client: TestClient) -> dict:
    created = client.post("/api/jobs", json={"model_name": "org/model", "local_datasets": [str(DATA / "alpaca.jsonl")]})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "completed", 60, "the job to end")
    return client.get(f"/api/jobs/{job_id}").json()


def test_the_status_table_says_what_a_job_allows() -> None:
    # The page once kept its own copy of these and could not stop a saving job.
    assert S.saving in STOPPABLE and S.saving in CANCELLABLE and S.queued in STOPPABLE
    assert S.stopping not in STOPPABLE and S.stopping in CANCELLABLE
    assert not ({s for s in S if s.is_terminal} & (STOPPABLE | CANCELLABLE))


def test_a_finished_job_says_what_it_allows_and_takes_a_name(client: TestClient) -> None:
    job = _finished_job(client)
    assert (job["stoppable"], job["cancellable"], job["resumable"], job["deletable"]) == (False, False, False, True)
    renamed = client.patch(f"/api/jobs/{job['id']}", json={"name": "  baseline ", "notes": "lr 3e-3"}).json()
    assert (renamed["name"], renamed["notes"]) == ("baseline", "lr 3e-3")
    listed = client.get("/api/jobs").json()["items"][0]
    assert listed["name"] == "baseline"
    cleared = client.patch(f"/api/jobs/{job['id']}", json={"name": ""}).json()
    assert cleared["name"] is None and cleared["notes"] is None
    assert client.patch(f"/api/jobs/{job['id']}", json={"colour": "red"}).status_code == 422
    assert client.patch("/api/jobs/nope", json={"name": "x"}).status_code == 404


def test_the_log_route_reads_tails_and_ranges_whole_characters(client: TestClient, settings: Settings) -> None:
    job = _finished_job(client)
    log = settings.jobs_dir() / job["id"] / "worker.log"  # where the worker writes its output
    assert client.get(f"/api/jobs/{job['id']}/log").headers["x-log-exists"] == "false"
    text = "line one\nnaïve € line\n" + "x" * 50 + "\nlast line\n"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    size = len(text.encode())

    whole = client.get(f"/api/jobs/{job['id']}/log")
    assert whole.status_code == 200 and whole.text == text and whole.headers["x-log-size"] == str(size)
    tail = client.get(f"/api/jobs/{job['id']}/log", params={"tail": 10})
    assert tail.text == "last line\n" and int(tail.headers["x-log-end"]) == size
    # A part that would end inside "€" (3 bytes) stops before it; the next read from X-Log-End gets it whole.
    euro = text.encode().index("€".encode())
    part = client.get(f"/api/jobs/{job['id']}/log", params={"offset": 0, "length": euro + 1})
    assert part.text.endswith("naïve ") and int(part.headers["x-log-end"]) == euro
    rest = client.get(f"/api/jobs/{job['id']}/log", params={"offset": part.headers["x-log-end"]})
    assert part.text + rest.text == text
    ranged = client.get(f"/api/jobs/{job['id']}/log", headers={"Range": "bytes=0-3"})
    assert (ranged.status_code, ranged.text) == (206, "line")
    assert ranged.headers["content-range"] == f"bytes 0-3/{size}"
    assert client.get(f"/api/jobs/{job['id']}/log", headers={"Range": "lines=1"}).status_code == 416
    download = client.get(f"/api/jobs/{job['id']}/log", params={"download": True})
    assert download.text == text and "attachment" in download.headers["content-disposition"]
    assert client.get("/api/jobs/nope/log").status_code == 404


def test_uploads_are_stored_listed_used_and_deleted(client: TestClient, settings: Settings) -> None:
    row = json.dumps({"instruction": "say hi", "output": "hi"}) + "\n"
    stored = client.post("/api/uploads", files={"file": ("../my data.jsonl", row.encode(), "application/x-ndjson")})
    assert stored.status_code == 201, stored.text
    path = Path(stored.json()["path"])
    assert path == settings.data_dir() / "data" / "uploads" / "my_data.jsonl" and path.read_text() == row
    again = client.post("/api/uploads", files={"file": ("my data.jsonl", row.encode())}).json()
    assert again["name"] == "my_data-2.jsonl"  # never replaces the first
    assert [u["name"] for u in client.get("/api/uploads").json()["items"]] == ["my_data-2.jsonl", "my_data.jsonl"]

    bad = client.post("/api/uploads", files={"file": ("notes.txt", b"hello")})
    assert bad.status_code == 422 and bad.json()["detail"]["field"] == "file"
    assert client.post("/api/uploads", files={"file": ("big.jsonl", row.encode() * 200)}).status_code == 413

    # A job reads an upload like any local file (data/uploads is a dataset root whatever the settings say).
    created = client.post("/api/jobs", json={"model_name": "org/model", "local_datasets": [str(path)]})
    assert created.status_code == 201, created.text
    assert client.request("DELETE", "/api/uploads/my_data-2.jsonl", json={}).status_code == 204
    assert client.request("DELETE", "/api/uploads/my_data-2.jsonl", json={}).status_code == 404
    assert client.request("DELETE", "/api/uploads/..%2F..%2Ftunestudio.db", json={}).status_code in (404, 405)
    assert (settings.data_dir() / "tunestudio.db").is_file()
    assert [u["name"] for u in client.get("/api/uploads").json()["items"]] == ["my_data.jsonl"]


def _fake_model(folder: Path, config: dict, shapes: dict[str, list[int]]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    header = json.dumps({name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}
                         for name, shape in shapes.items()}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


def test_models_and_the_estimate_from_config_json(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    # A Llama shape: h 64, 2 layers, 4 heads (2 kv, head_dim 16), mlp 128, vocab 100, tied embeddings.
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "vocab_size": 100, "tie_word_embeddings": True}
    _fake_model(tmp_path / "models" / "small", config, {"embed": [100, 64]})
    listed = client.get("/api/models").json()
    mine = [m for m in listed["local"] if m["path"].startswith(str(tmp_path))]  # the embedded tiny model is listed too
    assert [(m["name"], m["architecture"], m["parameters"]) for m in mine] == [("small", "LlamaForCausalLM", 6400)]
    assert client.get("/api/models/hub", params={"id": "org/absent"}).json()["cached"] is False

    got = client.post("/api/models/estimate", json={"model_name": str(tmp_path / "models" / "small"),
                                                    "batch_size": 4, "max_seq_length": 32, "lora_r": 8,
                                                    "precision": "fp32", "anything_else": 1}).json()
    per_layer = 64 * 64 + 64 * 32 * 2 + 64 * 64 + 3 * 64 * 128  # q, k, v, o, gate/up/down
    lora = 8 * ((64 + 64) + (64 + 32) * 2 + (64 + 64) + (64 + 128) * 3)
    assert got["parameters"] == 6400  # the safetensors header's exact count wins over arithmetic
    assert got["trainable"] == 2 * lora
    assert got["adapter_bytes"] == 2 * lora * 4 and got["optimizer_bytes"] == 2 * lora * 8
    assert got["weights_bytes"] == 6400 * 4 and got["fits"] is True and got["tokens_per_step"] == 4 * 32 * 4
    full = client.post("/api/models/estimate", json={"model_name": str(tmp_path / "models" / "small"),
                                                     "training_type": "full", "precision": "fp32"}).json()
    assert full["trainable"] == 6400 and full["gradients_bytes"] == 6400 * 4
    assert per_layer * 2 + 100 * 64 + 5 * 64 > 6400  # (the arithmetic itself would have said more)

    assert got["seconds_source"] == "arithmetic" and got["seconds_per_step"] > 0

    # A time per step measured by an earlier job's precision calibration (worker/train/calibrate.py's cache, as the
    # worker writes it under the data directory) replaces the arithmetic for the same model, method and type.
    name = str(tmp_path / "models" / "small")
    cache = settings.data_dir() / "cache" / "precision.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    measured = {"precision": "bf16", "reason": "fastest", "seconds_per_step": {"fp32": 0.4, "bf16": 0.3},
                "losses": {}, "job": {"model_name": name, "method": "sft", "training_type": "lora",
                                      "batch_size": 4, "max_seq_length": 32, "tokens": 100}}
    other = {**measured, "seconds_per_step": {"fp32": 9.0}, "job": {**measured["job"], "training_type": "full"}}
    cache.write_text(json.dumps({"a": measured, "b": other, "c": "not an entry"}))
    timed = client.post("/api/models/estimate", json={"model_name": name, "batch_size": 8, "max_seq_length": 32,
                                                      "gradient_accumulation_steps": 2}).json()
    assert timed["seconds_source"] == "calibration"
    assert timed["seconds_per_step"] == pytest.approx(0.3 * 2 * 2)  # auto chose bf16; twice the batch; 2 micro-batches
    assert any("measured by an earlier job" in n for n in timed["notes"])
    fixed = client.post("/api/models/estimate", json={"model_name": name, "batch_size": 4, "max_seq_length": 32,
                                                      "precision": "fp32", "gradient_accumulation_steps": 1}).json()
    assert fixed["seconds_per_step"] == pytest.approx(0.4)  # a fixed precision that was measured: its own timing
    cache.write_text("{broken")
    again = client.post("/api/models/estimate", json={"model_name": name, "batch_size": 4}).json()
    assert again["seconds_source"] == "arithmetic"

    huge = client.post("/api/models/estimate", json={"model_name": str(tmp_path / "models" / "small"),
                                                     "batch_size": 65536, "max_seq_length": 1048576}).json()
    assert huge["fits"] is False  # said plainly; nothing is refused
    bad = client.post("/api/models/estimate", json={"model_name": str(tmp_path / "models" / "small"), "batch_size": 0})
    assert bad.status_code == 422 and bad.json()["detail"]["errors"][0]["field"] == "batch_size"
    outside = client.post("/api/models/estimate", json={"model_name": "/etc"})
    assert outside.status_code == 422 and outside.json()["detail"]["field"] == "model_name"
    too_long = client.post("/api/models/estimate", json={"model_name": "x" * 300})  # a name no filesystem takes
    assert too_long.status_code == 422 and too_long.json()["detail"]["field"] == "model_name"
    assert "File name too long" not in too_long.text and "Traceback" not in too_long.text
    # "~user" of no user on this machine (pathlib raises RuntimeError): refused by name, not a server error
    no_user = client.post("/api/models/estimate", json={"model_name": "~no-such-user-here/model"})
    assert no_user.status_code == 422 and no_user.json()["detail"]["field"] == "model_name"


def test_the_memory_total_is_bytes_its_parts_whatever_the_step_count(client: TestClient, tmp_path: Path) -> None:
    # The memory total was the time total (issue 38): null without a step count, the seconds with one.
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "vocab_size": 100, "tie_word_embeddings": True}
    _fake_model(tmp_path / "models" / "small", config, {"embed": [100, 64]})
    ask = {"model_name": str(tmp_path / "models" / "small"), "batch_size": 4, "max_seq_length": 32}
    untimed = client.post("/api/models/estimate", json=ask).json()
    timed = client.post("/api/models/estimate", json={**ask, "max_steps": 40}).json()
    assert untimed["total_seconds"] is None and timed["total_seconds"] > 0
    for got in (untimed, timed):
        parts = ("weights_bytes", "adapter_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                 "runtime_bytes")
        assert isinstance(got["total_bytes"], int) and got["total_bytes"] == sum(got[p] for p in parts)
        assert got["runtime_bytes"] > 0 and got["fits"] is True
    assert timed["total_bytes"] == untimed["total_bytes"]


def test_a_vision_models_estimate_counts_its_tower_and_its_images(client: TestClient, tmp_path: Path) -> None:
    """Issue 42, part 6: the form leaves is_dataset_image off (the worker detects image rows), yet a vision-language
    model's job is an image job: its tower, its adapters as the vision switches choose them, and what an image
    becomes with its processor's own pixel cap (processor_config.json beside config.json)."""
    source = FAMILIES["qwen2_vl"]
    assert (source / "config.json").is_file(), f"{source} is not built: `make test` builds it"
    folder = tmp_path / "models" / "vlm"
    config = json.loads((source / "config.json").read_text())
    real = modelinfo.safetensors_parameters(source)
    assert real is not None
    _fake_model(folder, config, {"everything": [real]})  # the header's count: the tiny Qwen2-VL's own
    (folder / "processor_config.json").write_text((source / "processor_config.json").read_text())
    ask = {"model_name": str(folder), "batch_size": 2, "max_seq_length": 64, "lora_r": 8, "precision": "fp32"}
    got = client.post("/api/models/estimate", json=ask).json()
    assert got["vision"]["family"] == "qwen2_vl" and got["vision"]["trains"] is True
    assert got["vision"]["image"] == {"side": 56, "views": 1, "patches": 16, "tokens": 6}  # its 3,136-pixel cap
    assert got["parameters"] == real and got["vision"]["parameters"] < got["parameters"]
    assert any(n.startswith("a vision-language model: the estimate counts one image a row") for n in got["notes"])
    assert any(n.startswith("images: 6 tokens each, within max_seq_length 64") for n in got["notes"])
    frozen = client.post("/api/models/estimate", json={**ask, "finetune_vision_layers": False}).json()
    assert frozen["trainable"] == got["trainable"] - got["vision"]["trainable"] and frozen["vision"]["trainable"] == 0
    assert frozen["activations_bytes"] < got["activations_bytes"]
    stated = client.post("/api/models/estimate", json={**ask, "is_dataset_image": True}).json()
    assert stated["trainable"] == got["trainable"] and not any("a vision-language" in n for n in stated["notes"])
    # without its processor's cap, an image is 448 px (worker/modalities/image.side): 1,024 patches, 258 tokens
    (folder / "processor_config.json").unlink()
    uncapped = client.post("/api/models/estimate", json=ask).json()
    assert uncapped["vision"]["image"]["tokens"] == 258
    assert any("an image alone is 258 tokens, not less than max_seq_length 64: every row with one would be refused"
               in n for n in uncapped["notes"])


def trains_then_evaluates(args: WorkerArgs) -> None:
    """A training job of max_steps steps, 0.1 s and 120 tokens each, evaluating for 1 s at its last step: its last
    metric record is an eval-only one (no loss, no tokens), as a real job's is when it evaluates at its end."""
    from tunestudio.events import Progress
    from tunestudio.worker.channel import QueueChannel

    child.become_worker(args)
    channel = QueueChannel(args.events, args.commands)
    channel.phase("training")
    steps = int(args.public_config["max_steps"])
    for step in range(1, steps + 1):
        channel.emit(Progress, step=step, total_steps=steps, loss=1.0, num_tokens=120 * step,
                     tokens_per_second=1200.0, elapsed_seconds=0.1 * step)
    channel.emit(Progress, step=steps, total_steps=steps, eval_loss=0.9, elapsed_seconds=0.1 * steps + 1.0)
    channel.completed(output_dir=None, global_step=steps)
    channel.close()
    sys.exit(0)


def test_the_estimate_learns_from_a_finished_job_whose_last_record_is_an_evaluation(settings: Settings,
                                                                                     tmp_path: Path) -> None:
    # It once read a job's speed from its last record alone: after a job that evaluated at its end it said
    # "arithmetic" as if nothing had run here.
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "vocab_size": 100, "tie_word_embeddings": True}
    model = tmp_path / "models" / "small"
    _fake_model(model, config, {"embed": [100, 64]})
    shape = {"model_name": str(model), "batch_size": 4, "max_steps": 10, "max_seq_length": 64, "eval_steps": 0,
             "sample_prompts": [], "gradient_accumulation_steps": 1, "training_type": "lora", "lora_r": 8}
    manager = JobManager(settings, worker_target=trains_then_evaluates)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        before = client.post("/api/models/estimate", json=shape).json()
        assert before["seconds_source"] == "arithmetic"
        created = client.post("/api/jobs", json={**shape, "local_datasets": [str(DATA / "alpaca.jsonl")]}).json()
        wait_until(lambda: client.get(f"/api/jobs/{created['id']}").json()["status"] == "completed", 60, "the end")
        job = client.get(f"/api/jobs/{created['id']}").json()
        after = client.post("/api/models/estimate", json={**shape, "dataset": {"tokens_per_row": 30}}).json()
        assert after["seconds_source"] == "measured" and any(job["id"] in line for line in after["basis"])
        assert after["seconds_per_step"] == pytest.approx(0.1)  # its steps, its evaluation left out
        assert after["tokens_per_step"] == 120
        # the same job again: as long as it took, start to end
        assert after["total_seconds"] == pytest.approx(job["finished_at"] - job["started_at"], rel=0.01)
        as_it_stood = client.post("/api/models/estimate", json={**shape, "as_of": job["created_at"]}).json()
        assert as_it_stood["seconds_source"] == "arithmetic"  # the job's page: the estimate before it ran
    manager.close()


def test_a_resumed_job_links_to_its_child_and_offers_no_second_resume(settings: Settings) -> None:
    manager = JobManager(settings, worker_target=fake_workers.checkpoints_then_fails)
    with TestClient(create_app(settings, manager), base_url=BASE, headers={"Origin": BASE}) as client:
        created = client.post("/api/jobs", json={"model_name": "org/model",
                                                 "local_datasets": [str(DATA / "alpaca.jsonl")]}).json()
        job_id = created["id"]
        wait_until(lambda: client.get(f"/api/jobs/{job_id}").json()["status"] == "failed", 60, "the job to fail")
        failed = client.get(f"/api/jobs/{job_id}").json()
        assert failed["resumable"] and failed["deletable"] and failed["resumed_by"] is None
        child = client.post(f"/api/jobs/{job_id}/resume", json={}).json()["id"]
        parent = client.get(f"/api/jobs/{job_id}").json()
        assert parent["resumed_by"] == child and not parent["resumable"] and not parent["deletable"]
        assert client.post(f"/api/jobs/{job_id}/resume", json={}).status_code == 409  # what the flags said
    manager.close()
