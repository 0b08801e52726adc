"""worker/serve/quiet.py: background work (chat's int8 copy, llama.cpp's files) waits for a quiet worker."""

from __future__ import annotations

import threading
import time

from tunestudio.worker.serve.quiet import Quiet


def test_background_work_waits_for_a_quiet_worker_but_not_forever() -> None:
    started = time.monotonic()  # before it is made: quiet from then on, so the wait is at least 0.3 s from here
    quiet = Quiet()
    quiet.wait(0.3, 5.0)  # quiet since it was made
    assert 0.3 <= time.monotonic() - started < 4.5  # not at the bound
    with quiet:
        assert quiet.seconds() == 0.0
    stop, entered = threading.Event(), threading.Event()

    def busy() -> None:  # one request after another, as a loaded server's worker answers them, each begun before
        with quiet:  # the last ends (a thread held off the CPU between two would otherwise look quiet)
            entered.set()
            while not stop.is_set():
                with quiet:
                    time.sleep(0.02)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        assert entered.wait(30)
        started = time.monotonic()
        quiet.wait(0.3, 0.8)  # never quiet for 0.3 s: begun at the bound
        assert 0.8 <= time.monotonic() - started < 4.5
    finally:
        stop.set()
        worker.join()


def test_a_stop_ends_the_wait_at_once() -> None:
    quiet = Quiet()
    stop = threading.Event()
    with quiet:  # a request under way: the wait would last till its bound
        threading.Timer(0.2, stop.set).start()
        started = time.monotonic()
        quiet.wait(0.3, 30.0, stop=stop)
        assert time.monotonic() - started < 5.0
