"""The parent process never imports torch or the HF libraries (shared/ARCHITECTURE.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "peft", "trl", "datasets", "bitsandbytes", "lm_eval")


def test_parent_modules_import_no_heavy_library() -> None:
    script = f"""
import sys
from pathlib import Path
import tunestudio.cli, tunestudio.jobs, tunestudio.jobs.supervisor, tunestudio.config, tunestudio.events
import tunestudio.export_config, tunestudio.bench_config, tunestudio.cli.bench, tunestudio.api.benchmarks
import tunestudio.settings, tunestudio.worker.child, tunestudio.api, tunestudio.tool_calls
tunestudio.api.create_app()
print(",".join(m for m in {HEAVY!r} if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_chat_routes_cli_and_pool_import_no_heavy_library(tmp_path: Path) -> None:
    """/v1, /api/inference, `tunestudio chat` and an inference worker's whole start: torch stays in the child."""
    script = f"""
import sys
from pathlib import Path
from fastapi.testclient import TestClient
from typer.testing import CliRunner
import tunestudio.cli
from tunestudio.api import create_app
from tunestudio.inference import CompletionParams, GenerateParams, InferencePool, InferenceUnavailable, ModelSpec
from tunestudio.jobs.executor import inference_executor
from tunestudio.settings import Settings

if __name__ == "__main__":
    settings = Settings(home={str(tmp_path / "home")!r})
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8765") as client:
        assert client.get("/v1/models").json()["data"] == []
        chat = {{"model": "x", "messages": [{{"role": "user", "content": "hi"}}]}}
        assert client.post("/v1/chat/completions", json=chat).status_code == 404
        assert client.post("/v1/completions", json={{"model": "x", "prompt": [[1, 2]]}}).status_code == 404
        assert client.get("/api/jobs/x/benchmarks").status_code == 404
        assert client.get("/api/inference").json()["state"] == "stopped"
    assert CliRunner().invoke(tunestudio.cli.app, ["chat", "no-such-job"]).exit_code == 2
    pool = InferencePool(settings, inference_executor)
    missing = {str(tmp_path / "missing")!r}
    spec = ModelSpec(job_id="x", base=False, base_model=missing, weights=missing, kind="full", tokenizer=missing)
    try:
        list(pool.generate(spec, [{{"role": "user", "content": "hi"}}], GenerateParams(max_tokens=1)))
    except InferenceUnavailable as exc:  # the worker started, imported torch and refused the folder
        assert exc.status == 409, exc
    try:
        list(pool.complete(spec, [[1, 2]], CompletionParams(max_tokens=1, logprobs=1, echo=True)))
    except InferenceUnavailable as exc:
        assert exc.status == 409, exc
    assert pool.status()["starts"] == 1
    pool.close()
    print(",".join(m for m in {HEAVY!r} if m in sys.modules))
"""
    path = tmp_path / "parent.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1:] in ([], [""])
