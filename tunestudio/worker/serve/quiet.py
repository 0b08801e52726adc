"""When the chat worker's background work may begin: between the requests a user waits for.

The worker makes two things after a model's load that its answers do not need at once: the int8 copy chat
answers from (serving.py, seconds of CPU for a 270M model with a 262k vocabulary) and llama.cpp's files
(llamacpp.py, a converter child). Begun with the first answer on 2 cores, each slowed that answer (bench/RESULTS.md,
issue 40): so each waits until the worker has answered no request for `QUIET_S`, or a bound under steady load (a
busy worker gets them too: `MAX_DEFER_S` for llama.cpp's files, serving.py's `INT8_MAX_DEFER_S` for the int8 copy,
without which a loaded worker answers at fp32's speed, a third of int8's). The worker's request loop
(inference.py) enters `Quiet` around each request.
"""

from __future__ import annotations

import threading
import time

QUIET_S = 1.0  # background work begins once no request has been under way for this long,
MAX_DEFER_S = 30.0  # or after this long whatever the load (llama.cpp's files; the int8 copy waits less: serving.py)


class Quiet:
    """Whether the worker is answering a request, and since when it is not (`with quiet:` around each one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._since = time.monotonic()

    def __enter__(self) -> None:
        with self._lock:
            self._busy += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._busy -= 1
            self._since = time.monotonic()

    def seconds(self) -> float:
        """How long no request has been under way (0 while one is)."""
        with self._lock:
            return 0.0 if self._busy else time.monotonic() - self._since

    def wait(self, quiet_s: float = QUIET_S, at_most_s: float = MAX_DEFER_S,
             stop: threading.Event | None = None) -> None:
        """Until no request has been under way for `quiet_s`, `at_most_s` has passed, or `stop` is set (the model
        the work was for is put away: a waiting thread lets go of it at once)."""
        deadline = time.monotonic() + at_most_s
        stop = stop or threading.Event()
        while (left := quiet_s - self.seconds()) > 0 and time.monotonic() < deadline:
            if stop.wait(min(max(left, 0.05), 0.25)):
                return
