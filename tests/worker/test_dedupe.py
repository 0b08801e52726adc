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


def test_rows_that_differ_only_in_punctuation_case_or_spacing_are_near_and_distinct_rows_are_not() -> None:
    """Issue 38 finding 6: "cedar." and "cedar" are one word (text is casefolded, punctuation and spacing do not
    count) for the report and for `dedupe: near` alike; exact stays exact (case and punctuation count)."""
    rng = random.Random(6)
    base = [conversation(sentence(rng, 8), sentence(rng, 12)) for _ in range(10)]
    same_words = conversation(base[0]["prompt"][0]["content"], base[3]["completion"][0]["content"])  # new pair
    variants = {
        10: (0, lambda s: s.capitalize() + "."),
        11: (1, str.upper),
        12: (2, lambda s: s.replace(" ", ",  ", 3) + "!"),
        13: (4, lambda s: " ... ".join(s.split(" ", 1)) + "?"),
        14: (6, lambda s: s.replace(" ", "\t-- ", 2).title()),
    }
    rows = [*base]
    for copy, (original, change) in variants.items():
        row = base[original]
        rows.append(conversation(change(row["prompt"][0]["content"]), change(row["completion"][0]["content"])))
        assert len(rows) - 1 == copy and dedupe.exact_key(rows[copy]) != dedupe.exact_key(row)
    rows.append(same_words)
    found = dedupe.find(rows, near=True)
    assert found.exact == {}
    assert {row: match[0] for row, match in found.near.items()} == {c: o for c, (o, _) in variants.items()}
    assert all(similarity == 1.0 for _, similarity in found.near.values())
    kept, removed = dedupe.dedupe(rows, "near")  # a job's dedupe: near removes the same rows
    assert removed == 5 and kept == [*base, same_words]


def test_the_fast_ascii_words_are_the_normalised_words() -> None:
    """minhash.words reads ASCII text by a byte table: the same words as the rule (casefold, split at every run of
    anything but letters and digits), which Unicode text is read by."""
    import re
    import string

    from tunestudio.worker.data import minhash

    rng = random.Random(7)
    for text in ["".join(rng.choice(string.printable) for _ in range(rng.randint(0, 80))) for _ in range(500)]:
        assert minhash.words(text) == re.sub(r"[\W_]+", " ", text.casefold()).encode().split(), text
    assert minhash.words("Cedar. the  CEDAR_x, don't") == [b"cedar", b"the", b"cedar", b"x", b"don", b"t"]
    assert minhash.words("Café, CAFÉ!") == ["café".encode()] * 2
