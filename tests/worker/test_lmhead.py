"""The CPU fused LM head: TRL's own `ChunkedLogProbFunction` is the reference for every output and gradient."""

from __future__ import annotations

import pytest

OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def _inputs(n: int = 37, vocab: int = 301, hidden: int = 24, bias: bool = False, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) * 0.3
    b = torch.randn(vocab, generator=g) * 0.1 if bias else None
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[:5] = torch.matmul(h[:5], w.t()).argmax(1)  # some rows whose target is the top logit
    return h, w, b, targets


def _run(fn, h, w, b, targets, *, grad_w: bool, head: tuple, loss_of, bf16: bool = False, outputs=OUTPUTS):
    """Outputs and the gradients of loss_of(outputs) for hidden, weight and bias."""
    import torch
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    h = h.clone().requires_grad_(True)
    w = w.clone().requires_grad_(grad_w)
    b = None if b is None else b.clone().requires_grad_(grad_w)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = fn(h, w, b, targets, head[0], _CHUNKED_LOGPROB_CHUNK_SIZE, head[1], head[2], outputs)
    loss_of(out).backward()
    return [x.detach() if x is not None else None for x in out], [h.grad, w.grad, None if b is None else b.grad]


def _trl(*args):
    from trl.kernels import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(*args)


def _ours(*args):
    import torch

    from tunestudio.worker.train.lmhead import CpuLogProb

    return CpuLogProb.apply(torch.is_grad_enabled(), *args)


def _close(a, b, tol: float) -> None:
    import torch

    if a is None or b is None:
        assert a is None and b is None
        return
    if a.dtype == torch.bool:
        assert torch.equal(a, b)
        return
    a, b = a.detach(), b.detach()
    scale = max(float(a.abs().max()), 1e-6)
    assert float((a.float() - b.float()).abs().max()) <= tol * scale, (float((a - b).abs().max()), scale)


def _mean_nll(out):
    return -out[0].mean()


def _weighted(out):  # unequal weights per row and a gradient through the entropy: the recomputing backward
    import torch

    weights = torch.linspace(0.1, 2.0, out[0].numel())
    return -(out[0] * weights).sum() + 0.3 * out[1].sum()


@pytest.mark.parametrize("head", [(1.0, None, 1.0), (0.7, 30.0, 0.5), (1.3, None, 2.0)],
                         ids=["plain", "softcap-scale-temperature", "scale-temperature"])
@pytest.mark.parametrize("grad_w", [False, True], ids=["frozen-head", "trained-head"])
@pytest.mark.parametrize("loss_of", [_mean_nll, _weighted], ids=["nll", "weighted-with-entropy"])
def test_matches_trl_outputs_and_gradients(monkeypatch, head, grad_w, loss_of) -> None:
    from tunestudio.worker.train import lmhead

    monkeypatch.setattr(lmhead, "CHUNK_ELEMENTS", 301 * 8)  # chunks of 8 rows: the last one partial
    args = _inputs(bias=grad_w)
    ref_out, ref_grads = _run(_trl, *args, grad_w=grad_w, head=head, loss_of=loss_of)
    out, grads = _run(_ours, *args, grad_w=grad_w, head=head, loss_of=loss_of)
    assert bool(ref_out[4][:5].all())  # the rows built to have their target on top are seen as such
    for name, a, b in zip(OUTPUTS, ref_out, out, strict=True):
        _close(a, b, 1e-5), name
    for a, b in zip(ref_grads, grads, strict=True):
        _close(a, b, 1e-5)


@pytest.mark.parametrize("head", [(1.0, None, 1.0), (0.7, 30.0, 0.5)], ids=["plain", "softcap-scale-temperature"])
@pytest.mark.parametrize("loss_of", [_mean_nll, _weighted], ids=["nll", "weighted-with-entropy"])
def test_bf16_chunks_reuse_their_buffers_without_changing_a_row(monkeypatch, head, loss_of) -> None:
    """Under bf16 autocast, chunks of 8 rows (the kept buffers reused 5 times, the last chunk partial) give every
    row bitwise what one chunk gives, and the head's gradient up to the order of its sums; TRL's kernel under bf16
    agrees with both."""
    from tunestudio.worker.train import lmhead

    args = _inputs(bias=True)
    whole = _run(_ours, *args, grad_w=True, head=head, loss_of=loss_of, bf16=True)
    monkeypatch.setattr(lmhead, "CHUNK_ELEMENTS", 301 * 8)
    chunked = _run(_ours, *args, grad_w=True, head=head, loss_of=loss_of, bf16=True)
    for a, b in zip(whole[0], chunked[0], strict=True):
        assert (a is None and b is None) or torch_equal(a, b)
    assert torch_equal(whole[1][0], chunked[1][0])  # the hidden states' gradient, row by row
    for a, b in zip(whole[1][1:], chunked[1][1:], strict=True):
        _close(a, b, 1e-2)
    trl = _run(_trl, *args, grad_w=True, head=head, loss_of=loss_of, bf16=True)  # and TRL's kernel agrees
    for a, b in zip(trl[0][:2] + trl[1], chunked[0][:2] + chunked[1], strict=True):
        _close(a, b, 2e-2)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_bf16_autocast_is_as_close_to_fp32_as_trls() -> None:
    """Under bf16 autocast the projections run in bf16 (as F.linear's would): the error against the fp32 result
    stays within what TRL's own kernel makes."""
    args = _inputs(n=64, vocab=2000, hidden=64)
    exact_out, exact_grads = _run(_trl, *args, grad_w=True, head=(1.0, None, 1.0), loss_of=_mean_nll)
    for fn in (_trl, _ours):
        out, grads = _run(fn, *args, grad_w=True, head=(1.0, None, 1.0), loss_of=_mean_nll, bf16=True)
        _close(exact_out[0], out[0], 2e-2)
        _close(exact_grads[0], grads[0], 2e-2)
        _close(exact_grads[1], grads[1], 2e-2)


