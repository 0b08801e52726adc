"""Issue 43's end-to-end run with a real teacher on this machine (plumbing, not quality: only tiny models run here).

A finished tunestudio job (the tests' 40-step LoRA chat job of the tiny model) is served by our own /v1 and is the
teacher. Through the real server's /api/data/make: (1) task qa on the bundled handbook (tunestudio/worker/
tiny_docs.py: .md .html .pdf .docx); (2) task answer on 24 seed prompts (the alpaca data's instructions); (3) task
preference on the same prompts, the teacher's answer chosen over its base model's (`ID:base`, also through our
/v1); (4) task answer again with the judge's score gate (the teacher judging, min_score 6). Then a student LoRA
job trains on the rows made, a DPO job on the preference pairs, and `tunestudio judge STUDENT --against base`
compares the student with its base model, the teacher job as the judge. Prints one JSON object: rows made and
what each gate removed, per task, the students' jobs and the judgement.
Usage: /work/runtest .venv/bin/python bench/make_data_e2e.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.chat import train_chat_job  # noqa: E402
from tests.helpers.jobs import DATA, job_config  # noqa: E402
from tests.helpers.server import running_server  # noqa: E402
from tests.helpers.wait import wait_until  # noqa: E402
from tunestudio.settings import Settings  # noqa: E402
from tunestudio.worker.tiny_docs import write_docs  # noqa: E402

TINY = ROOT / "models" / "tiny-llama"


def make(client: httpx.Client, url: str, teacher: str, recipe: dict[str, Any]) -> dict[str, Any]:
    body = {**recipe, "teacher": {"base_url": f"{url}/v1", "model": teacher, "max_tokens": 96, "temperature": 0.7},
            "concurrency": 2, "timeout": 60}
    made = client.post("/api/data/make", json=body)
    made.raise_for_status()
    job = wait_until(lambda: (j := client.get(f"/api/jobs/{made.json()['id']}").json())["is_terminal"] and j, 600,
                     "the make_data job")
    if not Path(f"{recipe['output']}.report.json").exists():  # failed before it made a report
        return {"status": job["status"], "error": job["error"]}
    report = json.loads(Path(f"{recipe['output']}.report.json").read_text())
    return {"status": job["status"], "error": job["error"], "rows_made": report["rows_made"],
            "requests": report["requests"], "removed": report["removed"], "seconds": report["seconds"],
            "judge_calls": report["judge_calls"], "errors": report["errors"][:3],
            "examples": {g: [e["why"] for e in ex[:1]] for g, ex in report["examples"].items()}}


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="make-data-e2e-"))
    home = tmp / "home"
    started = time.monotonic()
    teacher = train_chat_job(TINY, home)
    out: dict[str, Any] = {"teacher_job": teacher.id, "teacher_train_s": round(time.monotonic() - started, 1)}
    docs = write_docs(tmp / "data" / "docs")
    prompts = tmp / "data" / "prompts.txt"
    # the prompts as the teacher job was trained on them (the instruction, then its input): the instruction alone
    # ("Reverse the letters of the word.") names no word, and the tiny teacher answered it with one
    rows = [json.loads(line) for line in (DATA / "alpaca.jsonl").read_text().splitlines()]
    seen = [" ".join(f"{r['instruction']} {r.get('input') or ''}".split()) for r in rows]
    prompts.write_text("\n".join(list(dict.fromkeys(seen))[:24]) + "\n")
    settings = Settings(home=home, dataset_roots=[tmp / "data"], prewarm=False)
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=120) as client:
        out["qa"] = make(client, url, teacher.id, {
            "sources": [str(docs[k]) for k in ("md", "html", "pdf", "docx")], "task": "qa", "rows": 12,
            "chunk_size": 250, "chunk_overlap": 30,  # the tiny teacher reads 512 tokens
            "output": str(tmp / "data" / "made" / "qa.jsonl")})
        answers = tmp / "data" / "made" / "answers.jsonl"
        out["answer"] = make(client, url, teacher.id, {"sources": [str(prompts)], "task": "answer", "rows": 24,
                                                       "output": str(answers),
                                                       # the tiny teacher's right answers are words ("nedrag")
                                                       "gates": {"min_answer_chars": 1}})
        out["preference"] = make(client, url, teacher.id, {
            "sources": [str(prompts)], "task": "preference", "rows": 24, "gates": {"min_answer_chars": 1},
            "rejected_by": {"base_url": f"{url}/v1", "model": f"{teacher.id}:base"},
            "output": str(tmp / "data" / "made" / "pairs.jsonl")})
        out["answer_judged"] = make(client, url, teacher.id, {
            "sources": [str(prompts)], "task": "answer", "rows": 24, "output": str(tmp / "data" / "made" / "j.jsonl"),
            "gates": {"min_answer_chars": 1, "judge": {"min_score": 6}}})
        rows = [p for p in (tmp / "data" / "made" / "qa.jsonl", answers) if p.exists() and p.stat().st_size]
        cfg = job_config(TINY, home / "student", local_datasets=[str(p) for p in rows], max_steps=20,
                         eval_steps=0.5, eval_generate_rows=4)
        started = time.monotonic()
        student = client.post("/api/jobs", json=cfg.public_dict())
        if student.status_code != 201:  # no rows kept, most likely: say what the makers did
            out["student"] = {"refused": student.json()}
            print(json.dumps(out, indent=1, default=str))
            return
        sid = student.json()["id"]
        job = wait_until(lambda: (j := client.get(f"/api/jobs/{sid}").json())["is_terminal"] and j, 900, "student")
        out["student"] = {"id": sid, "status": job["status"], "error": job["error"], "rows": sum(
            len(p.read_text().splitlines()) for p in rows), "seconds": round(time.monotonic() - started, 1)}
        pairs = tmp / "data" / "made" / "pairs.jsonl"
        if pairs.exists() and pairs.stat().st_size:  # the preference rows train a DPO job as they are
            dpo = job_config(TINY, home / "dpo-student", local_datasets=[str(pairs)], max_steps=10, method="dpo",
                             batch_size=4, learning_rate=5e-4)
            queued = client.post("/api/jobs", json=dpo.public_dict())
            if queued.status_code != 201:
                out["dpo_student"] = {"refused": queued.json()}
            else:
                did = queued.json()["id"]
                job = wait_until(lambda: (j := client.get(f"/api/jobs/{did}").json())["is_terminal"] and j, 900,
                                 "the DPO student")
                out["dpo_student"] = {"id": did, "status": job["status"], "error": job["error"],
                                      "metrics": {k: v for k, v in (job.get("final_metrics") or {}).items()
                                                  if k.startswith(("rewards/", "eval_rewards/"))}}
        judged = subprocess.run(
            [sys.executable, "-m", "tunestudio.cli", "judge", sid, "--against", "base", "--judge-url", f"{url}/v1",
             "--judge-model", teacher.id, "--limit", "4", "--json",
             "--prompts", str(prompts)],  # a few rows leave the student no held-out rows: the seed prompts
            capture_output=True, text=True, timeout=900,
            env={**os.environ, "TUNESTUDIO_HOME": str(home)})
        out["judge"] = {"exit": judged.returncode,
                        # exit 1: every verdict unusable (a tiny judge), its rows still printed
                        "answer": json.loads(judged.stdout) if judged.stdout.strip() else judged.stderr[-800:]}
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
