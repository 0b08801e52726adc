"""The web page's script modules, read as text (no browser): the rules a reviewer would otherwise check by eye."""

from __future__ import annotations

import re

from tunestudio.api import STATIC

JS = sorted((STATIC / "js").glob("*.js"))
# The DOM's own ways to put children: each writes a null, undefined or false child as the text "null" (issue 38: a
# heading row read "row | loss | null | prompt", and "null" stood under every dataset preview). Only util.js's
# helpers (fill, put, putAfter) call them, on children they have filtered (`...kept(`).
RAW_PUT = re.compile(r"\.(replaceChildren|append|prepend|before|after|replaceWith)\((?!\.\.\.kept\()")


def test_the_page_puts_children_only_through_the_helpers_that_drop_nulls() -> None:
    assert len(JS) > 20
    raw = [f"{path.name}:{number}: {line.strip()}" for path in JS
           for number, line in enumerate(path.read_text().splitlines(), 1) if RAW_PUT.search(line)]
    assert raw == [], "use util.js's fill/put/putAfter, which drop null children:\n" + "\n".join(raw)

