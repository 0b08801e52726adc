"""worker/serve/llamacpp.py: chat answered by llama.cpp (issue 40) from GGUF copies the chat worker makes.

The answers are checked against PyTorch's (transformers + peft, the path every other chat test checks) on the
session's trained chat job, its adapter on the tiny model's GGUF: the same greedy text, the job's and `:base`'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tunestudio.inference.models import spec_for
from tunestudio.inference_protocol import Delta, Done, Error, Generate, Loaded, ModelSpec
from tunestudio.worker.errors import UserFacing
from tunestudio.worker.serve import generation, llamacpp
from tunestudio.worker.serve.generation import Models, answer
from tunestudio.worker.serve.quiet import QUIET_S

from ..helpers.channel import ListChannel
from ..helpers.chat import PROMPT, ChatHome
from ..helpers.wait import wait_until

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not llamacpp.installed(), reason="llama-cpp-python is not built (`make llamacpp`)"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),  # peft's own call
]
QUESTIONS = [PROMPT, "What sound does this animal make?\n\ndog", "What colour is the sky?", "Name a fruit."]


class Replies:
    """The worker's pipe to the parent, kept: `every` reply, and `current`, those of the request being answered."""

    def __init__(self) -> None:
        self.every: list[Any] = []
        self.current: list[Any] = []
        self.on_delta: Any = None

    def put(self, reply: Any) -> None:
        self.every.append(reply)
        self.current.append(reply)
        if isinstance(reply, Delta) and self.on_delta is not None:
            self.on_delta()

    def loaded(self) -> list[str]:
        return [r.key for r in self.every if isinstance(r, Loaded)]


QUIET_GAP = QUIET_S + 0.3  # between requests that wait for auto's files: the worker is quiet, they begin


def ask(models: Models, spec: ModelSpec, question: str, engine: str, halt: threading.Event | None = None,
        **params: Any) -> tuple[str, Done]:
    """One chat answer through `engine` (TUNESTUDIO_CHAT_ENGINE): its text and its Done."""
    replies = models.replies
    replies.current = []
    os.environ[llamacpp.ENGINE_ENV] = engine
    try:
        with models.quiet:  # as the worker's request loop answers (serve/inference.py)
            answer(models, Generate(1, spec, [{"role": "user", "content": question}],
                                    {"temperature": 0.0, "max_tokens": 24, **params}, 1),
                   replies, halt or threading.Event())
    finally:
        os.environ.pop(llamacpp.ENGINE_ENV, None)
    errors = [r for r in replies.current if isinstance(r, Error)]
    assert not errors, errors
    return ("".join(r.text for r in replies.current if isinstance(r, Delta)),
            next(r for r in replies.current if isinstance(r, Done)))


@pytest.fixture(scope="module")
def specs(trained_chat_home: ChatHome) -> tuple[ModelSpec, ModelSpec]:
    job = trained_chat_home.job
    spec = spec_for(job, base=False)
    base = spec_for(job, base=True)
    assert spec is not None and base is not None
    return spec, base


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's cache folder: the GGUF copies are made once (by the first answer) and kept for the others."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def models(cache: Path) -> Models:
    """One chat worker's models."""
    made = Models(Replies(), str(cache))
    yield made
    made.close()


