"""The data-making recipe in-process (tunestudio/worker/make_data/job.py) against the scripted teacher
(tests/helpers/teacher.py): rows appended with provenance, retries, the gates, the budget, a refused key, a teacher
that hangs, resume, a torn last row, a stop."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.channel import ListChannel
from tests.helpers.server import loopback_v1
from tests.helpers.teacher import CALLS, KEY_OF, Teacher
from tests.helpers.wait import wait_until
from tunestudio.events import Completed, Failed, Progress, Stop, parse_event
from tunestudio.make_data_config import MakeDataConfig, recipe_file, rejected_file, report_file
from tunestudio.worker.make_data import preview, run
from tunestudio.worker.tiny_docs import write_docs


@pytest.fixture(scope="module")
def teacher() -> Iterator[str]:
    with loopback_v1(Teacher) as url:
        yield url


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_docs(tmp_path_factory.mktemp("docs"))


def recipe(url: str, docs: dict[str, Path], out: Path, model: str = "good", **fields: Any) -> MakeDataConfig:
    given: dict[str, Any] = {"sources": [str(docs["md"])], "task": "qa", "rows": 4, "chunk_size": 300,
                             "chunk_overlap": 50, "output": str(out), "concurrency": 2,
                             "teacher": {"base_url": url, "model": model}, **fields}
    return MakeDataConfig.model_validate(given)


def make(cfg: MakeDataConfig, channel: ListChannel | None = None) -> tuple[int, list[Any]]:
    channel = channel or ListChannel()
    code = run(cfg, channel, {})
    return code, [parse_event(line) for line in channel.lines]


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_qa_rows_are_written_with_their_provenance_and_the_run_is_recorded(teacher: str, docs: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    out = tmp_path / "qa.jsonl"
    code, events = make(recipe(teacher, docs, out, rows=5, api_key=None))
    assert code == 0 and isinstance(events[-1], Completed)
    rows = rows_of(out)
    assert len(rows) == 5 and len({r["provenance"]["key"] for r in rows}) == 5
    for row in rows:
        user, assistant = row["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        where = row["provenance"]
        chunk = Path(where["file"]).read_text(encoding="utf-8")
        assert assistant["content"].rstrip(".") in " ".join(chunk.split())  # grounded in its chunk
        assert where["end"] - where["start"] <= 300 and where["heading"] and where["task"] == "qa"
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress[-1].step == 5 and progress[-1].total_steps == 5 and progress[-1].num_tokens == 75
    record = json.loads(recipe_file(out).read_text(encoding="utf-8"))
    assert record["teacher"] == {"base_url": teacher, "model": "good"} and record["made_by"] == "tunestudio"
    report = json.loads(report_file(out).read_text(encoding="utf-8"))
    assert report["rows_made"] == 5 and report["requests"] == 5 and report["removed"] == {}


def test_the_key_is_sent_and_never_written(teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "qa.jsonl"
    cfg = recipe(teacher, docs, out, rows=1, teacher={"base_url": teacher, "model": "good", "api_key_env": "K"})
    code, _ = make(MakeDataConfig.from_parts(cfg.public_dict(), {"api_key": "sk-secret-123"}))
    assert code == 0
    assert not any("sk-secret-123" in p.read_text(encoding="utf-8") for p in tmp_path.iterdir())


def test_the_teacher_s_key_goes_to_a_judge_on_its_endpoint_and_to_none_elsewhere(
        teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    elsewhere = teacher.replace("/v1", "/judge/v1")  # the same scripted server under another base_url
    for base_url, model in ((teacher, "judge-here"), (elsewhere, "judge-elsewhere")):
        cfg = recipe(teacher, docs, tmp_path / f"{model}.jsonl", rows=1,
                     teacher={"base_url": teacher, "model": "good", "api_key_env": "TEACHER_KEY"},
                     gates={"judge": {"base_url": base_url, "model": model, "min_score": 1}})
        assert make(MakeDataConfig.from_parts(cfg.public_dict(), {"api_key": "sk-teacher-7"}))[0] == 0
    assert KEY_OF["good"] == KEY_OF["judge-here"] == "sk-teacher-7" and KEY_OF["judge-elsewhere"] == ""


def test_429_and_500_are_retried(teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    before = CALLS["flaky"]
    code, _ = make(recipe(teacher, docs, tmp_path / "qa.jsonl", model="flaky", rows=4))
    assert code == 0 and len(rows_of(tmp_path / "qa.jsonl")) == 4
    assert CALLS["flaky"] - before == 8  # each request failed once, then answered


def test_the_gates_remove_rows_and_the_report_shows_examples(teacher: str, docs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    code, events = make(recipe(teacher, docs, tmp_path / "g.jsonl", model="garbage", rows=3, max_requests=5))
    report = json.loads(report_file(tmp_path / "g.jsonl").read_text(encoding="utf-8"))
    assert code == 0 and report["removed"] == {"parse": 5} and report["requests"] == 5
    assert "not JSON" in report["examples"]["parse"][0]["why"] and len(report["examples"]["parse"]) == 3
    assert any("the budget of max_requests is spent: 0 of 3 rows made" in getattr(e, "message", "") for e in events)
    make(recipe(teacher, docs, tmp_path / "s.jsonl", model="short", rows=2, max_requests=3))
    assert json.loads(report_file(tmp_path / "s.jsonl").read_text())["removed"] == {"answer_length": 3}
    make(recipe(teacher, docs, tmp_path / "d.jsonl", model="same", rows=3, max_requests=4, concurrency=1))
    assert json.loads(report_file(tmp_path / "d.jsonl").read_text())["removed"] == {"duplicate": 3}
    assert len(rows_of(tmp_path / "d.jsonl")) == 1
    against = tmp_path / "held_out.jsonl"
    against.write_text(json.dumps({"messages": [{"role": "user", "content": "What is the tram?"}, {
        "role": "assistant", "content": "The tram is a tram, always!"}]}) + "\n", encoding="utf-8")
    make(recipe(teacher, docs, tmp_path / "a.jsonl", model="same", rows=1, max_requests=2,
                gates={"against": [str(against)]}))
    assert json.loads(report_file(tmp_path / "a.jsonl").read_text())["removed"] == {"against": 2}


def test_a_refused_key_and_a_hanging_teacher_fail_the_run_naming_why(teacher: str, docs: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    cfg = recipe(teacher, docs, tmp_path / "k.jsonl", rows=2,
                 teacher={"base_url": teacher, "model": "401", "api_key_env": "TEACHER_KEY"})
    code, events = make(MakeDataConfig.from_parts(cfg.public_dict(), {"api_key": "sk-wrong"}))
    failed = next(e for e in events if isinstance(e, Failed)).message
    assert code == 1 and "the key was refused" in failed and "TEACHER_KEY" in failed and "sk-wrong" not in failed
    code, events = make(recipe(teacher, docs, tmp_path / "h.jsonl", model="hang", rows=20, timeout=0.3, retries=0,
                               concurrency=8))
    failed = next(e for e in events if isinstance(e, Failed)).message
    assert code == 1 and "failed 8 requests in a row" in failed and "did not answer within its deadline" in failed
    calls = rows_of(rejected_file(tmp_path / "h.jsonl"))  # each failed call recorded with its own error
    assert len(calls) >= 8 and all("did not answer within its deadline" in c["error"] and c["key"] for c in calls)


def test_a_second_run_appends_without_repeating_a_row_and_a_torn_row_is_made_again(
        teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "qa.jsonl"
    assert make(recipe(teacher, docs, out, rows=3))[0] == 0
    first = rows_of(out)
    with out.open("a", encoding="utf-8") as file:
        file.write('{"messages": [{"role": "user", "con')  # a kill while writing a row
    code, events = make(recipe(teacher, docs, out, rows=7))
    rows = rows_of(out)
    assert code == 0 and rows[:3] == first and len(rows) == 7 and len({r["provenance"]["key"] for r in rows}) == 7
    assert any("a last row cut short" in getattr(e, "message", "") for e in events)
    assert len(json.loads(recipe_file(out).read_text())["runs"]) == 2


def test_answer_and_conversation_tasks(teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    code, _ = make(recipe(teacher, docs, tmp_path / "ans.jsonl", task="answer", rows=10,
                          sources=[str(docs["prompts"])]))
    rows = rows_of(tmp_path / "ans.jsonl")
    assert code == 0 and len(rows) == 4  # the prompts are used up: one answer each
    assert rows[0]["messages"][1]["content"] == f"Answer: {rows[0]['messages'][0]['content']}"
    assert rows[0]["provenance"]["line"] >= 1
    code, _ = make(recipe(teacher, docs, tmp_path / "conv.jsonl", task="conversation", rows=2,
                          sources=[str(docs["pdf"]), str(docs["docx"])]))
    rows = rows_of(tmp_path / "conv.jsonl")
    assert code == 0 and [len(r["messages"]) for r in rows] == [4, 4]
    assert {Path(r["provenance"]["file"]).suffix for r in rows} <= {".pdf", ".docx"}


def test_a_stop_ends_the_run_keeping_its_rows(teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "qa.jsonl"
    channel = ListChannel()
    cfg = recipe(teacher, docs, out, model="slow", rows=50, concurrency=1)
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(run(cfg, channel, {})))
    worker.start()
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 2, 30, "two rows")
    channel.receive(Stop(save=False).model_dump_json())
    worker.join(30)
    completed = next(e for e in map(parse_event, channel.lines) if isinstance(e, Completed))
    rows = rows_of(out)
    assert done == [0] and completed.stopped and 2 <= len(rows) < 50
    assert json.loads(report_file(out).read_text())["rows_made"] == len(rows)


def test_preview_writes_nothing(teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    rows = preview(recipe(teacher, docs, tmp_path / "p.jsonl"), 2)
    assert len(rows) == 2 and all("messages" in r for r in rows) and not list(tmp_path.iterdir())


def removed(out: Path) -> list[dict[str, Any]]:
    return [r for r in rows_of(rejected_file(out)) if "gate" in r]


def test_the_judge_s_score_and_grounding_gates_keep_only_what_passes_and_say_why(
        teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "judged.jsonl"
    code, _ = make(recipe(teacher, docs, out, rows=4, max_requests=9, gates={"judge": {"min_score": 7}}))
    report = json.loads(report_file(out).read_text(encoding="utf-8"))
    kept, gone = rows_of(out), removed(out)
    assert code == 0 and kept and report["rows_made"] == len(kept) and report["judge"]["model"] == "good"
    assert all(len(r["messages"][1]["content"]) >= 40 and r["provenance"]["judge_score"] == 9 for r in kept)
    assert report["removed"].get("judge_score", 0) == len(gone) and report["judge_calls"] == len(kept) + len(gone)
    assert all(g["gate"] == "judge_score" and g["why"] == "scored 3 (min_score 7)" for g in gone)
    assert all(len(g["text"].splitlines()[-1]) < 40 for g in gone)  # the short answers, and only they
    # an answer its chunk does not state: removed by grounding; a judge that names no score: removed, its reply shown
    out = tmp_path / "invented.jsonl"
    make(recipe(teacher, docs, out, model="inventive", rows=2, max_requests=3, gates={"judge": {"grounding": True}}))
    assert json.loads(report_file(out).read_text())["removed"] == {"grounding": 3} and rows_of(out) == []
    assert make(recipe(teacher, docs, tmp_path / "g.jsonl", rows=2, gates={"judge": {"grounding": True}}))[0] == 0
    assert len(rows_of(tmp_path / "g.jsonl")) == 2  # the good teacher's answers are its chunks' sentences
    out = tmp_path / "vague.jsonl"
    make(recipe(teacher, docs, out, rows=1, max_requests=2, gates={"judge": {"model": "vague", "min_score": 5}}))
    why = "the judge's reply names no score from 1 to 10: 'It is quite good.'"
    assert [g["why"] for g in removed(out)] == [why, why]


def test_preference_pairs_from_a_weaker_model_or_ranked_by_the_judge_in_both_orders(
        teacher: str, docs: dict[str, Path], tmp_path: Path) -> None:
    base = {"task": "preference", "rows": 4, "sources": [str(docs["prompts"])]}
    out = tmp_path / "weak.jsonl"
    code, _ = make(recipe(teacher, docs, out, rejected_by={"base_url": teacher, "model": "weak"}, **base))
    rows = rows_of(out)
    assert code == 0 and len(rows) == 4
    for row in rows:
        (user,) = row["prompt"]
        assert row["chosen"] == [{"role": "assistant", "content": f"Answer: {user['content']}"}]
        assert row["rejected"] == [{"role": "assistant", "content": "I do not know."}]
    out = tmp_path / "ranked.jsonl"
    code, _ = make(recipe(teacher, docs, out, gates={"judge": {}}, **base))
    rows = rows_of(out)
    assert code == 0 and len(rows) == 4 and json.loads(report_file(out).read_text())["judge_calls"] == 8
    assert all(r["chosen"][0]["content"].endswith("That is all there is to it.")
               and r["rejected"][0]["content"] == f"Answer: {r['prompt'][0]['content']}" for r in rows)
    out = tmp_path / "sided.jsonl"  # a judge that always says "1" prefers a side, not an answer
    make(recipe(teacher, docs, out, gates={"judge": {"model": "sided"}}, **base))
    assert rows_of(out) == [] and {g["gate"] for g in removed(out)} == {"judge_undecided"}


def test_tool_calling_rows_from_a_tools_schema_and_calls_it_refuses(teacher: str, docs: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather now in a city.", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": False}}}]), encoding="utf-8")
    prompts = tmp_path / "asks.txt"
    prompts.write_text("What is the weather in Paris today?\nTell me a joke about trams.\nAnd the weather in Oslo?\n",
                       encoding="utf-8")
    base = {"task": "tools", "rows": 3, "sources": [str(prompts)], "tools": str(tools),
            "gates": {"min_answer_chars": 5}}
    for model in ("good", "textcall"):  # calls as OpenAI's tool_calls, or as <tool_call> text
        out = tmp_path / f"{model}.jsonl"
        assert make(recipe(teacher, docs, out, model=model, **base))[0] == 0
        rows = rows_of(out)
        assert [r["tools"][0]["function"]["name"] for r in rows] == ["get_weather"] * 3
        calls = {r["messages"][0]["content"]: r["messages"][1].get("tool_calls") for r in rows}
        (call,) = calls["What is the weather in Paris today?"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert calls["Tell me a joke about trams."] is None  # answered, not called
    out = tmp_path / "bad.jsonl"
    make(recipe(teacher, docs, out, model="badcall", **base))
    assert len(rows_of(out)) == 1 and sorted(g["gate"] for g in removed(out)) == ["schema", "schema"]
    assert removed(out)[0]["why"] == "'get_weather' called with the arguments: 'city' is a required property"


def test_rows_a_gate_removed_are_not_asked_again_on_resume(teacher: str, docs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    out = tmp_path / "g.jsonl"
    make(recipe(teacher, docs, out, model="garbage", rows=3, max_requests=2, concurrency=1))
    first = [g["key"] for g in removed(out)]
    make(recipe(teacher, docs, out, model="garbage", rows=3, max_requests=3, concurrency=1))
    keys = [g["key"] for g in removed(out)]
    assert len(first) == 2 and len(keys) == 5 and len(set(keys)) == 5 and keys[:2] == first
