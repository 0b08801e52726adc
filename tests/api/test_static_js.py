"""The web page's script modules, read as text (no browser): the rules a reviewer would otherwise check by eye."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tunestudio.api import STATIC

JS = sorted((STATIC / "js").glob("*.js"))
# The DOM's own ways to put children: each writes a null, undefined or false child as the text "null" (issue 38: a
# heading row read "row | loss | null | prompt", and "null" stood under every dataset preview). Only util.js's
# helpers (replaceKids, appendKids, insertAfter) call them, on children they have filtered (`...kept(`).
RAW_PUT = re.compile(r"\.(replaceChildren|append|prepend|before|after|replaceWith)\((?!\.\.\.kept\()")


def test_the_page_puts_children_only_through_the_helpers_that_drop_nulls() -> None:
    assert len(JS) > 20
    raw = [f"{path.name}:{number}: {line.strip()}" for path in JS
           for number, line in enumerate(path.read_text().splitlines(), 1) if RAW_PUT.search(line)]
    assert raw == [], "use util.js's replaceKids/appendKids/insertAfter, which drop null children:\n" + "\n".join(raw)



@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_running_jobs_badge_says_the_step_it_is_in() -> None:
    """Issue 38, finding 12: while the base model is evaluated the status is still loading_dataset; the badge said
    "loading dataset" beside "evaluating base 10 / 10"."""
    script = f"""
import {{jobActivity}} from "{(STATIC / 'js' / 'util.js').as_uri()}";
const cases = [["loading_dataset", "evaluating_base"], ["saving", "generating"], ["training", "training"],
  ["stopping", "evaluating_base"], ["completed", "generating"], ["queued", null]];
console.log(JSON.stringify(cases.map(([status, phase]) => jobActivity({{status, phase}}))));
"""
    proc = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["evaluating_base", "generating", "training", "stopping", "completed", "queued"]
