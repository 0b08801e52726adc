"""The GGUF converter (or llama-quantize) an export runs dies with the worker that started it: a server killed
with SIGKILL takes its worker with it (PR_SET_PDEATHSIG), and the worker its converter, which once ran on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tunestudio.process import pid_alive

from ..helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]

# A worker that runs a converter-like child through export_gguf._run_child, as an export does; the child writes
# its pid and then sleeps far longer than the test waits.
WORKER = textwrap.dedent("""
    import sys
    from tunestudio.worker.export import gguf as export_gguf

    class Quiet:
        def warn(self, message): pass
        def log(self, message): pass

    child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    export_gguf._run_child([sys.executable, "-c", child, sys.argv[1]], {}, Quiet(), lambda: None, None)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_converter_dies_when_its_worker_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "converter.pid"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(pid_file)], cwd=ROOT, start_new_session=True)
    converter = 0
    try:
        wait_until(lambda: pid_file.is_file() and pid_file.read_text().strip(), 120, "the converter to start")
        converter = int(pid_file.read_text())
        assert pid_alive(converter)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        wait_until(lambda: not pid_alive(converter), 15, "the converter to die with its worker")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
        if converter and pid_alive(converter):
            os.kill(converter, signal.SIGKILL)
