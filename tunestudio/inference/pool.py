"""The parent's side of chat: one inference worker process, started on demand, kept warm, put away when idle.

The worker (tunestudio/worker/serve/inference.py) loads models and generates; this
process only queues requests to it and routes its replies back, so it never
imports torch. Where the worker runs is an executor's business, as for any
worker: the pool is handed a factory of them (`jobs.executor.inference_executor`,
passed in by the API and the CLI, so inference/ imports nothing of jobs/ and
worker/) and starts the worker as the kind "inference". One keeper thread,
which lives as long as the pool, starts the worker (a worker's PR_SET_PDEATHSIG
fires when the *thread* that started it ends, so that thread must not be a
short-lived request thread), reads its replies, notices its death, and unloads
it:

- after `inference_idle_seconds` without a request;
- on a GPU, when a training job is running and no request is in flight (the
  device is training's); on a CPU the two share the cores instead: while a
  job trains, the worker generates with half of them (`threads_for`).

A worker that dies fails the request it was answering with a clear error
(503); the requests queued behind it (sent, but not begun) go to a new worker,
which starts at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tunestudio.inference_protocol import (
    Cancel,
    Command,
    Complete,
    CompletionParams,
    Delta,
    Done,
    Error,
    Generate,
    GenerateParams,
    ImageInput,
    Loaded,
    ModelSpec,
    Render,
    Rendered,
    Reply,
    Request,
    Score,
    Scored,
    Shutdown,
    Started,
    Tools,
    Transcribe,
    Transcribed,
)
from tunestudio.process import describe_exit, torch_threads
from tunestudio.settings import Settings

log = logging.getLogger(__name__)
POLL_S = 0.1  # how often the keeper looks at the worker's health when no reply arrives
TRAINING_CHECK_S = 2.0
KIND = "inference"  # the worker kind (worker/child.py) the executor starts


class WorkerExecutor(Protocol):
    """What the pool asks of the executor its worker runs in (jobs/executor.py's `Executor` is one)."""

    @property
    def pid(self) -> int | None: ...

    def start(self, public_config: dict[str, Any], secrets: dict[str, str], log_path: str | None, kind: str) -> None:
        """Start the worker; raises if it could not be started."""

    def alive(self) -> bool: ...

    def join(self, timeout: float) -> None: ...

    def exitcode(self) -> int | None: ...

    def send(self, command: Command) -> None:
        """Deliver a command; a worker already gone is not an error."""

    def next_item(self, timeout: float) -> object | None:
        """The worker's next reply, or None after `timeout` (or at its channel's end: the worker is gone)."""

    def kill(self, sig: int) -> None: ...

    def close(self) -> None:
        """Release the channels once the worker has exited (or will not be talked to again)."""


class InferenceUnavailable(RuntimeError):
    """A request the worker could not answer; status and code say how HTTP should put it."""

    def __init__(self, message: str, status: int = 503, code: str = "inference_unavailable", **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.extra = status, code, extra


def threads_for(training_active: bool, cores: int | None = None) -> int:
    """Torch threads for one generation: every core, or half of them while a training job runs beside it."""
    cores = cores or torch_threads()
    return max(1, cores // 2) if training_active else cores


class Generation:
    """One request's answer as it streams: `Started`, text deltas, then `Done` or an `Error`.

    Iterating yields the text deltas and raises InferenceUnavailable on an error;
    `result()` is the final `Done`. With `deliver`, replies go to that callback
    (from the keeper thread; it must not block) instead of an internal queue.
    """

    def __init__(self, pool: InferencePool, request_id: int, deliver: Callable[[Reply], None] | None) -> None:
        self._pool = pool
        self.request_id = request_id
        self._deliver = deliver
        self._queue: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self.started: Started | None = None
        self.rendered: Rendered | None = None  # a render's answer
        self.scored: Scored | None = None  # a score's answer
        self.transcribed: Transcribed | None = None  # a transcription's answer
        self.cancel_asked = False  # a Cancel went to the worker
        self.done: Done | None = None
        self.error: Error | None = None

    @property
    def finished(self) -> bool:
        return self.done is not None or self.error is not None

    def _push(self, reply: Reply) -> None:
        if isinstance(reply, Started):
            self.started = reply
        elif isinstance(reply, Rendered):
            self.rendered = reply
        elif isinstance(reply, Scored):
            self.scored = reply
        elif isinstance(reply, Transcribed):
            self.transcribed = reply
        elif isinstance(reply, Done):
            self.done = reply
        elif isinstance(reply, Error):
            self.error = reply
        if self._deliver is not None:
            self._deliver(reply)
        else:
            self._queue.put(reply)

    def __iter__(self) -> Iterator[str]:
        while True:
            reply = self._queue.get()
            if isinstance(reply, Delta):
                yield reply.text
            elif isinstance(reply, Error):
                raise as_exception(reply)
            elif isinstance(reply, Done):
                return

    def result(self) -> Done:
        if self.error is not None:
            raise as_exception(self.error)
        assert self.done is not None, "result() before the generation ended"
        return self.done

    def cancel(self) -> None:
        """Stop generating (the worker checks between tokens); a finished generation ignores it."""
        if not self.finished:
            self._pool._cancel(self.request_id)


def as_exception(error: Error) -> InferenceUnavailable:
    return InferenceUnavailable(error.message, error.status, error.code, **error.extra)


class InferencePool:
    """Routes requests to one inference worker and its replies back to each request's `Generation`.

    executors: makes the executor of each worker the pool starts, from the settings
    (`jobs.executor.inference_executor`); training_active: whether a job trains now.
    """

    def __init__(
        self,
        settings: Settings,
        executors: Callable[[Settings], WorkerExecutor],
        *,
        training_active: Callable[[], bool] | None = None,
    ) -> None:
        self.settings = settings
        self.idle_seconds = self.settings.inference_idle_seconds
        self.executors = executors
        self.training_active = training_active or (lambda: False)
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._inflight: dict[int, Generation] = {}
        self._waiting: list[Request] = []  # asked for before the worker was up
        # sent to the worker and not answered yet, in the order it takes them
        self._sent: dict[int, Request] = {}
        self._proc: WorkerExecutor | None = None  # the worker requests go to
        self._ending: WorkerExecutor | None = None  # a detached worker being shut down: "stopping" until it exited
        self._want_start = False
        self._closing = False
        self._keeper: threading.Thread | None = None
        self._last_used = time.monotonic()
        self._last_training_check = -TRAINING_CHECK_S
        self._training = False
        self.loaded: dict[str, Loaded] = {}
        self.device: str | None = None
        self.starts = 0
        self.cancelled = 0
        self.crashes = 0

    # --- the public face ---------------------------------------------------------
    def generate(
        self,
        spec: ModelSpec,
        messages: list[dict[str, Any]],
        params: GenerateParams,
        deliver: Callable[[Reply], None] | None = None,
        tools: Tools | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> Generation:
        """Queue one request (`images`: one for each `{"type": "image"}` part of the turns, in order); never
        blocks on the worker (safe to call from an event loop)."""
        return self._enqueue(lambda rid, threads: Generate(rid, spec, messages, params.model_dump(), threads, tools,
                                                           images), deliver)

    def complete(
        self,
        spec: ModelSpec,
        prompts: list[str | list[int]],
        params: CompletionParams,
        deliver: Callable[[Reply], None] | None = None,
    ) -> Generation:
        """Queue one text completion (`/v1/completions`): a choice per prompt, as `ChoiceDelta` replies."""
        return self._enqueue(lambda rid, threads: Complete(rid, spec, prompts, params.model_dump(), threads), deliver)

    def render(self, spec: ModelSpec, messages: list[dict[str, Any]],
               deliver: Callable[[Reply], None] | None = None, tools: Tools | None = None,
               images: tuple[ImageInput, ...] = ()) -> Generation:
        """Queue a render: the prompt these messages (and tools, and images) give the model, as a `Rendered` reply
        (only the tokenizer, or an image model's processor, loads), then `Done`."""
        return self._enqueue(lambda rid, threads: Render(rid, spec, messages, tools, images), deliver)

    def score(self, spec: ModelSpec, items: list[tuple[Any, Any]],
              deliver: Callable[[Reply], None] | None = None) -> Generation:
        """Queue a reward model's scores of (prompt, answer) pairs, as one `Scored` reply, then `Done`."""
        return self._enqueue(lambda rid, threads: Score(rid, spec, items, threads), deliver)

    def transcribe(self, spec: ModelSpec, audio: bytes, deliver: Callable[[Reply], None] | None = None,
                   **options: Any) -> Generation:
        """Queue a recording's transcription (options: language, prompt, temperature, task), as one `Transcribed`
        reply, then `Done`."""
        return self._enqueue(lambda rid, threads: Transcribe(rid, spec, audio, threads, **options), deliver)

    def _enqueue(self, command: Callable[[int, int], Request],
                 deliver: Callable[[Reply], None] | None) -> Generation:
        with self._cond:
            if self._closing:
                raise InferenceUnavailable("the inference pool is closed")
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="inference-keeper", daemon=True)
                self._keeper.start()
            request_id = next(self._ids)
            generation = Generation(self, request_id, deliver)
            self._inflight[request_id] = generation
            self._last_used = time.monotonic()
            threads = threads_for(self._training_now())
            request = command(request_id, threads)
            if self._proc is not None:
                self._sent[request_id] = request
                self._proc.send(request)
            else:
                self._waiting.append(request)
                self._want_start = True
                self._cond.notify_all()
        return generation

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {
                "state": "running" if self._proc is not None else "starting" if self._want_start
                else "stopping" if self._ending is not None else "stopped",
                "pid": self._proc.pid if self._proc is not None else None,
                "device": self.device,
                "loaded": sorted(self.loaded),
                "in_flight": len(self._inflight),
                "starts": self.starts,
                "crashes": self.crashes,
                "cancelled": self.cancelled,
                "idle_seconds": self.idle_seconds,
            }

    def close(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
            keeper = self._keeper
        if keeper is not None:
            keeper.join(timeout=30)
        self._fail_all("the server is shutting down", 503, "shutting_down")

    # --- internals ---------------------------------------------------------------------
    def _cancel(self, request_id: int) -> None:
        with self._cond:
            if request_id not in self._inflight:
                return
            waiting = [r for r in self._waiting if r.request_id == request_id]
            if waiting:  # never sent: answer it here
                self._waiting.remove(waiting[0])
                generation = self._inflight.pop(request_id)
                generation._push(Done(request_id, "cancelled"))
                return
            if self._proc is not None:
                self._inflight[request_id].cancel_asked = True
                self._proc.send(Cancel(request_id))

    def _keep(self) -> None:
        while True:
            try:
                if not self._keep_once():
                    break
            except Exception:  # the keeper must outlive any bug: fail what is in flight, start afresh
                log.exception("the inference keeper failed; restarting the worker")
                with self._cond:
                    self._want_start = False
                self._stop_worker()
                self._fail_all("the inference worker failed; see the server log", 503, "inference_unavailable")
        self._stop_worker()

    def _keep_once(self) -> bool:
        """One round of the keeper: start the worker, pass on one reply, or look after its health."""
        with self._cond:
            while not self._closing and self._proc is None and not self._want_start:
                self._cond.wait()  # nothing to do: no polling while there is no worker
            if self._closing:
                return False
            proc, start = self._proc, self._proc is None
        if start:
            self._start()
            return True
        reply = proc.next_item(POLL_S)
        if reply is not None:
            self._dispatch(reply)
        elif not proc.alive():
            self._lost(proc)
        else:
            self._maybe_unload()
        return True

    def _start(self) -> None:
        worker = None
        try:
            worker = self.executors(self.settings)
            worker.start({}, {}, str(self.settings.data_dir() / "inference.log"), KIND)
        except Exception as exc:
            log.exception("could not start the inference worker")
            if worker is not None:
                worker.close()
            with self._cond:
                self._want_start = False
                waiting, self._waiting = self._waiting, []
            for request in waiting:
                self._finish(request.request_id, Error(request.request_id, f"could not start the inference worker: "
                                                       f"{exc}", 503, "inference_unavailable"))
            return
        with self._cond:
            self._proc = worker
            self._want_start = False
            self.starts += 1
            self.loaded.clear()
            self.device = None
            waiting, self._waiting = self._waiting, []
            for request in waiting:
                self._sent[request.request_id] = request
                worker.send(request)
        log.info("inference worker %s started", worker.pid)

    def _dispatch(self, reply: Reply) -> None:
        if isinstance(reply, Loaded):
            with self._cond:
                self.loaded[reply.key] = reply
                self.device = reply.device
            return
        with self._cond:
            generation = self._inflight.get(reply.request_id)
            if generation is None:
                return
            if isinstance(reply, (Done, Error)):
                del self._inflight[reply.request_id]
                self._sent.pop(reply.request_id, None)
                self._last_used = time.monotonic()
                if isinstance(reply, Done) and reply.finish_reason == "cancelled":
                    self.cancelled += 1
        try:
            generation._push(reply)
        except Exception:  # a consumer's callback failed (its loop closed): the worker is not its keeper
            log.exception("delivering a reply of request %s failed", reply.request_id)
            generation.cancel()

    def _finish(self, request_id: int, reply: Done | Error) -> None:
        with self._cond:
            generation = self._inflight.pop(request_id, None)
            self._sent.pop(request_id, None)
        if generation is not None:
            with contextlib.suppress(Exception):
                generation._push(reply)

    def _lost(self, proc: WorkerExecutor) -> None:
        """The worker died: fail the request it was answering; those queued behind it go to a new worker."""
        proc.join(timeout=1)
        # Replies it sent before it died still count (a request it answered in full).
        while (reply := proc.next_item(0.05)) is not None:
            self._dispatch(reply)
        why = describe_exit(proc.exitcode()).replace("worker", "inference worker", 1)
        with self._cond:
            # The worker takes requests in the order they were sent: the first unanswered one was its own, the
            # others had not begun. They are sent again (a cancelled one is answered here).
            queued = [(r, self._inflight[r.request_id]) for r in list(self._sent.values())[1:]
                      if r.request_id in self._inflight]
            retried = [r for r, generation in queued if not generation.cancel_asked]
            dropped = [r.request_id for r, generation in queued if generation.cancel_asked]
            self._detach()  # no request is sent to the dead one from here on
            self._ending = None  # dead already: nothing to shut down
            self.crashes += 1
            self._waiting[:0] = retried
            if self._waiting:
                self._want_start = True
        proc.close()
        log.warning("%s%s", why, f"; {len(retried)} queued request(s) go to a new worker" if retried else "")
        for rid in dropped:
            self._finish(rid, Done(rid, "cancelled"))
        self._fail_all(f"{why} while answering this request; the next request starts a new one", 503,
                       "inference_worker_died", keep_waiting=True)

    def _fail_all(self, message: str, status: int, code: str, keep_waiting: bool = False) -> None:
        with self._cond:
            waiting = {r.request_id for r in self._waiting} if keep_waiting else set()
            failed = [rid for rid in self._inflight if rid not in waiting]
            if not keep_waiting:
                self._waiting.clear()
        for rid in failed:
            self._finish(rid, Error(rid, message, status, code))

    def _training_now(self) -> bool:
        """Whether a job trains (any process on the data directory), asked at most every TRAINING_CHECK_S."""
        now = time.monotonic()
        if now - self._last_training_check >= TRAINING_CHECK_S:
            self._last_training_check = now
            try:
                self._training = bool(self.training_active())
            except Exception:
                log.exception("could not tell whether a job is training")
        return self._training

    def _maybe_unload(self) -> None:
        now = time.monotonic()
        self._training_now()
        with self._cond:  # decided and detached under one lock: no request can slip in between
            if self._inflight or self._proc is None:
                return
            idle = now - self._last_used > self.idle_seconds
            device_needed = self._training and self.device is not None and self.device != "cpu"
            if not (idle or device_needed):
                return
            detached = self._detach()
        log.info("unloading the inference worker (%s)", "idle" if idle else "a training job needs the device")
        self._shut_down(detached)

    def _stop_worker(self) -> None:
        with self._cond:
            detached = self._detach()
        self._shut_down(detached)

    def _detach(self) -> WorkerExecutor | None:
        """Under the lock: the worker is no longer the one requests go to (it is `_ending` until shut down)."""
        proc = self._proc
        self._ending = proc if proc is not None and proc.alive() else None
        self._proc = None
        self._sent = {}
        self.loaded.clear()
        self.device = None
        return proc

    def _shut_down(self, proc: WorkerExecutor | None) -> None:
        """Ask the worker to exit after what it was sent; kill its group if it does not; close the channels.
        The status says "stopped" only once the process has exited."""
        if proc is None:
            return
        with contextlib.suppress(Exception):
            proc.send(Shutdown())
        proc.join(timeout=10)
        if proc.alive():
            proc.kill(signal.SIGKILL)
            proc.join(timeout=5)
        proc.close()
        with self._cond:
            if self._ending is proc:
                self._ending = None
