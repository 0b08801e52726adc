"""Job slots across processes: file locks, dropped by the kernel when their holder dies."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tunestudio.jobs.slots import Slots

from ..helpers.wait import wait_until

HOLD = """
import sys, time
from pathlib import Path
from tunestudio.jobs.slots import Slots
assert Slots(Path(sys.argv[1])).acquire(1) is not None
print("held", flush=True)
time.sleep(600)
"""


def test_slots_are_exclusive_and_come_back_on_release(tmp_path: Path) -> None:
    slots = Slots(tmp_path / "slots")
    first = slots.acquire(1)
    assert first is not None
    assert slots.acquire(1) is None  # one slot, held (a second descriptor counts as another holder)
    second = slots.acquire(2)
    assert second is not None and slots.acquire(2) is None
    slots.release(first)
    again = slots.acquire(1)
    assert again is not None
    slots.release(again)
    slots.release(second)


def test_a_slot_held_by_a_killed_process_is_free_again(tmp_path: Path) -> None:
    slots = Slots(tmp_path / "slots")
    with subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "slots")], stdout=subprocess.PIPE,
                          text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            assert slots.acquire(1) is None
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            slot = wait_until(lambda: slots.acquire(1), 5, "the dead holder's lock to be dropped")
            slots.release(slot)
        finally:
            holder.kill()