def test_a_frozen_head_cast_once_is_cast_again_when_it_changes() -> None:
    """A frozen head's bf16 copy is kept between calls (a LoRA job's head), and made again once the weight is
    changed in place (a loaded checkpoint) or another weight comes: never a stale copy."""
    import torch

    h, w, b, targets = _inputs(n=16, vocab=500, hidden=32)
    w = w.clone()

    def log_probs() -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return _ours(h, w, b, targets, 1.0, 32768, None, 1.0, ("log_probs",))[0]

    def fresh() -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return _ours(h, w.clone(), b, targets, 1.0, 32768, None, 1.0, ("log_probs",))[0]

    from tunestudio.worker.train.lmhead import _cast

    first = log_probs()
    assert torch.equal(first, log_probs()) and _cast(w, torch.bfloat16) is _cast(w, torch.bfloat16)  # kept
    w.mul_(1.5)
    changed = log_probs()  # the same weight, changed in place: cast again
    assert not torch.equal(changed, first) and torch.equal(changed, fresh())
    assert torch.equal(log_probs(), changed)  # and after another weight came in between


def test_without_grad_and_without_rows() -> None:
    import torch

    h, w, b, targets = _inputs()
    with torch.no_grad():
        out = _ours(h, w, b, targets, 1.0, 32768, None, 1.0, ("log_probs",))
    assert out[0].shape == (37,) and out[1] is None
    empty = _run(_ours, h[:0], w, b, targets[:0], grad_w=True, head=(1.0, None, 1.0),
                 loss_of=lambda o: -o[0].sum())
    assert empty[0][0].shape == (0,) and float(empty[1][1].abs().sum()) == 0.0


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
def test_installed_the_fused_forward_keeps_loss_and_gradients(monkeypatch) -> None:
    """A real model patched by TRL's `add_fused_lm_head`, full and LoRA, a batch with prompt and padding
    positions: the same loss, metrics and parameter gradients with the CPU head installed."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer import utils as trl_utils

    from tunestudio.worker.train import lmhead

    config = LlamaConfig(vocab_size=700, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    ids = torch.randint(3, 700, (3, 20), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :6] = -100  # prompt
    labels[2, 14:] = -100  # padding
    mask = (labels != -100) | (torch.arange(20) < 6)

    def step(lora: bool):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
        if lora:
            model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
        out = model(input_ids=ids, attention_mask=mask.long(), labels=labels, fused_lm_head=True, use_cache=False)
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return out, grads

    # monkeypatch restores TRL's names after the test
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", trl_utils._ChunkedLogProbFunction)
    monkeypatch.setattr(trl_utils, "_use_triton", trl_utils._use_triton)
    reference = {lora: step(lora) for lora in (False, True)}
    assert lmhead.install() and lmhead.install()  # idempotent
    assert isinstance(trl_utils._ChunkedLogProbFunction, lmhead._Dispatch)
    for lora in (False, True):
        (ref, ref_grads), (out, grads) = reference[lora], step(lora)
        _close(ref.loss, out.loss, 1e-5)
        for field in ("log_probs", "entropy", "is_top1"):
            _close(getattr(ref, field), getattr(out, field), 1e-5)
        assert ref_grads.keys() == grads.keys() and grads
        for name in grads:
            _close(ref_grads[name], grads[name], 1e-4)


def test_is_top1_counts_the_first_maximum_only() -> None:
    """A target tied with an earlier entry at the row's maximum is not its top-1 (TRL's rule, argmax's first index);
    tied with a later one, it is."""
    import torch

    from tunestudio.worker.train.lmhead import _first_maximum

    z = torch.tensor([[1.0, 5.0, 5.0, 0.0], [1.0, 5.0, 5.0, 0.0], [9.0, 1.0, 2.0, 3.0], [0.0, 1.0, 7.0, 2.0],
                      [4.0, 4.0, 4.0, 4.0]])
    index = torch.tensor([2, 1, 0, 3, 0])
    top, target = z.amax(1), z.gather(1, index.unsqueeze(1)).squeeze(1)
    expected = z.argmax(1) == index
    assert expected.tolist() == [False, True, True, False, True]
    assert torch.equal(_first_maximum(z, top, target, index), expected)
    many = z.repeat(100, 1), index.repeat(100)  # past the rows checked one by one: argmax over the hits
    top, target = many[0].amax(1), many[0].gather(1, many[1].unsqueeze(1)).squeeze(1)
    assert torch.equal(_first_maximum(many[0], top, target, many[1]), expected.repeat(100))


@pytest.mark.parametrize("vocab", [100, 5000])
def test_row_dot_products_on_either_side_of_the_vocabulary_threshold(vocab: int) -> None:
    import torch

    from tunestudio.worker.train.lmhead import _ROWDOT_VOCAB, _rowdot

    assert (vocab >= _ROWDOT_VOCAB) == (vocab == 5000)
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(7, vocab, generator=g), torch.randn(7, vocab, generator=g)
    exact = (a.double() * b.double()).sum(1)
    assert torch.allclose(_rowdot(a, b).double(), exact, rtol=1e-4, atol=1e-3)
