from __future__ import annotations

import gc
import multiprocessing as mp
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .helpers.chat import ChatHome

REPO = Path(__file__).resolve().parents[1]

# One torch thread per process: the suite runs jobs, servers and its own checks side by side on 2 cores, and
# OpenMP threads that wait spin, so a job with a thread per core beside other busy processes runs many times
# slower (tunestudio.process.torch_threads). Jobs, chat workers and in-process torch all read these.
os.environ.setdefault("TUNESTUDIO_TORCH_THREADS", "1")
# A completed job's model is not loaded for chat in tests unless a test asks (tests/api/test_chat_warmup.py): it
# would start chat workers beside every other test's jobs.
os.environ.setdefault("TUNESTUDIO_CHAT_WARMUP", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
DATA = REPO / "examples" / "data"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order xdist hands modules out in (`make test` runs `--dist loadscope --no-loadscope-reorder`): the modules
    of `schedule_first` tests first, then the others by their number of tests, most first (xdist's own reordering).

    xdist's reordering alone sent the Ray cluster's module (one test, 170-230 s) out last: one worker then ran it
    alone for minutes while the other had nothing left. The sort is stable and its key the same for a module's
    tests, so each module's tests stay together and in their order."""
    modules = Counter(item.nodeid.split("::", 1)[0] for item in items)
    first = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("schedule_first")}

    def key(item: pytest.Item) -> tuple[bool, int]:
        module = item.nodeid.split("::", 1)[0]
        return module not in first, -modules[module]

    items.sort(key=key)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection loaded (the test modules and the libraries they import) leaves the garbage collector's sight,
    as a worker's imports do (tunestudio/worker/child.py `freeze_imports`): each full collection in a test process
    walked it all. Measured on tests/api's jobs, schema and security modules run alone: 23 full collections took
    3.9 s of their 81 s, 2.3 s after; what the tests make is collected as before. Collection's own garbage is
    collected first, not kept."""
    gc.collect()
    gc.freeze()


def _build(directory: str) -> None:
    from tunestudio.worker.tiny import build_tiny_model

    build_tiny_model(directory)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny model: the one `make` built (models/tiny-llama), else built once per session.

    Tests only read it. Building happens in a child, as `make-tiny-model` does, so
    this process stays as light as a user's parent process.
    """
    built = REPO / "models" / "tiny-llama"
    if (built / "config.json").is_file() and (built / "model.safetensors").is_file():
        return built
    directory = tmp_path_factory.mktemp("tiny-llama")
    proc = mp.get_context("spawn").Process(target=_build, args=(str(directory),))
    proc.start()
    proc.join(300)
    assert proc.exitcode == 0, "building the tiny model failed"
    return directory


@pytest.fixture(scope="session")
def trained_chat_home(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> ChatHome:
    """The chat job (a 40-step LoRA job with samples and an evaluation), trained once per session: the chat
    modules (tests/api/test_openai.py, test_web_chat.py, tests/inference/test_pool.py, tests/test_cli_chat.py) all
    talk to it. Use `chat_home`."""
    from .helpers.chat import ChatHome

    return ChatHome.trained(tiny_model, tmp_path_factory.mktemp("chat-job"))


@pytest.fixture(scope="module")
def chat_home(trained_chat_home: ChatHome) -> ChatHome:
    """The session's chat job, in its data directory as the training left it (whatever the last module did)."""
    return trained_chat_home.fresh()


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """What a test's in-process worker writes into this process's environment (worker/channel.py
    `quiet_libraries`: the libraries' verbosity and progress bars) is undone after it, so that no later test's
    CLI, server or forkserver inherits it and finds the libraries already quiet. Each variable is put back alone,
    never the whole environment at once: a thread of a module's server may start a process meanwhile."""
    before = dict(os.environ)
    yield
    for name in [name for name in os.environ if name not in before]:
        os.environ.pop(name, None)
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNESTUDIO_HOME", str(tmp_path / "home"))
