"""llama.cpp's GGUF converters (`convert_hf_to_gguf.py`, `convert_lora_to_gguf.py`), run as a child process.

Two rooms convert: the export recipe's GGUF step (export/gguf.py) and the chat worker's copies for llama.cpp
(serve/llamacpp.py). The converters come from the `llama-cpp-python` source distribution that `make setup`
fetches (third_party/llama.cpp, or $TUNESTUDIO_LLAMA_CPP). They run through `tunestudio.worker.export.gguf_driver`
with llama.cpp's bundled gguf-py on their path; this process keeps the PyPI one. The child (a converter, or
llama-quantize) dies with the process that started it (PR_SET_PDEATHSIG): a worker killed with its server takes its
converter along.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tunestudio.paths import expand
from tunestudio.worker.errors import UserError

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python release pinned in the Makefile
POLL_S = 0.1
KILL_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
DRIVER = "tunestudio.worker.export.gguf_driver"


def llama_cpp_dir() -> Path:
    configured = os.environ.get("TUNESTUDIO_LLAMA_CPP")
    if configured:
        return expand(configured)
    return Path(__file__).resolve().parents[2] / "third_party" / "llama.cpp"


def require_converter() -> Path:
    root = llama_cpp_dir()
    if not (root / "convert_hf_to_gguf.py").is_file() or not (root / "gguf-py" / "gguf").is_dir():
        raise UserError(
            f"llama.cpp's GGUF converter is not at {root}. Run `make setup` (it fetches llama-cpp-python "
            f"{LLAMA_CPP_VERSION}'s source into third_party/llama.cpp), or set TUNESTUDIO_LLAMA_CPP to a llama.cpp "
            "checkout that has convert_hf_to_gguf.py and gguf-py."
        )
    return root


def driver(which: str, model_dir: Path | None) -> list[str]:
    """The command line of the driver: `which` is hf, lora, merged or check; `model_dir` the model whose tokenizer names
    the pre-tokenizer where llama.cpp does not know it."""
    command = [sys.executable, "-m", DRIVER, which]
    if model_dir is not None:
        command.append(f"--pre-tokenizer-fallback={model_dir}")
    return command


def driver_env() -> dict[str, str]:
    return {"TUNESTUDIO_LLAMA_CPP": str(require_converter())}


def run_child(
    command: list[str],
    env: dict[str, str],
    warn: Callable[[str], None],
    check_stop: Callable[[], None],
    report: Callable[[float], None] | None = None,
    found: list[dict] | None = None,
    nice: int = 0,
) -> None:
    """Run a converter or llama-quantize: its warnings go to `warn`, its progress (a fraction) to `report`, a stop
    request (`check_stop` raising) ends it; any other JSON line goes into `found`. `nice` lowers its priority
    (background work that must not slow what a user waits for).

    stderr (the converter's own log) goes to this worker's stderr (the job's log
    file), and its last lines into the error if the child fails.
    """
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    full_env.pop("HF_TOKEN", None)  # a converter has no use for a hub token
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_preexec(nice)) as proc:

        def pump_stdout() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                message = _parse(line)
                if message is None:
                    tail.append(line.rstrip())
                elif "warning" in message:
                    warn(str(message["warning"]))
                elif "total" in message:
                    if report is not None and message["total"]:
                        report(int(message["progress"]) / int(message["total"]))
                elif found is not None:
                    found.append(message)

        def pump_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail.append(line.rstrip())
                sys.stderr.write(line)

        readers = [threading.Thread(target=f, daemon=True) for f in (pump_stdout, pump_stderr)]
        for reader in readers:
            reader.start()
        try:
            while proc.poll() is None:
                check_stop()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(POLL_S)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            for reader in readers:
                reader.join()
    if proc.returncode != 0:
        detail = "\n".join(line for line in tail if line)
        # the converter runs as `python -m tunestudio.worker.export.gguf_driver`: named, not as "python3"
        name = "the GGUF converter" if DRIVER in command else Path(command[0]).name
        raise UserError(f"{name} failed (exit code {proc.returncode}):\n{detail[-2000:]}")


def _preexec(nice: int) -> Callable[[], None] | None:
    """The child's preexec_fn: it dies with this process, and runs `nice` steps lower in priority."""
    if nice < 0:
        raise ValueError(f"nice must be 0 or more (a higher priority needs privileges), not {nice}")
    dies = _dies_with_this_process()
    if not nice:
        return dies

    def preexec() -> None:
        if dies is not None:
            dies()
        os.nice(nice)

    return preexec


def _dies_with_this_process() -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGKILL from the kernel when this process dies (PR_SET_PDEATHSIG), and exits
    at once if it already has. It runs between fork and exec, so it only calls prctl (libc loaded here, before the
    fork) and getppid. The thread that starts the child waits for it, so PDEATHSIG's firing when the starting
    *thread* ends changes nothing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # this process died before prctl took hold
            os._exit(1)

    return preexec


def _parse(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
