"""bench/realistic.py's chunked cross-entropy equals lm_head + cross_entropy: the loss and both gradients."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "realistic.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_realistic", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only: main() runs under __main__
    return module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_loss_and_gradients_equal_the_standard_path(dtype):
    bench = _bench()
    torch.manual_seed(0)
    n, hidden_size, vocab = 37, 16, 101  # chunks of 8: four full ones and a ragged one
    hidden = torch.randn(n, hidden_size, dtype=dtype)
    weight = torch.randn(vocab, hidden_size, dtype=dtype) * 0.5
    labels = torch.randint(0, vocab, (n,))
    labels[[0, 9, 30]] = -100  # ignored positions, as in prompt masking

    def run(loss_fn):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = loss_fn(h, w)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    reference = run(lambda h, w: torch.nn.functional.cross_entropy(h @ w.t(), labels, ignore_index=-100))
    chunked = run(lambda h, w: bench.chunked_lm_loss(h, w, labels, chunk=8))
    for got, want in zip(chunked, reference, strict=True):
        assert got.dtype == want.dtype
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    assert torch.all(chunked[1][[0, 9, 30]] == 0)  # no gradient from an ignored token


def test_frozen_weight_gets_no_gradient_and_num_items_divides():
    bench = _bench()
    torch.manual_seed(1)
    hidden = torch.randn(12, 8, requires_grad=True)
    weight = torch.randn(50, 8)  # frozen, as the tied head under LoRA
    labels = torch.randint(0, 50, (12,))
    loss = bench.chunked_lm_loss(hidden, weight, labels, chunk=5, num_items=24)
    loss.backward()
    want = torch.nn.functional.cross_entropy(hidden @ weight.t(), labels, reduction="sum") / 24
    assert torch.allclose(loss, want, rtol=1e-5)
    assert weight.grad is None and hidden.grad is not None
