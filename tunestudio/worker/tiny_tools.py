"""The bundled tool-calling dataset: two tools the tiny model learns to call, and questions it answers without them.

Separate from tiny.py on purpose, as tiny_methods.py is: the Makefile rebuilds the tiny model whenever tiny.py
changes, and these files change nothing about the model.

The tiny model learns lookups, not copying (tiny.py and ../shared/reference/FACTS.md): it cannot put an arbitrary
city into a call. So every argument value comes from a closed set that training shows many times (six cities, the
amounts 1 to 9, four currencies), and the held-out rows (tools_eval.jsonl) combine them in ways training never
shows: a city asked about in a phrasing it was never asked in, an (amount, from, to) triple that never trains.
Each single value, phrasing and currency pair does train. The call accuracy on the held-out rows therefore measures
whether the model picks the right tool and fills each argument from the question, for values it knows; not whether
it can call a tool with a value it never saw.

Rows are OpenAI's fine-tuning format: {"messages": [...], "tools": [...]}, assistant calls in `tool_calls` with
JSON-string arguments, results in `tool` turns with their `tool_call_id`. Five kinds of row:
- a weather question and its `get_weather` call;
- a conversion question and its `convert` call;
- a lookup question of the bundled dataset (tiny.make_rows), answered without a call although the tools are there;
- the whole loop: a question, its call, the tool's result and the answer read from that result (the sky of the
  weather, the converted amount);
- in training only, a digit repeated or a number turned from words into digits or back ("Write the number in
  digits.\n\nthree" → "3"): the pre-training text has number words but no digits, which a real model's has.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

from tunestudio.worker.tiny import DEFAULT_SEED, NUMBERS, alpaca_user_text, make_rows

TRAIN_ROWS = 500
EVAL_ROWS = 48
# As short as JSON Schema allows (no descriptions, no "required"): the tiny model's tokenizer, learnt on the lookup
# rows, spends about one token per character of JSON, so these two take some 300 of its 512 positions.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "convert", "parameters": {
        "type": "object", "properties": {"amount": {"type": "integer"}, "from": {"type": "string"},
                                         "to": {"type": "string"}}}}},
]
CITIES = ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo")
# Asked as the bundled lookups are (alpaca_user_text: an instruction, a blank line, the input): the short
# pre-training taught the model to read the words after the blank line, which is where the arguments stand.
WEATHER_ASKED = ("What is the weather like?", "Is it raining there?", "How warm is it?", "Give me the weather report.")
SKIES = ("sunny", "rainy", "cloudy", "snowy")
CURRENCIES = ("EUR", "USD", "GBP", "JPY")
AMOUNTS = tuple(range(1, 10))
CONVERT_ASKED = ("Convert the money.", "How much is it in the other currency?")
# The pre-training text has number words ("What number comes next?") but no digits, so a digit's embedding and
# output row are untrained: the model wrote one amount whatever was asked. Rows that repeat a digit, or turn a number
# word into digits and back, teach the digits as a real model's pre-training would; they are answered without a
# call, and only train (bench/RESULTS.md: with them and more conversions, held-out call accuracy 58 % -> 79 % at the
# same 3,000 probe steps).
NUMBER_ASKED = ("Repeat the number.", "Write the number in digits.", "Write the number in words.")
TRIPLES = tuple((a, s, t) for a in AMOUNTS for s, t in itertools.permutations(CURRENCIES, 2))
# What one unit of each is worth in toy money: the tool answers whole numbers.
RATES = {"EUR": 11, "USD": 10, "GBP": 13, "JPY": 1}


def _held_out_weather() -> set[tuple[int, str]]:
    """(phrasing, city) pairs kept for evaluation: one per city, each phrasing held out for some city, so every city
    and every phrasing still trains."""
    return {(i % len(WEATHER_ASKED), city) for i, city in enumerate(CITIES)}


def _held_out_convert(rng: random.Random) -> set[tuple[int, str, str]]:
    """(amount, from, to) triples kept for evaluation: a fifth of them, every amount and currency pair still trains."""
    triples = list(TRIPLES)
    rng.shuffle(triples)
    return set(triples[: len(triples) // 5])


def _call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _weather(rng: random.Random, asked: int, city: str, n: int, loop: bool) -> list[dict[str, Any]]:
    call = _call("get_weather", {"city": city}, n)
    messages = [{"role": "user", "content": f"{WEATHER_ASKED[asked]}\n\n{city}"},
                {"role": "assistant", "tool_calls": [call]}]
    if loop:
        sky = rng.choice(SKIES)
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"city": city, "sky": sky})},
                     {"role": "assistant", "content": f"It is {sky} in {city}."}]
    return messages


def _convert(rng: random.Random, triple: tuple[int, str, str], n: int, loop: bool) -> list[dict[str, Any]]:
    amount, source, target = triple
    call = _call("convert", {"amount": amount, "from": source, "to": target}, n)
    asked = f"{rng.choice(CONVERT_ASKED)}\n\n{amount} {source} to {target}"
    messages = [{"role": "user", "content": asked}, {"role": "assistant", "tool_calls": [call]}]
    if loop:
        result = max(1, round(amount * RATES[source] / RATES[target]))
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"result": result})},
                     {"role": "assistant", "content": f"That is {result} {target}."}]
    return messages


def _lookup(row: dict[str, str]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": alpaca_user_text(row)}, {"role": "assistant", "content": row["output"]}]


def _number(rng: random.Random) -> list[dict[str, Any]]:
    """Half the time a digit repeated, else a number word into digits or a digit into its word."""
    amount = rng.choice(AMOUNTS)
    word, digits = NUMBERS[amount - 1], str(amount)
    draw = rng.random()
    asked, answer, kind = (digits, digits, 0) if draw < 0.5 else (word, digits, 1) if draw < 0.75 else (digits, word, 2)
    return [{"role": "user", "content": f"{NUMBER_ASKED[kind]}\n\n{asked}"},
            {"role": "assistant", "content": answer}]


def make_tool_rows(n: int, seed: int, held_out: bool) -> list[dict[str, Any]]:
    """n rows, deterministic for a seed: training rows (held_out False) or the held-out rows (True), which share
    no (phrasing, city) pair and no (amount, from, to) triple with them. Of every eight rows: two weather calls,
    two conversions, two lookups answered without a call, and one whole loop of each tool. Of every ten training rows:
    one weather call and one weather loop, three conversions and one conversion loop (the amount is the argument
    the tiny model learns last), two lookups, and two number rows (_number)."""
    rng = random.Random(seed)
    kept_weather, kept_convert = _held_out_weather(), _held_out_convert(random.Random(seed))
    weather = [p for p in itertools.product(range(len(WEATHER_ASKED)), CITIES) if (p in kept_weather) == held_out]
    convert = [t for t in TRIPLES if (t in kept_convert) == held_out]
    lookups = make_rows(n, seed + (2 if held_out else 1))  # other seeds than the bundled alpaca rows
    cycle = (0, 1, 2, 0, 0, 1, 2, 1) if held_out else (0, 1, 2, 0, 1, 1, 2, 1, 3, 3)
    rows = []
    for i in range(n):
        kind, loop = cycle[i % len(cycle)], i % len(cycle) in (3, 7)
        if kind == 0:
            messages = _weather(rng, *rng.choice(weather), n=i, loop=loop)
        elif kind == 1:
            messages = _convert(rng, rng.choice(convert), n=i, loop=loop)
        elif kind == 2:
            messages = _lookup(lookups[i])
        else:
            messages = _number(rng)
        rows.append({"messages": messages, "tools": TOOLS})
    return rows


def write_tool_datasets(directory: str | Path, seed: int = DEFAULT_SEED) -> list[Path]:
    """tools.jsonl (training) and tools_eval.jsonl (held out: examples/tools.yaml's eval_split)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in (("tools.jsonl", make_tool_rows(TRAIN_ROWS, seed, held_out=False)),
                       ("tools_eval.jsonl", make_tool_rows(EVAL_ROWS, seed, held_out=True))):
        path = out / name
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        written.append(path)
    return written
