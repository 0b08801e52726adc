"""A flood of dataset previews must not stall the other routes (issue 30): a waiting preview holds no thread.

How fast the job list answers meanwhile is bench/preview_flood.py's figure; here, an order: its 20 requests are
answered while the flood goes on and while few previews start (a waiting preview that held one of the server's
threads would make each request wait for a preview to end: about one preview started per request), and every
preview is answered, 200 or a 429 that says to try again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers.flood import FLOOD, flood_previews


@pytest.mark.timeout(120)
def test_a_preview_flood_leaves_the_job_list_answering_and_every_preview_answers_200_or_429(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunestudio.api import preview

    result = flood_previews(tmp_path / "home", monkeypatch)
    assert result.during, "the flood was over before the job list answered: previews held the server's threads"
    assert result.previews_meanwhile < 10, f"{result.previews_meanwhile} previews ran while 20 job lists answered"
    assert len(result.statuses) == FLOOD and set(result.statuses) <= {200, 429}, result.statuses
    assert all("try again in a moment" in message for message in result.refusals), result.refusals
    assert result.statuses.count(200) >= preview.MAX_CHILDREN  # the flood is served, not only refused
