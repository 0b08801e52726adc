"""The arena: two models answer one prompt, a person votes, the votes become a leaderboard and training data.

Parent side, no torch. The studio's own models (`<job>`, `<job>:base`) answer through an `Answerer` the face wires
to the inference pool (the path `/v1/chat/completions` takes); an endpoint the user added (`endpoint:<name>`)
answers through the studio's one OpenAI client, its key read from the environment variable the user named, at
the call, never stored. The two models of a battle answer one after the other, never at once, and the inference
worker keeps at most two base models loaded (jobs of one base share it): an arena of five jobs does not hold five
models in memory.

Blind battles are blind on the server: until its vote is stored, no answer about a battle names its models (an
answer's error has the model's name replaced by its side), and the two are drawn from the chosen models in a
random order.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tunestudio.arena.ratings import CHOICES, Vote, leaderboard
from tunestudio.arena.store import ArenaStore, UnknownBattle, VoteRefused
from tunestudio.judge import Answerer, JudgeError, Messages, judge_row
from tunestudio.openai_client import ClientError, OpenAIClient

__all__ = ["ENDPOINT", "EXPORTS", "Arena", "ArenaInvalid", "Params", "UnknownBattle", "VoteRefused"]

ENDPOINT = "endpoint:"  # the prefix of an added endpoint's model id
EXPORTS = ("dpo", "kto", "sft")  # dpo: chosen/rejected pairs (DPO, ORPO, reward); kto: labelled rows; sft: edits
MAX_MODELS = 16
MAX_EDIT = 20_000
_KEY_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENDPOINT_DEADLINE_S = 300.0


class ArenaInvalid(ValueError):
    """A request the arena refuses before storing anything; `field` names what to change."""

    def __init__(self, field: str, message: str, conflict: bool = False) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.conflict = field, conflict


@dataclass(frozen=True)
class Params:
    """The sampling settings both models answer with (stored with the battle)."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 256


AnswererFor = Callable[[str, Params], Answerer]  # a studio model id -> its answerer (the face's pool)
Check = Callable[[str], str | None]  # a studio model id -> why it cannot answer, or None


