"""How the worker reports what failed: running out of memory comes with what to change in the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tunestudio.config import JobConfig
from tunestudio.events import Failed, Log, parse_event
from tunestudio.worker.errors import out_of_memory

from ..helpers.channel import ListChannel
from ..helpers.jobs import job_config

# torch's own wording (2.x caching allocator), cut short after the figures.
CUDA_OOM = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which "
            "1.50 GiB is free. Including non-PyTorch memory, this process has 138.21 GiB memory in use.")

BATCH_ADVICE = "a smaller batch_size (4) with gradient_accumulation_steps 2, which keeps the global batch of 8"
SEQ_ADVICE = "a shorter max_seq_length (64)"
CHECKPOINTING_ADVICE = "gradient_checkpointing: true (activations recomputed: slower, far less memory)"
QLORA_ADVICE = "training_type: qlora (4-bit base weights)"


def cfg(**overrides: Any) -> JobConfig:
    # job_config's defaults: lora, batch_size 8, gradient_accumulation_steps 1, max_seq_length 128
    return job_config("some/model", Path("/tmp/out"), **overrides)


def test_a_cuda_out_of_memory_error_names_what_to_change() -> None:
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    message = out_of_memory(torch.OutOfMemoryError(CUDA_OOM), cfg(), peak_mb=131_072.4)
    assert message == (
        "out of GPU memory: an allocation of 20.00 GiB failed on a GPU of 139.72 GiB; the job's peak was "
        f"131,072 MiB. To fit, try: {BATCH_ADVICE}; {SEQ_ADVICE}; {CHECKPOINTING_ADVICE}; {QLORA_ADVICE}."
    )


def test_a_qlora_job_is_not_told_to_use_qlora() -> None:
    message = out_of_memory(torch.OutOfMemoryError(CUDA_OOM), cfg(training_type="qlora"))
    assert message == (
        "out of GPU memory: an allocation of 20.00 GiB failed on a GPU of 139.72 GiB. "
        f"To fit, try: {BATCH_ADVICE}; {SEQ_ADVICE}; {CHECKPOINTING_ADVICE}."
    )
    assert "qlora" not in message


def test_advice_follows_the_job() -> None:
    full = cfg(training_type="full", batch_size=9, gradient_accumulation_steps=2, max_seq_length=2048,
               gradient_checkpointing=True)
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory."), full) == (
        "out of GPU memory: To fit, try: a smaller batch_size (3) with gradient_accumulation_steps 6, which keeps "
        "the global batch of 18; a shorter max_seq_length (1024); "
        "training_type: qlora (4-bit base weights and small adapters; or lora, full-size weights)."
    )
    prime = cfg(batch_size=7)
    assert "a smaller batch_size (1) with gradient_accumulation_steps 7, which keeps the global batch of 7" in (
        out_of_memory(torch.OutOfMemoryError("CUDA out of memory."), prime) or "")
    smallest = cfg(training_type="qlora", batch_size=1, max_seq_length=8, gradient_checkpointing=True)
    assert out_of_memory(MemoryError(), smallest) == (
        "out of memory: The job already has the settings that save the most memory: it needs a smaller model or "
        "more memory."
    )


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
])
def test_allocator_messages_without_the_class_are_gpu_memory(error: Exception) -> None:
    message = out_of_memory(error, cfg())
    assert message is not None and message.startswith("out of GPU memory: ")
    assert QLORA_ADVICE in message


def test_a_wrapped_out_of_memory_error_is_found_through_its_cause_and_context() -> None:
    try:
        try:
            raise torch.OutOfMemoryError(CUDA_OOM)
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("the training step failed") from oom
    except RuntimeError as wrapped:
        caused = wrapped
    assert (out_of_memory(caused, cfg()) or "").startswith("out of GPU memory: an allocation of 20.00 GiB failed")
    try:
        try:
            raise MemoryError
        except MemoryError:
            raise ValueError("while handling it, something else")  # noqa: B904 (the implicit context is the case)
    except ValueError as during:
        assert (out_of_memory(during, cfg()) or "").startswith("out of memory: To fit, try: ")


def test_the_cpu_allocator_is_plain_memory() -> None:
    with pytest.raises(RuntimeError, match="can't allocate memory") as caught:
        torch.empty(2**62, dtype=torch.uint8)
    assert out_of_memory(caught.value, cfg(), peak_mb=2048) == (
        "out of memory: the job's peak was 2,048 MiB. "
        f"To fit, try: {BATCH_ADVICE}; {SEQ_ADVICE}; {CHECKPOINTING_ADVICE}; {QLORA_ADVICE}."
    )


def test_other_errors_are_not_memory() -> None:
    assert out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), cfg()) is None
    assert out_of_memory(OSError(28, "No space left on device"), cfg()) is None
    assert out_of_memory(None, cfg()) is None


# peft asks the model a deprecated question while wrapping it; the worker process shows it, this test need not fail
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_a_job_whose_training_runs_out_of_gpu_memory_fails_with_advice(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real worker, in this process, up to the trainer; its first step raises what CUDA would."""
    from tunestudio.worker import main
    from tunestudio.worker.train import train as train_mod

    build_trainer = train_mod.build_trainer

    def build_failing_trainer(*args: Any, **kwargs: Any) -> Any:
        trainer, reporter = build_trainer(*args, **kwargs)

        def train(*a: Any, **kw: Any) -> None:
            raise torch.OutOfMemoryError(CUDA_OOM)

        trainer.train = train
        return trainer, reporter

    monkeypatch.setattr(train_mod, "build_trainer", build_failing_trainer)
    config = job_config(tiny_model, tmp_path / "out", precision="fp32", max_steps=3)
    channel = ListChannel()
    assert main.run(config, channel) == 1
    events = [parse_event(line) for line in channel.lines]
    assert any(isinstance(e, Log) and e.message.startswith("model: ") for e in events), channel.lines
    failed = events[-1]
    assert isinstance(failed, Failed)
    prefix = "out of GPU memory: an allocation of 20.00 GiB failed on a GPU of 139.72 GiB; the job's peak was "
    assert failed.message.startswith(prefix), failed.message
    assert failed.message.endswith(
        f" MiB. To fit, try: {BATCH_ADVICE}; {SEQ_ADVICE}; {CHECKPOINTING_ADVICE}; {QLORA_ADVICE}.")
    assert "Traceback" not in failed.message and "OutOfMemoryError" in failed.traceback


def test_checkpointing_that_auto_turned_on_is_not_advised_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunestudio.worker import errors

    job = cfg(training_type="qlora", batch_size=1, max_seq_length=8)
    assert job.gradient_checkpointing == "auto"
    assert CHECKPOINTING_ADVICE in (out_of_memory(MemoryError(), job) or "")
    monkeypatch.setitem(errors.decided, "gradient_checkpointing", True)
    assert CHECKPOINTING_ADVICE not in (out_of_memory(MemoryError(), job) or "")


TORCH_WRITE_FAILED = ("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
                      "data/0: file write failed")


def test_a_full_disk_fails_in_plain_words_without_torchs_internals(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tunestudio.worker import main

    def full(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError(TORCH_WRITE_FAILED)

    monkeypatch.setattr(main, "_train", full)
    channel = ListChannel()
    assert main.run(job_config("some/model", tmp_path / "out"), channel) == 1
    failed = parse_event(channel.lines[-1])
    assert isinstance(failed, Failed) and failed.message.startswith("disk full: writing a file failed")
    assert "inline_container" not in failed.message and "inline_container" in failed.traceback
