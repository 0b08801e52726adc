"""worker/serve/serving.py: chat's int8 copy (issue 29) beside the exact fp32 one, and which one answers what."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from transformers import AutoModelForCausalLM

from tunestudio.worker.serve import serving
from tunestudio.worker.serve.serving import Int8Head, Served, int8_chat

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),  # peft's own call
    # torch's eager dynamic quantization asks for torchao: it is what torch 2.13 ships, and what serving uses
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.ao"),
    pytest.mark.filterwarnings("ignore::UserWarning:torch.ao"),
]


@pytest.fixture
def peft_model(tiny_model: Path) -> torch.nn.Module:
    """The tiny model with a LoRA adapter "job" whose B is not zero (an untrained adapter changes nothing)."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"), adapter_name="job")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    return model.eval()


def _plain(tiny_model: Path) -> torch.nn.Module:
    """The model as the worker loads it, before any adapter (Served copies it then)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def _ids() -> torch.Tensor:
    return torch.arange(10, 42).reshape(1, -1)


def test_the_choice_follows_the_setting_and_the_models_size(peft_model: torch.nn.Module,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    base = peft_model.get_base_model()
    monkeypatch.setenv(serving.PRECISION_ENV, "int8")
    assert int8_chat(base, "cpu")
    assert not int8_chat(base, "cuda")  # on a GPU the model is served as loaded
    monkeypatch.setenv(serving.PRECISION_ENV, "fp32")
    assert not int8_chat(base, "cpu")
    monkeypatch.setenv(serving.PRECISION_ENV, "auto")
    assert not int8_chat(base, "cpu")  # 1.2M parameters: below INT8_MIN_PARAMS, answers stay fp32's
    monkeypatch.setattr(serving, "INT8_MIN_PARAMS", 0)
    monkeypatch.setattr(serving, "_int8_matvec_seconds", lambda model: (1.0, 0.5))
    assert int8_chat(base, "cpu")
    monkeypatch.setattr(serving, "_int8_matvec_seconds", lambda model: (1.0, 0.9))  # not 15 % faster
    assert not int8_chat(base, "cpu")


def test_the_int8_heads_best_scores_are_the_exact_ones() -> None:
    torch.manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(500, 32), requires_grad=False)
    hidden = torch.randn(2, 3, 32)
    scores = Int8Head(weight)(hidden)
    exact = hidden @ weight.T
    top = scores.topk(16, dim=-1).indices  # the best are among the TOP_K rescored
    assert torch.allclose(scores.gather(-1, top), exact.gather(-1, top), atol=1e-5)
    assert torch.equal(scores.argmax(-1), exact.argmax(-1))
    assert not torch.allclose(scores, exact, atol=1e-6)  # the tail is int8's: it is an approximation at all


def test_the_int8_copy_follows_each_merge_and_the_exact_copy_stays_exact(peft_model: torch.nn.Module,
                                                                         tiny_model: Path) -> None:
    served = Served(_plain(tiny_model), torch.float32, int8=True)
    assert served.int8 is not None
    kinds = {type(m) for m in served.int8.modules()}
    assert DynamicLinear in kinds and Int8Head in kinds and torch.nn.Linear not in kinds
    ids = _ids()
    with torch.inference_mode():
        with peft_model.disable_adapter():
            base_logits = peft_model(ids).logits
        job_logits = peft_model(ids).logits
        assert (job_logits - base_logits).abs().max() > 0.5  # the adapter changes the answers

        served.merge(peft_model, "job")
        assert torch.allclose(served.model(ids).logits, job_logits, atol=1e-4)  # log-probabilities: exact
        int8_job = served.int8(ids).logits
        # int8 answers are the adapter's: within int8's error of them, far from the base's
        assert (int8_job - job_logits).abs().mean() < 0.25 * (int8_job - base_logits).abs().mean()
        job_layers = {p: served.int8.get_submodule(p) for p in served._merged}

        served.merge(peft_model, None)  # :base
        assert torch.allclose(served.model(ids).logits, base_logits, atol=1e-4)
        assert all(served.int8.get_submodule(p) is served._int8_base[p] for p in job_layers)
        int8_base = served.int8(ids).logits
        assert (int8_base - base_logits).abs().mean() < 0.25 * (int8_base - job_logits).abs().mean()

        served.merge(peft_model, "job")  # back again: the layers quantized the first time, not made again
        assert all(served.int8.get_submodule(p) is m for p, m in job_layers.items())
        assert torch.equal(served.int8(ids).logits, int8_job)

        served.forget("job")  # the adapter was reloaded from disk: its layers are made again
        served.merge(peft_model, "job")
        assert all(served.int8.get_submodule(p) is not m for p, m in job_layers.items())


def test_whether_an_adapter_merges_is_asked_once_until_it_is_reloaded(peft_model: torch.nn.Module, tiny_model: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served(_plain(tiny_model), torch.float32)
    walks: list[str] = []
    walk = serving._lora_layers
    monkeypatch.setattr(serving, "_lora_layers", lambda model, adapter: walks.append(adapter) or walk(model, adapter))
    assert served.can_merge(peft_model, "job") and served.can_merge(peft_model, "job")
    assert not served.can_merge(peft_model, "other")  # not in the model: no merge
    assert walks == ["job", "other"]  # each request asks twice: one walk of the modules an adapter
    peft_model.peft_config["job"].use_dora = True  # reloaded from disk as something a merge cannot express
    served.forget("job")
    assert not served.can_merge(peft_model, "job") and walks == ["job", "other", "job"]


def test_without_int8_there_is_no_copy(peft_model: torch.nn.Module, tiny_model: Path) -> None:
    served = Served(_plain(tiny_model), torch.float32)
    assert served.int8 is None
    served.merge(peft_model, "job")
    assert not any(isinstance(m, DynamicLinear | Int8Head) for m in served.model.modules())


def test_chat_answers_from_the_int8_copy_and_log_probabilities_from_the_exact_one(
        peft_model: torch.nn.Module, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import queue

    from tunestudio.inference_protocol import ModelSpec
    from tunestudio.worker.serve.generation import Models

    peft_model.save_pretrained(tmp_path / "adapter", selected_adapters=["job"])
    (tmp_path / "adapter" / "job").rename(tmp_path / "job")  # save_pretrained puts a named adapter in a subfolder
    monkeypatch.setenv(serving.PRECISION_ENV, "int8")
    models = Models(queue.Queue())
    spec = ModelSpec(job_id="j1", base=False, base_model=str(tiny_model), weights=str(tmp_path / "job"),
                     kind="adapter", tokenizer=str(tiny_model))
    first, _, _ = models.for_spec(spec, chat=True)  # the int8 copy is made in a thread; till then, the exact one
    exact, _, _ = models.for_spec(spec)
    served = next(iter(models._models.values())).served
    assert served.int8_ready.wait(60)
    chat, _, _ = models.for_spec(spec, chat=True)
    assert chat is not exact and first in (chat, exact)
    assert any(isinstance(m, DynamicLinear) for m in chat.modules())
    assert not any(isinstance(m, DynamicLinear | Int8Head) for m in exact.modules())
    with torch.inference_mode():
        assert torch.allclose(exact(_ids()).logits, peft_model(_ids()).logits, atol=1e-4)


def test_an_int8_copy_made_in_the_background_takes_the_adapter_merged_meanwhile(
        peft_model: torch.nn.Module, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    go = threading.Event()
    quantized = serving._quantized
    monkeypatch.setattr(serving, "_quantized", lambda *a: go.wait(30) and quantized(*a))
    served = Served(_plain(tiny_model), torch.float32, int8=True, background=True)
    assert served.int8 is None and not served.int8_ready.is_set()  # the copy waits: chat answers exactly
    served.merge(peft_model, "job")  # a first request, before the copy is whole
    go.set()
    assert served.int8_ready.wait(60) and served.int8 is not None
    ids = _ids()
    with torch.inference_mode():
        with peft_model.disable_adapter():
            base_logits = peft_model(ids).logits
        job_logits = peft_model(ids).logits
        int8_job = served.int8(ids).logits
    assert (int8_job - job_logits).abs().mean() < 0.25 * (int8_job - base_logits).abs().mean()
    assert all(served.int8.get_submodule(p) is m for p, m in served._int8_adapters["job"].items())


def test_the_int8_copy_is_begun_once_the_worker_is_quiet(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from tunestudio.worker.serve.quiet import QUIET_S, Quiet

    quiet = Quiet()
    begun: list[float] = []  # how long the worker had been quiet when the copy's first layer was made
    quantized = serving._quantized
    monkeypatch.setattr(serving, "_quantized", lambda *a: (begun or begun.append(quiet.seconds()), quantized(*a))[1])
    monkeypatch.setattr(serving, "INT8_MAX_DEFER_S", 120.0)  # a loaded machine's pause is not taken for the bound
    with quiet:  # the request that loaded the model: its answer has the cores to itself
        served = Served(_plain(tiny_model), torch.float32, int8=True, background=True, quiet=quiet)
        time.sleep(QUIET_S + 0.2)
        assert not begun and not served.int8_ready.is_set()
    assert served.int8_ready.wait(60) and served.int8 is not None
    assert begun[0] >= QUIET_S, begun
    with torch.inference_mode():  # a whole copy: every layer quantized
        assert served.int8(_ids()).logits.isfinite().all()


def test_a_model_put_away_before_its_int8_copy_began_gets_none(tiny_model: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tunestudio.worker.serve.quiet import Quiet

    quiet = Quiet()
    made: list[int] = []
    monkeypatch.setattr(serving, "_quantized", lambda *a: made.append(1))
    with quiet:  # the copy waits for the answer that loaded the model
        served = Served(_plain(tiny_model), torch.float32, int8=True, background=True, quiet=quiet)
        served.close()  # evicted (or the worker ends) meanwhile: the waiting thread lets go at once
        assert served.int8_ready.wait(2)  # not at the copy's bound (INT8_MAX_DEFER_S)
    assert served.int8 is None and not made
