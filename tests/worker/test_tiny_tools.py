from __future__ import annotations

import json
from pathlib import Path

from tunestudio.worker.tiny_tools import AMOUNTS, CITIES, CURRENCIES, TOOLS, WEATHER_ASKED, write_tool_datasets

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "data"


def _calls(rows: list[dict]) -> list[tuple[str, dict, str]]:
    """(tool, arguments, the question asked) of every call in the rows."""
    found = []
    for row in rows:
        question = next(m["content"] for m in row["messages"] if m["role"] == "user")
        for m in row["messages"]:
            for call in m.get("tool_calls") or []:
                found.append((call["function"]["name"], json.loads(call["function"]["arguments"]), question))
    return found


def test_bundled_tool_rows_are_what_the_generator_writes(tmp_path: Path) -> None:
    for path in write_tool_datasets(tmp_path):
        assert path.read_bytes() == (BUNDLED / path.name).read_bytes(), path.name


def test_held_out_rows_combine_values_that_train_in_new_ways() -> None:
    def read(name: str) -> list[dict]:
        return [json.loads(line) for line in (BUNDLED / name).read_text().splitlines()]

    train, held = read("tools.jsonl"), read("tools_eval.jsonl")
    assert all(row["tools"] == TOOLS for row in train + held)
    train_calls, held_calls = _calls(train), _calls(held)
    # no held-out question is a training question, and no held-out conversion triple trains
    assert not {q for _, _, q in held_calls} & {q for _, _, q in train_calls}
    triples = {tuple(a.values()) for name, a, _ in train_calls if name == "convert"}
    assert not {tuple(a.values()) for name, a, _ in held_calls if name == "convert"} & triples
    # ... while every single value, phrasing and currency pair does train (the tiny model cannot copy a new one)
    assert {a["city"] for name, a, _ in train_calls if name == "get_weather"} == set(CITIES)
    assert {a for a, _, _ in triples} == set(AMOUNTS)
    assert {(s, t) for _, s, t in triples} == {(s, t) for s in CURRENCIES for t in CURRENCIES if s != t}
    asked = {q.split("\n\n")[0] for name, _, q in train_calls if name == "get_weather"}
    assert asked == set(WEATHER_ASKED)
    # every kind of row is held out: calls of each tool, answers without a call, whole loops
    kinds = {(m[-1]["role"], bool(m[-1].get("tool_calls")), len(m)) for m in (row["messages"] for row in held)}
    assert kinds == {("assistant", True, 2), ("assistant", False, 2), ("assistant", False, 4)}
    assert {name for name, _, _ in held_calls} == {"get_weather", "convert"}
