"""The worker's end of the conversation with its parent.

A channel numbers and sends events, and keeps the latest stop command that
arrived, which the training callback reads at each step boundary. Two
transports: multiprocessing queues (a supervised job) and stdout/stdin JSON
lines (`python -m tunestudio.worker CONFIG.json`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from abc import ABC, abstractmethod
from typing import Any

from pydantic import ValidationError

from tunestudio.events import (
    Completed,
    Failed,
    Log,
    Phase,
    Progress,
    Stop,
    WarningEvent,
    parse_command,
)


class _KernelsNotice(logging.Filter):
    """bitsandbytes, imported on a CPU with AVX512-BF16, tries to fetch a faster 4-bit kernel from the hub
    (`kernels-community`) and warns on every import when it cannot: its own kernel works, the warning asks for a
    package that downloads code, and it printed at every job's start (and the forkserver's). Not said at all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "kernels-community" not in record.getMessage()


# Set when this module loads: it is the first a worker or the forkserver imports (worker/child.py PRELOAD), before
# bitsandbytes.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_KernelsNotice())


def _to_log_file(level: str, message: str) -> None:
    """Also on stderr, which a supervised worker writes to its job's log file: the file alone then tells the
    job's story (the page shows it for any job, after a server restart too)."""
    print(f"{time.strftime('%H:%M:%S')} [{level}] {message[:10_000]}", file=sys.stderr, flush=True)


class Channel(ABC):
    # Whether this process writes the job's artefacts and reports its end: always, except
    # on the ranks other than 0 of a data-parallel job (tunestudio/worker/rank.py).
    is_main: bool = True

    def __init__(self) -> None:
        self._seq = 0
        self._lock = threading.Lock()
        self._stop: Stop | None = None

    # --- sending ---------------------------------------------------------------
    @abstractmethod
    def _send(self, line: str) -> None: ...

    def emit(self, cls: type, **fields: Any) -> Any:
        with self._lock:
            self._seq += 1
            event = cls(seq=self._seq, **fields)
            self._send(event.model_dump_json())
        return event

    def phase(self, phase: str, message: str = "", done: int | None = None, total: int | None = None) -> None:
        """A phase (a status) or a step inside one (events.WorkerStep), with how far it is (done of total)."""
        self.emit(Phase, phase=phase, message=message, done=done, total=total)

    def progress(self, **fields: Any) -> Progress:
        return self.emit(Progress, **fields)

    def log(self, message: str, level: str = "info") -> None:
        self.emit(Log, message=message, level=level)
        _to_log_file(level, message)

    def warn(self, message: str) -> None:
        self.emit(WarningEvent, message=message)
        _to_log_file("warning", message)

    def completed(self, **fields: Any) -> None:
        self.emit(Completed, **fields)

    def failed(self, message: str, traceback: str = "") -> None:
        self.emit(Failed, message=message, traceback=traceback)

    @abstractmethod
    def close(self) -> None:
        """Flush what was sent; called once, as the worker ends."""

    # --- receiving -------------------------------------------------------------
    def receive(self, line: str | bytes) -> None:
        """Record one command. A cancel (save=False) wins over an earlier stop with save."""
        try:
            command = parse_command(line)
        except ValidationError:
            return  # a parent never sends garbage; if it does, ignoring it is the safe answer
        with self._lock:
            if self._stop is None or not command.save:
                self._stop = command

    @property
    def stop_request(self) -> Stop | None:
        return self._stop


class QueueChannel(Channel):
    """Events onto one multiprocessing queue, commands from another.

    A sender thread puts whatever events are waiting as one newline-joined item
    (JSON text never holds a raw newline). One event alone goes at once; a burst
    rides in one item instead of one queue round trip per event.
    """

    def __init__(self, events: Any, commands: Any) -> None:
        super().__init__()
        self._events = events
        self._commands = commands
        self._waiting: list[str] = []
        self._ready = threading.Condition()
        self._closing = False
        self._sender = threading.Thread(target=self._send_loop, name="events", daemon=True)
        self._sender.start()
        threading.Thread(target=self._read_commands, name="commands", daemon=True).start()

    def _send(self, line: str) -> None:
        with self._ready:
            self._waiting.append(line)
            self._ready.notify()

    def _send_loop(self) -> None:
        while True:
            with self._ready:
                while not self._waiting and not self._closing:
                    self._ready.wait()
                batch, self._waiting = self._waiting, []
                closing = self._closing
            if batch:
                self._events.put("\n".join(batch))
            if closing and not batch:
                return

    def _read_commands(self) -> None:
        while True:
            try:
                line = self._commands.get()
            except (EOFError, OSError):
                return
            if line is None:
                return
            self.receive(line)

    def close(self) -> None:
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._sender.join()
        self._events.close()
        self._events.join_thread()


class StdioChannel(Channel):
    """Events as JSON lines on the process's real stdout, commands as JSON lines on stdin.

    Libraries print to stdout freely; to keep the event stream clean, the
    original stdout is kept for events and file descriptor 1 is pointed at stderr.
    """

    def __init__(self) -> None:
        super().__init__()
        sys.stdout.flush()
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)
        threading.Thread(target=self._read_commands, name="commands", daemon=True).start()

    def _send(self, line: str) -> None:
        self._out.write(line + "\n")

    def _read_commands(self) -> None:
        for line in sys.stdin:
            if line.strip():
                self.receive(line)

    def close(self) -> None:
        self._out.flush()


# The libraries' own progress bars, each switched off by its variable (unless the user set it) and, in a worker
# forked after they were imported, by its function: (variable, module, function).
PROGRESS_BARS = (
    ("HF_HUB_DISABLE_PROGRESS_BARS", "huggingface_hub.utils", "disable_progress_bars"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "transformers.utils.logging", "disable_progress_bar"),  # "Loading weights"
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "datasets.utils.logging", "disable_progress_bar"),  # "Tokenizing ..."
)


def quiet_libraries() -> None:
    """Library chatter goes to stderr at warning level; progress reaches the user as events (a job's or an
    export's worker calls it before loading anything). The libraries' progress bars are off: in the job's log (a
    file, shown by the page and `jobs logs`) each was one line of carriage-returned redraws."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
    os.environ.setdefault("DISABLE_TQDM", "1")
    logging.getLogger("transformers").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*kernels.*")
    # peft (wrapping the model) and TRL (DPO's and GRPO's steps) read transformers 5's renamed attribute: a
    # FutureWarning in every job's log that no job can act on
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    for variable, module, switch in PROGRESS_BARS:
        if os.environ.setdefault(variable, "1").strip().lower() in ("1", "true", "yes", "on") \
                and module in sys.modules:
            getattr(sys.modules[module], switch)()


__all__ = ["Channel", "Completed", "Failed", "QueueChannel", "StdioChannel", "quiet_libraries"]