def test_llama_cpp_answers_as_pytorch_does(models: Models, specs: tuple[ModelSpec, ModelSpec],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    spec, base = specs
    expected = {(s.model_id, q): ask(models, s, q, "torch")[0] for s in specs for q in QUESTIONS}
    assert any(expected[(spec.model_id, q)] != expected[(base.model_id, q)] for q in QUESTIONS), \
        "the job answers as its base does: the adapter would not be tested"

    def no_pytorch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("PyTorch answered")

    monkeypatch.setattr(generation, "_generate", no_pytorch)
    for s in (spec, base, spec):  # the adapter set, cleared, set again on the same context
        for question in QUESTIONS:
            text, _ = ask(models, s, question, "llama.cpp")
            assert text == expected[(s.model_id, question)], (s.model_id, question)
    cache = models.cache_dir / "gguf"
    assert sorted(p.name for p in cache.glob("*/*.gguf")) == ["adapter-f32.gguf", "model-q8_0.gguf"]
    # No partial file is left behind (each is renamed into place or removed; a making still under way ends first).
    wait_until(lambda: not list(cache.glob("*/.*.tmp")), 60, "the partial GGUF files gone", every=0.1)


def test_min_tokens_stop_strings_and_a_cancel(models: Models, specs: tuple[ModelSpec, ModelSpec]) -> None:
    spec = specs[0]
    text, done = ask(models, spec, PROMPT, "llama.cpp", max_tokens=40, min_tokens=40)
    assert (done.finish_reason, done.completion_tokens) == ("length", 40)  # the end token was not allowed
    short, _ = ask(models, spec, PROMPT, "llama.cpp", max_tokens=40)
    assert text.startswith(short) and len(text) > len(short)  # past the end token: off the training's path,
    # where the scores are near ties and q8_0's rounding may choose another token than fp32's: not compared

    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut, done = ask(models, spec, PROMPT, "llama.cpp", max_tokens=40, min_tokens=40, stop=[stop])
    assert cut == text[:text.index(stop)] and done.finish_reason == "stop"

    halt = threading.Event()
    models.replies.on_delta = halt.set  # a cancel as the first text reaches the parent
    try:
        _, done = ask(models, spec, PROMPT, "llama.cpp", halt=halt, max_tokens=40, min_tokens=40)
    finally:
        models.replies.on_delta = None
    assert done.finish_reason == "cancelled" and done.completion_tokens < 40


def test_a_seed_repeats_its_sample(models: Models, specs: tuple[ModelSpec, ModelSpec]) -> None:
    spec = specs[0]
    draws = [ask(models, spec, PROMPT, "llama.cpp", temperature=2.0, max_tokens=32, min_tokens=32, seed=seed)[0]
             for seed in (7, 7, 8)]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    nucleus = ask(models, spec, PROMPT, "llama.cpp", temperature=1.0, top_p=1e-6, max_tokens=16, seed=9)[0]
    assert nucleus == ask(models, spec, PROMPT, "llama.cpp", max_tokens=16)[0]  # top-p keeps only the best


def test_without_the_binding_chat_says_how_to_build_it(specs: tuple[ModelSpec, ModelSpec], cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    models = Models(Replies(), str(cache))  # a worker of an environment without the binding
    try:
        with pytest.raises(UserFacing, match="make llamacpp") as refused:
            ask(models, specs[0], PROMPT, "llama.cpp")
        assert refused.value.status == 503
        assert ask(models, specs[0], PROMPT, "auto")[0]  # auto: PyTorch's
    finally:
        models.close()


def test_auto_answers_through_pytorch_until_llama_cpp_is_made_and_measured_faster(
        tiny_model: Path, specs: tuple[ModelSpec, ModelSpec], cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = specs[0]
    models = Models(Replies(), str(cache))  # a second chat worker: the files are there, the engine is not
    try:
        assert ask(models, spec, PROMPT, "auto")[0]
        assert models._models[(str(tiny_model), "", False)].llama is None  # 1.2M parameters: below MIN_PARAMS

        monkeypatch.setattr(llamacpp, "MIN_PARAMS", 0)
        expected = ask(models, spec, PROMPT, "torch")[0]
        gate = threading.Event()
        made = llamacpp.Files.model
        begun: list[float] = []  # how long the worker had been quiet when the file's making began
        monkeypatch.setattr(llamacpp.Files, "model", lambda self, folder: begun.append(models.quiet.seconds())
                            or (gate.wait(60) and made(self, folder)))
        assert ask(models, spec, PROMPT, "auto")[0] == expected  # the file is being made (below): PyTorch answers
        entry = models._models[(str(tiny_model), "", False)]
        assert entry.llama is not None and entry.llama.state == "making"
        assert entry.llama.files.nice == llamacpp.BACKGROUND_NICE > 0  # its converters yield to the answers
        gate.set()
        wait_until(lambda: entry.llama.state == "loaded", 120, "llama.cpp's copy loaded")
        assert len(begun) == 1 and begun[0] >= QUIET_S, begun  # after the answer, not beside it
        entry.served.int8_ready.clear()  # as while chat's int8 copy is made: not measured, and nothing waits for it
        assert ask(models, spec, PROMPT, "auto")[0] == expected
        assert entry.llama.state == "loaded"
        entry.served.int8_ready.set()
        # measured at the next request; the tiny model's token is Python in PyTorch: llama.cpp is faster
        assert ask(models, spec, PROMPT, "auto")[0] == expected
        assert entry.llama.state == "serving"
        # the adapter's file was started by that request; then llama.cpp answers for the job too
        wait_until(lambda: ask(models, spec, PROMPT, "auto")[0] == expected
                   and entry.llama.engine.has_adapter(generation._adapter_name(spec.job_id),
                                                      (spec.weights, spec.fingerprint)), 120, "the adapter's file",
                   every=QUIET_GAP)
        assert f"{tiny_model} (llama.cpp q8_0)" in models.replies.loaded()
    finally:
        models.close()


def test_auto_keeps_pytorch_where_llama_cpp_measures_slower(tiny_model: Path, specs: tuple[ModelSpec, ModelSpec],
                                                            cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "MIN_PARAMS", 0)
    monkeypatch.setattr(llamacpp.Engine, "token_seconds", lambda self, ids, threads: 1.0)
    models = Models(Replies(), str(cache))
    try:
        base = specs[1]
        ask(models, base, PROMPT, "auto")
        entry = models._models[(str(tiny_model), "", False)]
        wait_until(lambda: entry.llama.state == "loaded", 120, "llama.cpp's copy loaded")
        ask(models, base, PROMPT, "auto")
        assert entry.llama.state == "slower"
        assert not [key for key in models.replies.loaded() if "llama.cpp" in key]
    finally:
        models.close()


@pytest.mark.timeout(420)  # its two waits' bounds, and the answers
def test_auto_answers_a_job_from_its_merged_copy(tiny_model: Path, specs: tuple[ModelSpec, ModelSpec], cache: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec, base = specs
    monkeypatch.setattr(llamacpp, "MIN_PARAMS", 0)
    monkeypatch.setattr(llamacpp, "MERGE_PARAMS", (0, 10**9))  # the tiny model's 1.2M parameters merge too
    models = Models(Replies(), str(cache))
    try:
        expected = {(s.model_id, q): ask(models, s, q, "torch")[0] for s in specs for q in QUESTIONS[:2]}
        ask(models, base, PROMPT, "auto")
        entry = models._models[(str(tiny_model), "", False)]
        wait_until(lambda: entry.llama.state == "loaded", 120, "llama.cpp's copy loaded")
        ask(models, base, PROMPT, "auto")
        assert entry.llama.state == "serving" and entry.llama.merge
        merged_key = f"{spec.weights} (llama.cpp merged q8_0)"
        # the adapter serves first (its file made), then the merged copy is made and loaded while it answers
        wait_until(lambda: ask(models, spec, PROMPT, "auto")[0] and merged_key in models.replies.loaded(), 180,
                   "the job's merged copy", every=QUIET_GAP)
        assert f"{spec.weights} (llama.cpp adapter)" in models.replies.loaded()

        def no_pytorch(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("PyTorch answered")

        monkeypatch.setattr(generation, "_generate", no_pytorch)
        for s in (spec, base, spec):  # the job from its merged copy, :base from the base's, and back
            for question in QUESTIONS[:2]:
                assert ask(models, s, question, "auto")[0] == expected[(s.model_id, question)], (s.model_id, question)
        merged = entry.llama._merged
        assert merged is not None and merged[0] == (spec.weights, spec.fingerprint)
        assert merged[1] is not entry.llama.engine and merged[1]._active is None and not merged[1]._adapters
        assert entry.llama.engine._active is None  # since the merged copy, the job never set its adapter there
        base_key = entry.llama.files.place(str(tiny_model))[2].name
        assert [p.name for p in (cache / "gguf").glob("*/merged-*")] == [f"merged-q8_0-{base_key}.gguf"]
        assert not list((cache / "gguf").glob("*/.*.tmp*"))  # the partial and the merge's scratch folder are gone
    finally:
        models.close()


def test_a_merged_copy_holds_the_tensors_of_the_jobs_own_gguf_export(tiny_model: Path,
                                                                    specs: tuple[ModelSpec, ModelSpec],
                                                                    tmp_path: Path) -> None:
    from gguf import GGUFReader

    from tunestudio.export_config import ExportConfig
    from tunestudio.worker.export import job as export

    spec = specs[0]
    out = tmp_path / "export"
    code = export.run(ExportConfig.model_validate({"source_dir": spec.weights, "target": "gguf",
                                                   "quantization": "q8_0", "output_dir": str(out)}), ListChannel())
    assert code == 0
    copy = llamacpp.Files(tmp_path / "gguf").merged(spec.weights, str(tiny_model))
    ours, theirs = GGUFReader(copy), GGUFReader(out / "model-q8_0.gguf")  # PyPI gguf's reader, not the converter's
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    # (that the copy is the job's and not its base's: test_auto_answers_a_job_from_its_merged_copy answers with it)
    assert [t.name for t, e in zip(ours.tensors, theirs.tensors, strict=True) if t.tensor_type != e.tensor_type
            or list(t.shape) != list(e.shape) or t.data.tobytes() != e.data.tobytes()] == []
    assert not list((tmp_path / "gguf").glob("*/.*"))  # no partial, no scratch folder of the fp32 merge


def test_merged_copies_beyond_the_last_two_asked_for_are_removed(tiny_model: Path, tmp_path: Path) -> None:
    files = llamacpp.Files(tmp_path / "gguf")
    name = f"merged-q8_0-{files.place(str(tiny_model))[2].name}.gguf"
    jobs = []
    for number in range(3):  # three jobs' copies, asked for one second apart (as far as their mtimes say)
        job = tmp_path / f"job{number}"
        job.mkdir()
        (job / "adapter_model.safetensors").write_bytes(b"weights")
        place = files.place(str(job))[2]
        place.mkdir(parents=True)
        (place / name).write_bytes(b"copy")
        (place / "adapter-f32.gguf").write_bytes(b"adapter")
        os.utime(place / name, ns=(10**18 + number * 10**9,) * 2)
        jobs.append(place / name)
    assert files.merged(str(tmp_path / "job0"), str(tiny_model)) == jobs[0]  # there already: not made again
    # job0's was the oldest; asked for now, it is the newest: job1's goes, and only the merged copy
    assert [p.exists() for p in jobs] == [True, False, True]
    assert all((p.parent / "adapter-f32.gguf").is_file() for p in jobs)


def test_a_merged_copy_is_put_in_place_by_its_own_jobs_request(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(llamacpp.Side, "_load", lambda self, threads: None)  # no base file: the engines are fakes
    side = llamacpp.Side(llamacpp.Files(tmp_path), "base", 512, 1, forced=True, merge=True)
    closed: list[str] = []

    class Fake:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    a, b = ("a", "1"), ("b", "1")
    side._merged, side._merged_ready = (b, Fake("b")), (a, Fake("a"))  # b's answers; a's was made meanwhile
    engine, new = side.merged(*b)
    assert (engine.name, new, closed) == ("b", False, [])  # b's request keeps b's copy, a's waits
    engine, new = side.merged(*a)
    assert (engine.name, new, closed) == ("a", True, ["b"])  # a's request puts a's in place, and says so once
    assert side.merged(*a)[1] is False and side.merged(*b) == (None, False)
    side.close()
    assert closed == ["b", "a"]


def test_the_files_are_made_once_and_follow_the_weights(tiny_model: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())
    files = llamacpp.Files(tmp_path / "cache" / "gguf")
    first = files.model(str(folder))
    made_at = first.stat().st_mtime_ns
    assert files.model(str(folder)) == first and first.stat().st_mtime_ns == made_at  # kept, not made again
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(made_at + 10**9, made_at + 10**9))  # the weights rewritten (as far as stat tells)
    second = files.model(str(folder))
    assert second != first and second.is_file() and not first.parent.exists()  # the stale copy removed
    assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.name != weights.name) == \
        [entry for entry in before if entry[0] != weights.name]  # nothing written into the model's folder

    shutil.rmtree(folder)  # a deleted job's folder: its copy goes when the next file is made
    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    # partials of that file: one of a worker killed while making it (removed), one of a live one (kept)
    place = files.place(str(other))[2]
    place.mkdir(parents=True)
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    killed, live = (place / f".model-q8_0.gguf.{pid}.7.tmp" for pid in (gone, os.getpid()))
    killed.write_text("half")
    live.write_text("half")
    assert files.model(str(other)).is_file() and not second.parent.exists()
    assert not killed.exists() and live.exists()


def test_an_adapter_llama_cpp_refuses_is_answered_by_pytorch(tiny_model: Path, specs: tuple[ModelSpec, ModelSpec],
                                                             cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, base = specs
    monkeypatch.setattr(llamacpp, "MIN_PARAMS", 0)
    models = Models(Replies(), str(cache))
    try:
        expected = ask(models, spec, PROMPT, "torch")[0]
        ask(models, base, PROMPT, "auto")
        entry = models._models[(str(tiny_model), "", False)]
        wait_until(lambda: entry.llama.state == "loaded", 120, "llama.cpp's copy loaded")
        ask(models, base, PROMPT, "auto")
        assert entry.llama.state == "serving"

        def refuse(self: Any, name: str, path: Path, key: tuple[str, str]) -> None:
            raise UserFacing(f"llama.cpp could not load the adapter {path}", 409, "model_unavailable")

        monkeypatch.setattr(llamacpp.Engine, "add_adapter", refuse)
        key = (spec.weights, spec.fingerprint)
        wait_until(lambda: ask(models, spec, PROMPT, "auto")[0] == expected and key in entry.llama._failed, 120,
                   "the adapter refused", every=QUIET_GAP)
        assert ask(models, spec, PROMPT, "auto")[0] == expected  # PyTorch's, and no 409
    finally:
        models.close()
    forced = Models(Replies(), str(cache))
    try:
        for _ in range(2):  # under TUNESTUDIO_CHAT_ENGINE=llama.cpp it says so, each time
            with pytest.raises(UserFacing, match="could not load the adapter") as refused:
                ask(forced, spec, PROMPT, "llama.cpp")
            assert refused.value.status == 409
    finally:
        forced.close()


def test_a_hub_id_is_read_from_its_local_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import: the module's, not env
    snapshot = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    assert Path(llamacpp.local_folder("someone/tiny")) == snapshot
    assert llamacpp.local_folder("someone/not-here") is None  # PyTorch answers: the converter has no folder
    assert llamacpp.local_folder(str(tmp_path)) == str(tmp_path)
