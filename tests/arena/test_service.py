"""The arena's service with scripted answerers: blind on the server, votes stored whole or not at all, undo, the
votes as datasets, nothing written over."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunestudio.arena import Arena, ArenaInvalid, Params, VoteRefused
from tunestudio.judge import JudgeError

ANSWERS = {"good": "Paris.", "bad": "Rome.", "same": "Paris."}


class Models:
    """Answerers by model id: each says ANSWERS[id]; `broken` raises naming itself; `slow` waits for `go`."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.asked: list[tuple[str, Params]] = []

    def answerer(self, model: str, params: Params):  # type: ignore[no-untyped-def]
        def answer(messages: list[dict[str, str]]) -> str:
            self.asked.append((model, params))
            if model == "broken":
                raise JudgeError(f"{model}: the inference worker died")
            if model.endswith(":base"):
                raise JudgeError(f"{model}: cannot load the model /models/secret-base (job {model[:-5]})")
            if model == "slow":
                assert self.go.wait(30)
            return ANSWERS.get(model, "slow answer")
        return answer

    @staticmethod
    def check(model: str) -> str | None:
        return "job is training (it can answer once it has completed)" if model == "training" else None


@pytest.fixture
def models() -> Models:
    return Models()


@pytest.fixture
def arena(tmp_path: Path, models: Models) -> Iterator[Arena]:
    arena = Arena(tmp_path / "arena.sqlite", tmp_path / "exports", models.answerer, models.check)
    yield arena
    models.go.set()
    arena.close()


def _ready(arena: Arena, models: list[str], prompt: str = "The capital of France?", **kw: object) -> dict:
    battle = arena.start([{"role": "user", "content": prompt}], models, **kw)  # type: ignore[arg-type]
    return arena.wait(battle["id"], 30)


def test_a_blind_battle_names_no_model_until_its_vote_is_stored(arena: Arena) -> None:
    seen_first = set()
    for number in range(40):  # 12 battles, and more until both orders were drawn (40 in one order: 1 in 5e11)
        if number >= 12 and len(seen_first) == 2:
            break
        battle = _ready(arena, ["good", "bad"])
        assert battle["status"] == "ready" and battle["models"] is None
        # The id is random hex, which can spell "bad" (1 battle in ~400: "bat-b73ebad79185" failed a CI run);
        # it names no model, so it is checked for its shape and the rest for the names.
        assert re.fullmatch(r"bat-[0-9a-f]{12}", battle["id"]), battle["id"]
        text = json.dumps({**battle, "id": None})
        assert "good" not in text and "bad" not in text.replace("both_bad", "")
        seen_first.add(battle["answers"]["a"])
        voted = arena.vote(battle["id"], "a")
        assert set(voted["models"].values()) == {"good", "bad"}
        assert voted["answers"]["a"] == ANSWERS[voted["models"]["a"]]
    assert seen_first == {"Paris.", "Rome."}  # the order is drawn
    open_battle = _ready(arena, ["good", "bad"], blind=False)
    assert set(open_battle["models"].values()) == {"good", "bad"}


def test_a_model_that_fails_leaves_no_pair_to_vote_on_and_its_name_hidden(arena: Arena) -> None:
    battle = _ready(arena, ["broken", "good"])
    assert battle["status"] == "failed" and battle["answers"] is None
    assert "broken" not in json.dumps(battle) and "the inference worker died" in battle["error"]
    with pytest.raises(VoteRefused, match="never shown"):
        arena.vote(battle["id"], "a")
    assert arena.progress()["votes"] == 0


def test_a_blind_error_names_neither_the_job_nor_its_base_nor_a_path(arena: Arena) -> None:
    for _ in range(4):  # either order
        battle = _ready(arena, ["job-1", "job-1:base"])
        text = json.dumps(battle)
        assert battle["status"] == "failed" and "job-1" not in text and "secret-base" not in text, text
        assert "cannot load the model <hidden>" in battle["error"]


def test_votes_refused_whole(arena: Arena, models: Models) -> None:
    pending = arena.start([{"role": "user", "content": "q"}], ["slow", "good"])
    with pytest.raises(VoteRefused, match="never shown"):
        arena.vote(pending["id"], "a")
    models.go.set()
    assert arena.wait(pending["id"], 30)["status"] == "ready"
    arena.vote(pending["id"], "b")
    with pytest.raises(VoteRefused, match="has its vote already"):
        arena.vote(pending["id"], "a")
    for choice, edited in (("maybe", None), ("tie", "better"), ("a", "  ")):
        with pytest.raises(ArenaInvalid):
            arena.vote(pending["id"], choice, edited)
    assert len(arena.votes()) == 1 and arena.votes()[0]["vote"]["choice"] == "b"


def test_an_arena_needs_two_models_that_can_answer(arena: Arena) -> None:
    for models in (["good"], ["good", "good", " "], []):
        with pytest.raises(ArenaInvalid, match="two different models"):
            arena.start([{"role": "user", "content": "q"}], models)
    with pytest.raises(ArenaInvalid, match="training: job is training") as refused:
        arena.start([{"role": "user", "content": "q"}], ["good", "training"])
    assert refused.value.conflict
    battle = _ready(arena, ["good", "bad", "training"])  # three chosen, two can answer: those two meet
    arena.vote(battle["id"], "tie")
    assert set(arena.votes()[0]["models"].values()) == {"good", "bad"}
    with pytest.raises(ArenaInvalid, match="no such endpoint"):
        arena.start([{"role": "user", "content": "q"}], ["good", "endpoint:nowhere"])
    assert arena.progress() == {"votes": 1, "ready": 0, "answering": 0, "failed": 0}


