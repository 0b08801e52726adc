"""The questions the recipe's judge (gates.judge) is asked about a made row, and its replies read.

score: the row against the rubric, from 1 to 10 ("Score: N"). grounding: whether every fact of the row's answers is
stated in its chunk ("yes" or "no"). rank (preference without rejected_by): which of two answers to one prompt is
better ("1", "2" or "tie"), asked in both orders by job.py so that a judge that prefers a side decides nothing.
A reply that says none of these reads as None: the row is removed by the gate, with the reply as its reason.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["grounding_request", "parse_rank", "parse_score", "parse_yes_no", "rank_request", "score_request",
           "shown"]

_SYSTEM = "You are a strict, fair grader of training data. Reply in the exact format asked for and nothing else."
_SCORE = re.compile(r"score\s*[:=]?\s*\**\s*(\d{1,2})(?:\s*/\s*10)?\b", re.I)
_LONE = re.compile(r"^\s*\**(\d{1,2})(?:\s*/\s*10)?\**\s*\.?\s*$")
_WORD = re.compile(r"[a-z0-9]+")


def shown(messages: list[dict[str, Any]]) -> str:
    """A row's turns as the judge reads them; a tool call as `name(arguments)`."""
    lines = []
    for turn in messages:
        text = str(turn.get("content") or "")
        calls = [f"calls {c['function']['name']}({c['function']['arguments']})" for c in turn.get("tool_calls", ())]
        lines.append(f"{turn['role']}: " + "\n".join(filter(None, [text, *calls])))
    return "\n".join(lines)


def _asked(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": text}]


def score_request(rubric: str, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return _asked(f"Rubric: {rubric}\n\nConversation:\n<<<\n{shown(messages)}\n>>>\n\nGrade the assistant's turns "
                  "against the rubric, from 1 (fails it) to 10 (meets it fully). Reply with \"Score: N\" only.")


def parse_score(reply: str) -> int | None:
    found = _SCORE.search(reply) or _LONE.match(reply)
    score = int(found.group(1)) if found else None
    return score if score is not None and 1 <= score <= 10 else None


def grounding_request(chunk: str, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return _asked(f"Excerpt:\n<<<\n{chunk}\n>>>\n\nConversation:\n<<<\n{shown(messages)}\n>>>\n\nIs every fact the "
                  "assistant states in the conversation stated in the excerpt? Reply \"yes\" or \"no\" only.")


def parse_yes_no(reply: str) -> bool | None:
    words = _WORD.findall(reply.casefold())
    first = words[0] if words else None
    return {"yes": True, "no": False}.get(first or "")


def rank_request(prompt: list[dict[str, Any]], first: str, second: str) -> list[dict[str, str]]:
    return _asked(f"Conversation so far:\n<<<\n{shown(prompt)}\n>>>\n\nAnswer 1:\n<<<\n{first}\n>>>\n\nAnswer 2:\n"
                  f"<<<\n{second}\n>>>\n\nWhich answer is the better reply to the conversation? Reply \"1\", \"2\" "
                  "or \"tie\" only.")


def parse_rank(reply: str) -> str | None:
    words = _WORD.findall(reply.casefold())
    first = words[0] if words else None
    if first in ("1", "2", "tie"):
        return first
    if first == "answer" and len(words) > 1 and words[1] in ("1", "2"):
        return words[1]
    return None
