"""A capped subset of BFCL (the Berkeley Function-Calling Leaderboard) through tunestudio's /v1, before and after.

`bfcl-eval` on PyPI ships its data inside the wheel (bfcl_eval/data/BFCL_v4_*.json: the questions with their
function documents; possible_answer/: what a right call may hold). The package itself is not installed: it pins
numpy 1.26 and pulls a dozen providers' SDKs. This bench downloads the wheel alone (`pip download --no-deps`,
once, into --cache), reads two categories, the first --rows of each:

- simple_python: one function, one question, one right call;
- irrelevance: the functions given cannot answer the question; the right reply calls none;

and asks a running server's /v1/chat/completions, with the functions as OpenAI `tools` (BFCL's own conversion:
"dict" is "object", "float" is "number", a "." in a name is "_"), greedy, of `<job>:base` (before) and `<job>`
(after). Scored as BFCL's AST checker scores these categories, reduced to what they use: simple: exactly one
call, of the function, every required parameter given, each value among the possible answer's (strings compared
without case, spaces and ",./-_*^"; an int where a float is asked; "" among them: it may be left out), no
parameter the function lacks; irrelevance: no call. A request the server refuses (a prompt longer than the
model's context, for one) counts as wrong, and is counted apart.

    .venv/bin/python bench/bfcl_subset.py --base-url http://127.0.0.1:8765 --job ID [--rows 20]

The embedded tiny model cannot take these prompts (BFCL's function documents run past its 512 tokens), so the
figure means something for a real model only: there is no model hub on these machines (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import httpx

VERSION = "2026.3.23"  # the release read and checked when this was written
CATEGORIES = ("simple_python", "irrelevance")
TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "any": "string", "bool": "boolean"}


def wheel(cache: Path) -> Path:
    found = sorted(cache.glob(f"bfcl_eval-{VERSION}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"bfcl-eval=={VERSION}",
                        "-d", str(cache)], check=True)
        found = sorted(cache.glob(f"bfcl_eval-{VERSION}-*.whl"))
    return found[0]


def read(archive: zipfile.ZipFile, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in archive.read(name).decode("utf-8").splitlines() if line.strip()]


def schema(node: Any) -> Any:
    """A BFCL parameter schema as JSON Schema (its Python type names mapped)."""
    if isinstance(node, dict):
        out = {k: schema(v) for k, v in node.items()}
        if isinstance(out.get("type"), str):
            out["type"] = TYPES.get(out["type"], out["type"])
        return out
    return [schema(v) for v in node] if isinstance(node, list) else node


def tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f["name"].replace(".", "_"),
                                              "description": f.get("description", ""),
                                              "parameters": schema(f["parameters"])}} for f in functions]


def _same(value: Any, allowed: list[Any]) -> bool:
    def norm(v: Any) -> Any:
        return re.sub(r"[ ,./\-_*^]", "", v).lower() if isinstance(v, str) else v
    return any(norm(value) == norm(a) or (isinstance(a, float) and isinstance(value, int) and value == a)
               for a in allowed)


def right(calls: list[dict[str, Any]], item: dict[str, Any], answer: dict[str, Any] | None) -> bool:
    if answer is None:  # irrelevance
        return not calls
    if len(calls) != 1:
        return False
    (name, params), = answer["ground_truth"][0].items()
    function = next(f for f in item["function"] if f["name"] == name)
    if calls[0]["function"]["name"] != name.replace(".", "_"):
        return False
    try:
        given = json.loads(calls[0]["function"]["arguments"])
    except json.JSONDecodeError:
        return False
    known, required = function["parameters"].get("properties", {}), function["parameters"].get("required", [])
    if not isinstance(given, dict) or set(given) - set(known) or set(required) - set(given):
        return False
    return all((key in given and _same(given[key], allowed)) or (key not in given and "" in allowed)
               for key, allowed in params.items())


def ask(client: httpx.Client, model: str, item: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The calls the model makes (none when it answers), and whether the server took the request."""
    body = {"model": model, "messages": item["question"][0], "tools": tools(item["function"]), "temperature": 0,
            "max_tokens": 128}
    reply = client.post("/v1/chat/completions", json=body)
    if reply.status_code != 200:
        return [], False
    return reply.json()["choices"][0]["message"].get("tool_calls") or [], True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--job", required=True, help="the fine-tuning job's id (its base model: <id>:base)")
    parser.add_argument("--rows", type=int, default=20, help="questions per category")
    parser.add_argument("--token", default="", help="the server's API token, if it has one")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tunestudio-bench-bfcl"))
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    figures: dict[str, Any] = {}
    with zipfile.ZipFile(wheel(args.cache)) as archive, \
            httpx.Client(base_url=args.base_url, headers=headers, timeout=600) as client:
        for category in CATEGORIES:
            items = read(archive, f"bfcl_eval/data/BFCL_v4_{category}.json")[: args.rows]
            answers: dict[str, Any] = {}
            if category != "irrelevance":
                answers = {a["id"]: a for a in read(archive, f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json")}
            for label, model in (("before", f"{args.job}:base"), ("after", args.job)):
                results = [ask(client, model, item) for item in items]
                score = sum(ok and right(calls, item, answers.get(item["id"]) if answers else None)
                            for (calls, ok), item in zip(results, items, strict=True))
                figures[f"{category}_{label}"] = {"accuracy": score / len(items), "rows": len(items),
                                                  "refused": sum(not ok for _, ok in results)}
                print(f"{category:14s} {label:6s} {score}/{len(items)} right, "
                      f"{figures[f'{category}_{label}']['refused']} refused by the server")
    print(json.dumps({"bench": "bfcl_subset", "version": VERSION, "job": args.job, "figures": figures}))


if __name__ == "__main__":
    main()