def test_undo_takes_back_the_newest_vote(arena: Arena) -> None:
    first, second = _ready(arena, ["good", "bad"]), _ready(arena, ["good", "bad"])
    arena.vote(first["id"], "a")
    arena.vote(second["id"], "both_bad")
    again = arena.undo()
    assert again["id"] == second["id"] and again["status"] == "ready" and again["models"] is None
    assert [v["id"] for v in arena.votes()] == [first["id"]]
    arena.vote(second["id"], "tie")
    arena.undo()
    arena.undo()
    with pytest.raises(ArenaInvalid, match="no vote to undo"):
        arena.undo()


def test_the_votes_become_datasets_and_no_file_is_written_over(arena: Arena, models: Models) -> None:
    with pytest.raises(ArenaInvalid, match="no vote makes a dpo row"):
        arena.export("dpo")
    assert not arena.exports.exists() or not any(arena.exports.iterdir())
    votes = []
    for choice, pair, edited in (("a", ["good", "bad"], None), ("b", ["good", "bad"], "Paris, of course."),
                                 ("tie", ["good", "bad"], None), ("both_bad", ["good", "bad"], None),
                                 ("a", ["good", "same"], None)):
        battle = _ready(arena, pair, blind=False, params=Params(temperature=0.0))
        picked = arena.vote(battle["id"], choice, edited)
        votes.append(picked)
    dpo_rows, skipped = arena.rows("dpo")
    assert skipped == {"tie": 1, "both bad": 1, "identical answers": 1}
    first = votes[0]
    assert dpo_rows[0] == {"prompt": [{"role": "user", "content": "The capital of France?"}],
                           "chosen": [{"role": "assistant", "content": first["answers"]["a"]}],
                           "rejected": [{"role": "assistant", "content": first["answers"]["b"]}]}
    assert dpo_rows[1]["chosen"][0]["content"] == "Paris, of course."
    kto_rows, _ = arena.rows("kto")
    assert [r["label"] for r in kto_rows] == [True, False, True, False, False, False]
    sft_rows, _ = arena.rows("sft")
    assert sft_rows == [{"messages": [{"role": "user", "content": "The capital of France?"},
                                      {"role": "assistant", "content": "Paris, of course."}]}]
    one, two = arena.export("dpo"), arena.export("dpo")  # within one second: the second gets its own name
    assert one["path"] != two["path"] and one["rows"] == 2
    assert [json.loads(line) for line in Path(one["path"]).read_text().splitlines()] == dpo_rows
    planted = Path(two["path"]).with_name("arena-kto-planted.jsonl")
    planted.write_text("mine\n")
    arena.export("kto")
    assert planted.read_text() == "mine\n"
    assert models.asked and all(p.temperature == 0.0 for _, p in models.asked[-2:])


def test_the_judge_beside_the_people(arena: Arena) -> None:
    for choice in ("a", "b"):
        battle = _ready(arena, ["good", "bad"], blind=False)
        arena.vote(battle["id"], choice if battle["models"]["a"] == "good" else {"a": "b", "b": "a"}[choice])

    def judge(messages: list[dict[str, str]]) -> str:  # prefers Paris wherever it stands
        text = messages[-1]["content"]
        return "1" if text.index("Paris") < text.index("Rome") else "2"

    result = arena.judge(judge, {"url": "http://judge", "model": "j"})
    assert result["asked"] == 2 and result["judged"] == 2
    assert result["agreement"]["compared"] == 2 and result["agreement"]["agree"] == 1  # people said bad once
    assert arena.judge(judge, {})["asked"] == 0  # each battle is judged once


def test_endpoints_keep_the_name_of_the_key_never_the_key(arena: Arena, tmp_path: Path) -> None:
    with pytest.raises(ArenaInvalid, match="never the key itself"):
        arena.add_endpoint("gpt", "https://api.example.com/v1", "gpt-x", "sk-abc123")
    with pytest.raises(ArenaInvalid, match="http"):
        arena.add_endpoint("gpt", "ftp://x", "gpt-x", None)
    with pytest.raises(ArenaInvalid, match="one of the studio's own settings"):
        arena.add_endpoint("gpt", "https://api.example.com/v1", "gpt-x", "TUNESTUDIO_API_TOKEN")
    with pytest.raises(ArenaInvalid, match="a key travels over https only"):
        arena.add_endpoint("gpt", "http://api.example.com/v1", "gpt-x", "ARENA_TEST_KEY")
    added = arena.add_endpoint("gpt", "https://api.example.com/v1/", "gpt-x", "ARENA_TEST_KEY")
    assert added["id"] == "endpoint:gpt" and added["url"] == "https://api.example.com/v1" and not added["key_set"]
    arena.set_roster(["endpoint:gpt", "good"])
    assert [r["model"] for r in arena.roster()] == ["endpoint:gpt", "good"]
    arena.remove_endpoint("gpt")
    assert arena.roster()[0]["unavailable"] == "no such endpoint (add it first)"
