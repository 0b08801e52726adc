"""The inference worker: a process that holds chat models in memory and answers one request at a time.

It is a worker kind ("inference"): an executor starts it like any worker
(jobs/executor.py, `WorkerArgs.kind`), and worker/child.py makes it one (its
own process group, death with its parent, output to its log) before `run`
takes over, so this module imports nothing heavy at the top; torch and
friends load in the child. Ctrl-C in the parent's terminal does not reach it:
a cancel is a command. It talks in `tunestudio.inference_protocol` only.

Two threads: the command reader files `Generate` requests in order and acts on
`Cancel` at once (it sets the flag the running generation checks between
tokens); the main thread loads models and generates.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
import warnings
from collections import deque
from typing import Any

from tunestudio.inference_protocol import Cancel, Complete, Done, Error, Render, Request, Score, Shutdown, Transcribe
from tunestudio.worker.errors import UserFacing

log = logging.getLogger(__name__)


class Replies:
    """The pipe to the parent. A reply is pickled and written by the thread that sends it: no feeder thread to
    hand each token to (a queue's would take the GIL from `generate` once per token)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def put(self, reply: Any) -> None:
        with self._lock:
            self._conn.send(reply)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class Server:
    def __init__(self, requests: Any, replies: Replies, cache_dir: str | None = None) -> None:
        self.requests = requests
        self.cache_dir = cache_dir
        self.replies = replies
        self._lock = threading.Condition()
        self._pending: deque[Request | Shutdown] = deque()
        self._cancelled: set[int] = set()
        self._current: int | None = None
        self.halt = threading.Event()  # set: the running generation stops at its next token

    def read_commands(self) -> None:
        while True:
            try:
                command = self.requests.get()
            except (EOFError, OSError):
                command = Shutdown()
            with self._lock:
                if isinstance(command, Cancel):
                    if command.request_id == self._current:
                        self.halt.set()
                    else:
                        self._cancelled.add(command.request_id)
                    continue
                self._pending.append(command)
                self._lock.notify()
            if isinstance(command, Shutdown):
                return

    def next_request(self) -> Request | None:
        """The next request to answer (None: shut down); one cancelled before it started is answered here."""
        while True:
            with self._lock:
                while not self._pending:
                    self._lock.wait()
                command = self._pending.popleft()
                if isinstance(command, Shutdown):
                    return None
                if command.request_id in self._cancelled:
                    self._cancelled.discard(command.request_id)
                    self.replies.put(Done(command.request_id, "cancelled"))
                    continue
                self._current = command.request_id
                self.halt.clear()
                return command

    def serve(self) -> None:
        from tunestudio.worker.serve.generation import Models

        models = Models(self.replies, self.cache_dir)
        threading.Thread(target=self.read_commands, name="commands", daemon=True).start()
        try:
            self._answer_all(models)
        finally:
            models.close()

    def _answer_all(self, models: Any) -> None:
        from tunestudio.worker.serve.completion import complete
        from tunestudio.worker.serve.generation import answer, render
        from tunestudio.worker.serve.scoring import score
        from tunestudio.worker.serve.transcription import transcribe

        while True:
            request = self.next_request()
            if request is None:
                return
            try:
                # /v1/completions, a chat prompt shown (nothing generated), a reward model's scores, a recording's
                # transcript, or chat
                recipe = (complete if isinstance(request, Complete) else render if isinstance(request, Render)
                          else score if isinstance(request, Score) else transcribe
                          if isinstance(request, Transcribe) else answer)
                with models.quiet:  # what a user waits for: background work (quiet.py) waits for it
                    recipe(models, request, self.replies, self.halt)
            except UserFacing as exc:
                self.replies.put(Error(request.request_id, str(exc), exc.status, exc.code, exc.extra))
            except Exception as exc:  # a bug, or a library's failure: this request fails, the worker lives on
                log.error("request %s failed:\n%s", request.request_id, traceback.format_exc())
                self.replies.put(Error(request.request_id, f"generation failed: {type(exc).__name__}: {exc}"))
            finally:
                with self._lock:
                    self._current = None


def run(requests: Any, replies_conn: Any, cache_dir: str | None = None) -> int:
    """The worker's life, once worker/child.py made it a worker. requests: the queue of commands from the parent;
    replies_conn: the write end of the reply pipe; cache_dir: where GGUF copies for llama.cpp are kept
    (serve/llamacpp.py; None: chat stays PyTorch's). Returns the exit code."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Library notices about their own internals (peft asks for a renamed transformers property) are not the user's.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    replies = Replies(replies_conn)
    try:
        Server(requests, replies, cache_dir).serve()
    finally:
        replies.close()
    return 0