class Arena:
    def __init__(self, path: Path, exports: Path, answerer_for: AnswererFor, check: Check,
                 serving: bool = True) -> None:
        """serving: this process answers battles (the server), so any left answering by an earlier one failed; a
        reader (the CLI) leaves them as they are."""
        self.store = ArenaStore(path)
        self.exports = exports
        self.answerer_for, self.check = answerer_for, check
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        if serving:
            self.store.interrupted()

    # --- battles -------------------------------------------------------------------------
    def start(self, messages: Messages, models: Sequence[str] | None = None, blind: bool = True,
              params: Params | None = None, source: str = "") -> dict[str, Any]:
        """Draw two of `models` (default: the roster) that can answer now, in a random order, and start their
        answers; the battle as the voter sees it."""
        chosen = list(dict.fromkeys(m.strip() for m in (self.store.roster() if models is None else models)
                                    if m.strip()))
        if len(chosen) < 2:
            raise ArenaInvalid("models", "an arena needs two different models at least (got "
                               f"{len(chosen)}): add a job, its base (ID:base) or an endpoint")
        if len(chosen) > MAX_MODELS:
            raise ArenaInvalid("models", f"at most {MAX_MODELS} models")
        if not messages or messages[-1].get("role") != "user":
            raise ArenaInvalid("prompt", "the conversation must end with the user's turn")
        why = {m: self._why_not(m) for m in chosen}
        ready = [m for m in chosen if why[m] is None]
        if len(ready) < 2:
            raise ArenaInvalid("models", f"{len(ready)} of the {len(chosen)} models can answer now; two must: "
                               + "; ".join(f"{m}: {w}" for m, w in why.items() if w), conflict=True)
        chosen = ready
        model_a, model_b = secrets.SystemRandom().sample(chosen, 2)
        params = params or Params()
        shown = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        record = {"id": f"bat-{secrets.token_hex(6)}", "created_at": time.time(), "status": "answering",
                  "messages": messages, "prompt": shown, "model_a": model_a, "model_b": model_b,
                  "params": asdict(params), "blind": int(blind), "source": source}
        self.store.add_battle(record)
        thread = threading.Thread(target=self._answer, args=(record["id"], messages, model_a, model_b, params),
                                  name=f"arena-{record['id']}", daemon=True)
        with self._lock:
            self._threads[record["id"]] = thread
        thread.start()
        return self.battle(record["id"])

    def battle(self, battle_id: str) -> dict[str, Any]:
        return self._view(self.store.battle(battle_id))

    def _view(self, record: dict[str, Any]) -> dict[str, Any]:
        """`view`, with what else would name a blind battle's models: their endpoints' URLs and model names."""
        endpoints = {ENDPOINT + e["name"]: e for e in self.store.endpoints()}
        extra = [str(endpoints[m][k]) for m in (record["model_a"], record["model_b"]) if m in endpoints
                 for k in ("url", "model")]
        return view(record, extra)

    def wait(self, battle_id: str, timeout: float | None = None) -> dict[str, Any]:
        with self._lock:
            thread = self._threads.get(battle_id)
        if thread is not None:
            thread.join(timeout)
        return self.battle(battle_id)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout)
        self.store.close()

    def _answer(self, battle_id: str, messages: Messages, model_a: str, model_b: str, params: Params) -> None:
        answers: list[str | None] = [None, None]
        error = None
        for side, model in enumerate((model_a, model_b)):  # one at a time
            try:
                answers[side] = self._answerer(model, params)(messages)
            except (JudgeError, ClientError) as exc:
                error = f"answer {'AB'[side]}: {exc}"
                break
            except Exception as exc:  # a bug here must not leave the battle answering forever
                error = f"answer {'AB'[side]}: {type(exc).__name__}: {exc}"
                break
        try:
            self.store.answered(battle_id, answers[0], answers[1], error)
        finally:
            with self._lock:
                self._threads.pop(battle_id, None)

    def _answerer(self, model: str, params: Params) -> Answerer:
        if not model.startswith(ENDPOINT):
            return self.answerer_for(model, params)
        found = {e["name"]: e for e in self.store.endpoints()}.get(model.removeprefix(ENDPOINT))
        if found is None:
            raise JudgeError(f"{model}: the endpoint was removed")
        key = os.environ.get(found["key_env"]) if found["key_env"] else None
        client = OpenAIClient(found["url"], key, deadline_s=ENDPOINT_DEADLINE_S, name=model)

        def answer(messages: Messages) -> str:
            return client.chat(found["model"], messages, temperature=params.temperature, top_p=params.top_p,
                               max_tokens=params.max_tokens)

        return answer

    def _why_not(self, model: str) -> str | None:
        if model.startswith(ENDPOINT):
            names = {e["name"] for e in self.store.endpoints()}
            return None if model.removeprefix(ENDPOINT) in names else "no such endpoint (add it first)"
        return self.check(model)

    # --- the roster ----------------------------------------------------------------------
    def roster(self) -> list[dict[str, Any]]:
        """The models battles are drawn from, each with why it cannot answer now (None: it can)."""
        return [{"model": m, "unavailable": self._why_not(m)} for m in self.store.roster()]

    def set_roster(self, models: Sequence[str]) -> list[dict[str, Any]]:
        chosen = list(dict.fromkeys(m.strip() for m in models if m.strip()))
        if len(chosen) > MAX_MODELS:
            raise ArenaInvalid("models", f"at most {MAX_MODELS} models")
        for model in chosen:
            if model.startswith(ENDPOINT) and self._why_not(model):
                raise ArenaInvalid("models", f"{model}: no such endpoint (add it first)")
        self.store.set_roster(chosen)
        return self.roster()

    def join(self, model: str) -> None:
        self.store.join(model)

    # --- votes ---------------------------------------------------------------------------
    def vote(self, battle_id: str, choice: str, edited: str | None = None) -> dict[str, Any]:
        """Store a person's vote (a, b, tie, both_bad), with the better answer edited if they like; the battle with
        its models named."""
        if choice not in CHOICES:
            raise ArenaInvalid("choice", f"{choice!r} is not one of {', '.join(CHOICES)}")
        if edited is not None:
            if choice not in ("a", "b"):
                raise ArenaInvalid("edited", "only the better answer can be edited: vote a or b")
            if not edited.strip():
                raise ArenaInvalid("edited", "the edited answer is empty")
            if len(edited) > MAX_EDIT:
                raise ArenaInvalid("edited", f"at most {MAX_EDIT} characters")
            record = self.store.battle(battle_id)
            if edited == record.get(f"answer_{choice}"):
                edited = None  # unchanged: no edit
        self.store.vote(battle_id, choice, edited)
        return self.battle(battle_id)  # voted: the models are named

    def undo(self) -> dict[str, Any]:
        battle_id = self.store.undo()
        if battle_id is None:
            raise ArenaInvalid("vote", "there is no vote to undo", conflict=True)
        return self.battle(battle_id)

    def votes(self, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        return [view(r) for r in self.store.votes(limit, offset)]  # voted battles: nothing hidden

    def progress(self) -> dict[str, int]:
        counts = self.store.counts()
        return {"votes": counts.get("voted", 0), "ready": counts.get("ready", 0),
                "answering": counts.get("answering", 0), "failed": counts.get("failed", 0)}

    def leaderboard(self, models: Sequence[str] = ()) -> dict[str, Any]:
        votes = [Vote(r["model_a"], r["model_b"], r["choice"], (r.get("judge") or {}).get("choice"))
                 for r in self.store.votes()]
        return leaderboard(votes, models)

    # --- the judge beside the people -----------------------------------------------------
    def judge(self, ask: Callable[[Messages], str], describe: dict[str, str], limit: int = 20) -> dict[str, Any]:
        """Ask the judge (both orders, as judgements do) about voted battles it has not seen, up to `limit`."""
        asked = judged = 0
        for record in self.store.votes():
            if asked >= limit:
                break
            if record.get("judge") and record["judge"].get("choice"):
                continue
            asked += 1
            row = judge_row(0, record["messages"], lambda _m, r=record: r["answer_a"],
                            lambda _m, r=record: r["answer_b"], ask)
            choice = {"win": "a", "loss": "b", "tie": "tie"}.get(row.outcome)
            judged += choice is not None
            self.store.set_judge(record["id"], {"choice": choice, "error": row.error, "judge": describe,
                                                "reasons": [v.reason for v in (row.first, row.second) if v]})
        return {"asked": asked, "judged": judged, "agreement": self.leaderboard()["judge"]}

    # --- endpoints -----------------------------------------------------------------------
    def add_endpoint(self, name: str, url: str, model: str, key_env: str | None) -> dict[str, Any]:
        if not _NAME.match(name):
            raise ArenaInvalid("name", "letters, digits, '.', '_' and '-' (64 at most), starting with a letter or "
                               "digit")
        if not url.startswith(("http://", "https://")):
            raise ArenaInvalid("url", f"{url!r} is not an http(s) URL (the API's base, e.g. http://host:port/v1)")
        if key_env is not None and not _KEY_ENV.match(key_env):
            raise ArenaInvalid("key_env", "the *name* of an environment variable holding the key (e.g. "
                               "OPENAI_API_KEY), never the key itself")
        if key_env is not None and key_env.upper().startswith("TUNESTUDIO_"):
            raise ArenaInvalid("key_env", f"{key_env} is one of the studio's own settings, not an endpoint's key")
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError as exc:  # "http://[" and the like
            raise ArenaInvalid("url", f"{url!r} is not a URL: {exc}") from None
        if key_env is not None and url.startswith("http://") and host not in ("127.0.0.1", "localhost", "::1"):
            raise ArenaInvalid("url", "a key travels over https only (or to this machine): use an https:// URL, or "
                               "leave key_env unset")
        self.store.add_endpoint(name, url.rstrip("/"), model, key_env)
        return self.endpoint(name)

    def endpoint(self, name: str) -> dict[str, Any]:
        found = {e["name"]: e for e in self.store.endpoints()}.get(name)
        if found is None:
            raise ArenaInvalid("name", f"no endpoint {name!r}", conflict=True)
        return {**found, "id": ENDPOINT + name, "key_set": bool(found["key_env"] and os.environ.get(found["key_env"]))}

    def endpoints(self) -> list[dict[str, Any]]:
        return [self.endpoint(e["name"]) for e in self.store.endpoints()]

    def remove_endpoint(self, name: str) -> None:
        if not self.store.remove_endpoint(name):
            raise ArenaInvalid("name", f"no endpoint {name!r}", conflict=True)

    # --- training data -------------------------------------------------------------------
    def rows(self, kind: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The votes as rows of `kind` (EXPORTS), and how many votes each reason left out."""
        if kind not in EXPORTS:
            raise ArenaInvalid("format", f"{kind!r} is not one of {', '.join(EXPORTS)}")
        rows: list[dict[str, Any]] = []
        skipped: dict[str, int] = {}

        def skip(why: str) -> None:
            skipped[why] = skipped.get(why, 0) + 1

        for r in self.store.votes():
            prompt, choice = r["messages"], r["choice"]
            if kind == "sft":
                if r["edited"]:
                    rows.append({"messages": [*prompt, _reply(r["edited"])]})
                else:
                    skip("not edited")
                continue
            if choice in ("a", "b"):
                chosen = r["edited"] or r[f"answer_{choice}"]
                rejected = r["answer_b" if choice == "a" else "answer_a"]
                if chosen.strip() == rejected.strip():
                    skip("identical answers")
                elif kind == "dpo":
                    rows.append({"prompt": prompt, "chosen": [_reply(chosen)], "rejected": [_reply(rejected)]})
                else:
                    rows += [{"prompt": prompt, "completion": [_reply(chosen)], "label": True},
                             {"prompt": prompt, "completion": [_reply(rejected)], "label": False}]
            elif choice == "both_bad" and kind == "kto":
                rows += [{"prompt": prompt, "completion": [_reply(r[f"answer_{s}"])], "label": False} for s in "ab"]
            else:
                skip("tie" if choice == "tie" else "both bad")
        return rows, skipped

    def export(self, kind: str, out: Path | None = None) -> dict[str, Any]:
        """Write the votes as a new JSONL dataset: at `out`, or a new name in the arena's folder; never over a
        file. Its path and counts."""
        rows, skipped = self.rows(kind)
        if not rows:
            raise ArenaInvalid("format", f"no vote makes a {kind} row yet ({_said(skipped) or 'no votes'})",
                               conflict=True)
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if out is not None:
            try:
                _write_new(out, text)
            except FileExistsError:
                raise ArenaInvalid("out", f"{out} exists: the arena never writes over a file", conflict=True) from None
            path = out
        else:
            self.exports.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            for n in itertools.count(1):
                path = self.exports / f"arena-{kind}-{stamp}{'' if n == 1 else f'-{n}'}.jsonl"
                try:
                    _write_new(path, text)
                    break
                except FileExistsError:
                    continue
        return {"path": str(path), "format": kind, "rows": len(rows), "skipped": skipped}


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text`; FileExistsError (nothing touched) where something is there."""
    with path.open("x", encoding="utf-8") as out:
        out.write(text)


def _reply(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _said(skipped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in skipped.items())


_URL_OR_PATH = re.compile(r"https?://\S+|(?<![\w.])/[^\s:,;'\"]+")


def redacted(error: str, record: dict[str, Any], extra: Sequence[str] = ()) -> str:
    """A blind battle's error with every name of its models replaced by its side: their ids (the longer first, in
    one pass, so that `job:base` is not read as `job` plus a suffix), the jobs' ids under them, `extra` (endpoints'
    URLs and model names), and any URL or absolute path (a base model's folder names it)."""
    sides = {record["model_a"]: "model A", record["model_b"]: "model B"}
    for model, side in list(sides.items()):
        sides.setdefault(model.removeprefix(ENDPOINT).removesuffix(":base"), side)
    names = {**{e: "the endpoint" for e in extra if e}, **sides}
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])(?:{alternatives})(?![\w-])")  # whole names: an endpoint "a" is no letter
    return _URL_OR_PATH.sub("<hidden>", pattern.sub(lambda m: names[m.group(0)], error))


def view(record: dict[str, Any], extra: Sequence[str] = ()) -> dict[str, Any]:
    """A battle as the API shows it: blind and not voted, no model is named anywhere in it."""
    voted = record["status"] == "voted"
    hidden = record["blind"] and not voted
    error = record.get("error")
    if error and hidden:
        error = redacted(error, record, extra)
    shown = record["status"] in ("ready", "voted")
    out = {"id": record["id"], "status": record["status"], "created_at": record["created_at"],
           "prompt": record["prompt"], "messages": record["messages"], "params": record["params"],
           "blind": record["blind"], "source": record.get("source") or "", "error": error,
           "answers": {"a": record["answer_a"], "b": record["answer_b"]} if shown else None,
           "models": None if hidden else {"a": record["model_a"], "b": record["model_b"]}}
    if voted:
        out["vote"] = {"choice": record["choice"], "edited": record.get("edited"), "voted_at": record["voted_at"]}
        out["judge"] = record.get("judge")
    return out
