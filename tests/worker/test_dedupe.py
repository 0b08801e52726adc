"""Duplicate rows (worker/data/dedupe.py): what counts as the same, what as near, which copy stays."""

from __future__ import annotations

import random

from tunestudio.worker.data import dedupe


def conversation(user: str, assistant: str) -> dict:
    return {"prompt": [{"role": "user", "content": user}], "completion": [{"role": "assistant", "content": assistant}]}


def sentence(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(n))


def test_exact_means_the_same_after_normalising_whitespace_and_nothing_else() -> None:
    a = conversation("What is  the\tcapital?\n", "Paris")
    assert dedupe.exact_key(a) == dedupe.exact_key(conversation(" What is the capital?", "Paris "))
    assert dedupe.exact_key(a) != dedupe.exact_key(conversation("what is the capital?", "Paris"))  # case counts
    # the same words split differently between prompt and completion are different rows
    split = dedupe.exact_key({"prompt": "a", "completion": "b c"})
    assert dedupe.exact_key({"prompt": "a b", "completion": "c"}) != split


def test_near_is_at_or_above_the_threshold_and_the_first_copy_is_kept() -> None:
    rng = random.Random(3)
    base = [conversation(sentence(rng, 8), sentence(rng, 30)) for _ in range(20)]
    one_word = conversation(base[4]["prompt"][0]["content"],
                            base[4]["completion"][0]["content"].rsplit(" ", 1)[0] + " zzzzzz")
    half = conversation(base[7]["prompt"][0]["content"], sentence(rng, 30))  # the answer replaced: far below
    rows = [*base, one_word, base[9], half]
    found = dedupe.find(rows, near=True)
    assert found.exact == {21: 9}
    assert list(found.near) == [20] and found.near[20][0] == 4 and found.near[20][1] >= dedupe.NEAR_THRESHOLD
    kept, removed = dedupe.dedupe(rows, "near")
    assert removed == 2 and kept == [*base, half]  # order kept, the first of each
    assert dedupe.dedupe(rows, "exact") == ([*base, one_word, half], 1)
    assert dedupe.dedupe(rows, "off") == (rows, 0)


def test_a_near_copy_of_a_near_copy_points_at_the_row_that_is_kept() -> None:
    rng = random.Random(4)
    first = sentence(rng, 40)
    second = first.rsplit(" ", 1)[0] + " yyyyyy"
    third = second.rsplit(" ", 2)[0] + " xxxxxx yyyyyy"
    found = dedupe.find([{"text": first}, {"text": second}, {"text": third}], near=True)
    assert {row: match[0] for row, match in found.near.items()} == {1: 0, 2: 0}
