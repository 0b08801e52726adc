"""worker/channel.py's `quiet_libraries`: the libraries' progress bars off in a job's log unless the user asked."""

from __future__ import annotations

import os
import sys
import types

import pytest

from tunestudio.worker import channel


@pytest.mark.parametrize(("hub", "datasets", "switched"), [
    (None, None, ["hub", "transformers", "datasets"]),  # unset: off, by the variables and, already imported, by
    ("0", None, ["datasets"]),  # the switches; a user's "0" keeps those bars
    ("true", "off", ["hub", "transformers"]),
])
def test_progress_bars_go_off_unless_the_user_set_them_on(hub: str | None, datasets: str | None,
                                                          switched: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    # the libraries as a forked worker finds them: imported already (stand-ins that record their switch)
    for module, switch, name in (("huggingface_hub.utils", "disable_progress_bars", "hub"),
                                 ("transformers.utils.logging", "disable_progress_bar", "transformers"),
                                 ("datasets.utils.logging", "disable_progress_bar", "datasets")):
        stand_in = types.SimpleNamespace(**{switch: lambda name=name: called.append(name)})
        monkeypatch.setitem(sys.modules, module, stand_in)
    for variable, value in (("HF_HUB_DISABLE_PROGRESS_BARS", hub), ("HF_DATASETS_DISABLE_PROGRESS_BARS", datasets)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    channel.quiet_libraries()
    assert called == switched
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == (hub or "1")  # a spawned worker's libraries read these
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == (datasets or "1")
