"""The fused LM head's log-probabilities on a CPU, at the cost of plain full logits.

TRL 1.16 computes every trainer's per-token log-probabilities (SFT, DPO, KTO, GRPO, RLOO) through
`add_fused_lm_head`, which calls `ChunkedLogProbFunction` (trl/kernels/chunked_logprob.py) on tiles of
4096 tokens × 32768 vocabulary entries without ever holding the full logits. On CUDA a Triton kernel folds
each tile; on a CPU a torch fallback of that kernel does it in about twenty elementwise passes per tile, the
backward projects every tile a second time, and every position is scored, prompt and padding included. A
whole training step then took 1.34–2.63× the time of the same step with full logits (bench/realistic.py,
bench/RESULTS.md).

`CpuLogProb` returns the same outputs from the same arguments on a CPU: chunks of tokens whose fp32 logits
take at most `CHUNK_ELEMENTS`, a handful of passes per chunk, and the gradients of the log-probabilities
made in the forward while the chunk is at hand, so the backward only scales them (it projects again only
when the entropy needs a gradient, or a trained head's rows are weighted unequally). `install()` routes
TRL's calls on CPU tensors to it and lets the fused forward pass only the labelled positions; CUDA and
other devices keep TRL's kernel. tests/worker/test_lmhead.py holds it to TRL's own function, outputs and
gradients.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

CHUNK_ELEMENTS = 1 << 25  # one chunk's fp32 logits: 128 MiB (256 tokens at a 128k vocabulary)


def _chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


# The forward's chunk buffers (a chunk's projection, its fp32 logits, their exponentials), kept between chunks and
# calls: at most CHUNK_ELEMENTS each, 320 MiB in all at a 262k vocabulary (448 MiB once precision auto has run a
# step in each precision: the projection's buffer is kept per dtype). One thread calls the head. Made anew in every
# chunk, each was above the allocator's mmap threshold (performance.configure_allocator: 32 MiB), so each was
# mapped, faulted in and zeroed by the kernel, then unmapped: a bf16 -> fp32 copy of a chunk took 26-72 ms instead
# of ~10 (bench/mfu.py's profile of a 262k-vocabulary LoRA step).
_workspace: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def _scratch(name: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A [rows, cols] buffer of uninitialised memory, the same one each time for a name, dtype and device (grown
    when too small): valid until the next call for that name."""
    key = (name, dtype, device)
    held = _workspace.get(key)
    if held is None or held.numel() < rows * cols:
        _workspace.pop(key, None)  # the old buffer goes before the new one is made
        held = _workspace[key] = torch.empty(rows * cols, dtype=dtype, device=device)
    return held[: rows * cols].view(rows, cols)


class _Head:
    """The projection and the logit transform TRL applies (logit scale, final soft-capping, temperature)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, temperature: float,
                 softcap: float | None, logit_scale: float) -> None:
        self.weight = _cast(weight, dtype)
        self.bias = None if bias is None else bias.to(dtype)
        self.dtype = dtype
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32
        self.softcap = softcap
        self.pre = logit_scale / softcap if softcap else 1.0
        self.post = softcap / temperature if softcap else logit_scale / temperature
        self.slope = logit_scale / temperature  # dz/dy without soft-capping

    def logits(self, hidden: torch.Tensor, scratch: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """z = transform(hidden @ weightᵀ + bias) in the accumulation dtype, and tanh's output when soft-capped.
        scratch: y and z in the kept chunk buffers (`_scratch`: valid until the next chunk), not new tensors."""
        h = hidden.to(self.dtype)
        rows, vocab = h.shape[0], self.weight.shape[0]
        y = torch.mm(h, self.weight.t(), out=_scratch("y", rows, vocab, self.dtype, h.device)) if scratch \
            else h @ self.weight.t()
        if self.bias is not None:
            y += self.bias
        if self.acc == self.dtype:
            z = y  # y itself in fp32, no longer needed
        else:  # a copy under bf16
            z = _scratch("z", rows, vocab, self.acc, h.device).copy_(y) if scratch else y.to(self.acc)
        if self.softcap:
            t = z.mul_(self.pre).tanh_()
            return t * self.post, t
        if self.post != 1.0:
            z.mul_(self.post)
        return z, None

    def chain(self, grad: torch.Tensor, tanh: torch.Tensor | None) -> torch.Tensor:
        """d/dz → d/dy, in place."""
        if tanh is not None:
            return grad.mul_(1 - tanh * tanh).mul_(self.post * self.pre)
        return grad.mul_(self.slope) if self.slope != 1.0 else grad


def _add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b: in place when the dtypes agree, else through one product in a's dtype (bf16 on a CPU has no
    fp32-output matmul; each chunk's product is rounded once, as F.linear's weight gradient is under autocast)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc += a @ b


_ROWDOT_VOCAB = 4096  # measured: 512 rows of 8,192 take 3.5 ms a dot a row, 5.4 ms as a product and a sum


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_v a[n, v]·b[n, v] for each row. Over a large vocabulary, one dot product a row, which reads each row once
    and makes no [n, vocab] temporary (1 thread, 128 rows of 262,144: 19 ms against 103 ms for a batched
    [1, V] x [V, 1] product and 80 ms for a product and a sum; they were 10 % of a LoRA step of such a model); over a
    small one, a product and a sum (1,024 rows of 550: 0.5 ms, where a dot a row is 20 ms of Python calls)."""
    if a.shape[1] >= _ROWDOT_VOCAB:
        return torch.stack([torch.dot(x, y) for x, y in zip(a, b, strict=True)])
    return (a * b).sum(1)


# The last frozen head weight cast to the compute dtype, kept while that weight is unchanged: one entry, (the weight,
# its version counter, storage, dtype and device, the target dtype) -> the cast, dropped when the weight goes. A LoRA
# job's head is frozen, and casting 262,144 x 640 weights again in every forward was 5 % of its step (bench/mfu.py);
# a trained head changes every step and is cast anew. An in-place change moves the version counter; a write through
# `.data` does not, and the worker makes none to a frozen head. The worker calls the head from one thread.
_cast_cache: list[tuple[Any, tuple[Any, ...], torch.Tensor]] = []


def _cast(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if weight.dtype == dtype:
        return weight
    if weight.requires_grad:
        return weight.to(dtype)
    key = (weight._version, weight.data_ptr(), weight.dtype, weight.device, dtype)
    if _cast_cache and _cast_cache[0][0]() is weight and _cast_cache[0][1] == key:
        return _cast_cache[0][2]
    _cast_cache.clear()  # the old cast's memory goes before the new one is made
    cast = weight.to(dtype)
    _cast_cache.append((weakref.ref(weight, lambda _: _cast_cache.clear()), key, cast))
    return cast


def _first_maximum(z: torch.Tensor, top: torch.Tensor, target: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Whether each row's target is its first maximum (TRL's "ties with an earlier token do not count"): the
    target's logit equals the row's maximum, and no earlier entry does. The same as argmax == target (but for a row
    whose target's logit is NaN: never its top-1 here), without max's indices over the whole chunk (4x amax's time
    at a 262k vocabulary: 8 % of the head's). The rows at their maximum are checked for an earlier tie one by one
    when they are few (a large vocabulary's chunk has at most 256 rows), else argmax decides for the whole chunk."""
    hit = target == top
    rows = hit.nonzero().squeeze(1)
    if rows.numel() > 256:
        return z.argmax(1) == index
    for row in rows.tolist():
        col = int(index[row])
        if col and bool((z[row, :col] == top[row]).any()):
            hit[row] = False
    return hit


def _output_buffers(n: int, acc: torch.dtype, device: torch.device, outputs: tuple[str, ...]
                    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """The forward's outputs, unfilled: lse, log_probs, the float extras asked for, is_top1 if asked for."""
    lse = torch.empty(n, dtype=acc, device=device)
    log_probs = torch.empty(n, dtype=acc, device=device)
    extra = {name: torch.empty(n, dtype=acc, device=device) for name in outputs
             if name in ("entropy", "log_sum_sq_probs", "mean_logits")}
    is_top1 = torch.empty(n, dtype=torch.bool, device=device) if "is_top1" in outputs else None
    return lse, log_probs, extra, is_top1


def _gradient_buffers(hidden: torch.Tensor, weight: torch.Tensor, acc: torch.dtype, need: list[bool]
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of hidden (each row written once), weight and bias (summed over chunks), where needed."""
    grad_h = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if need[0] else None
    grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need[1] else None
    grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need[2] else None
    return grad_h, grad_w, grad_b


class CpuLogProb(torch.autograd.Function):
    """`ChunkedLogProbFunction.apply`'s arguments and outputs, with `grad_enabled` first (the forward of an
    autograd Function always runs without grad, so the caller says whether gradients will be wanted)."""

    @staticmethod
    def forward(ctx: Any, grad_enabled: bool, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, temperature: float, chunk_size: int,
                final_logit_softcapping: float | None = None, logit_scale: float = 1.0,
                outputs: tuple[str, ...] = ("log_probs",)) -> tuple[Any, ...]:
        del chunk_size  # TRL's tile width; the chunks here are of tokens
        ctx.set_materialize_grads(False)
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        need = [grad_enabled and flag for flag in ctx.needs_input_grad[1:4]]  # hidden, weight, bias (False if None)
        n, vocab = hidden.shape[0], weight.shape[0]
        with torch.autocast(device, enabled=False):
            head = _Head(weight, bias, dtype, temperature, final_logit_softcapping, logit_scale)
            lse, log_probs, extra, is_top1 = _output_buffers(n, head.acc, hidden.device, outputs)
            grad_h, grad_w, grad_b = _gradient_buffers(hidden, weight, head.acc, need)
            rows = _chunk_rows(vocab)
            for start in range(0, n, rows):
                part = slice(start, start + rows)
                h, index = hidden[part], targets[part].unsqueeze(1)
                z, tanh = head.logits(h, scratch=True)
                target = z.gather(1, index).squeeze(1)
                top = z.amax(1)
                if is_top1 is not None:
                    is_top1[part] = _first_maximum(z, top, target, index.squeeze(1))
                if "mean_logits" in extra:
                    extra["mean_logits"][part] = z.sum(1) / vocab
                shifted = z.sub_(top.unsqueeze(1))
                if "entropy" in extra:  # shifted is read again: the exponentials go to their own buffer
                    e = torch.exp(shifted, out=_scratch("e", *shifted.shape, shifted.dtype, shifted.device))
                else:
                    e = shifted.exp_()
                total = e.sum(1)
                log_total = total.log()
                lse[part] = top + log_total
                log_probs[part] = target - lse[part]
                if "entropy" in extra:  # −Σ p·log p = log Σe − Σ e·(z − max) / Σe
                    extra["entropy"][part] = log_total - _rowdot(e, shifted) / total
                if "log_sum_sq_probs" in extra:
                    extra["log_sum_sq_probs"][part] = _rowdot(e, e).log() - 2 * log_total
                if any(need):  # d log p_target / dz = one-hot − softmax
                    grad = e.div_(total.neg().unsqueeze(1))  # −softmax in one pass
                    grad.scatter_add_(1, index, torch.ones_like(index, dtype=grad.dtype))
                    grad = head.chain(grad, tanh)
                    if need[2]:
                        grad_b += grad.sum(0)
                    if grad.dtype != dtype:  # into the projection's buffer: y is spent
                        grad = _scratch("y", *grad.shape, dtype, grad.device).copy_(grad)
                    if need[0]:
                        grad_h[part] = grad @ head.weight
                    if need[1]:
                        _add_product(grad_w, grad.t(), h.to(dtype))
        entropy = extra.get("entropy")
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.made = (grad_h, grad_w, grad_b)  # not inputs or outputs: plain attributes, scaled in place below
        ctx.head = (dtype, temperature, final_logit_softcapping, logit_scale)
        ctx.need = need
        frozen = [extra.get("log_sum_sq_probs"), extra.get("mean_logits"), is_top1]
        ctx.mark_non_differentiable(*(x for x in frozen if x is not None))
        return (log_probs, entropy, *frozen)

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None,
                 *_: Any) -> tuple[Any, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        grad_h, grad_w, grad_b = ctx.made
        ctx.made = None
        scale = grad_log_probs
        uniform = scale is None or scale.numel() == 0 or bool((scale == scale[0]).all())
        if grad_entropy is not None or (not uniform and (ctx.need[1] or ctx.need[2])):
            grads = _recompute(ctx, hidden, weight, bias, targets, lse, entropy, grad_log_probs, grad_entropy)
        elif scale is None:
            grads = (None, None, None)
        else:
            step = scale[0] if scale.numel() else 0.0
            grads = (None if grad_h is None else grad_h * scale.to(grad_h.dtype).unsqueeze(1),
                     None if grad_w is None else grad_w.mul_(step),
                     None if grad_b is None else grad_b.mul_(step))
        hidden_grad, weight_grad, bias_grad = (
            None if g is None else g.to(t.dtype) for g, t in zip(grads, (hidden, weight, bias), strict=True))
        return None, hidden_grad, weight_grad, bias_grad, None, None, None, None, None, None


def _recompute(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None,
               grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
    """The general backward: project each chunk again and weight every row by its own upstream gradients."""
    dtype, temperature, softcap, logit_scale = ctx.head
    need = ctx.need
    device = hidden.device.type
    with torch.autocast(device, enabled=False):
        head = _Head(weight, bias, dtype, temperature, softcap, logit_scale)
        grad_h, grad_w, grad_b = _gradient_buffers(hidden, weight, head.acc, need)
        rows = _chunk_rows(weight.shape[0])
        for start in range(0, hidden.shape[0], rows):
            part = slice(start, start + rows)
            h, index = hidden[part], targets[part].unsqueeze(1)
            z, tanh = head.logits(h)
            log_p = z.sub_(lse[part].unsqueeze(1))
            p = log_p.exp()
            grad = torch.zeros_like(p)
            if grad_entropy is not None:  # d entropy / dz = −p·(log p + entropy)
                ge = grad_entropy[part].to(head.acc).unsqueeze(1)
                grad -= ge * p * (log_p + entropy[part].unsqueeze(1))
            if grad_log_probs is not None:  # d log p_target / dz = one-hot − p
                gl = grad_log_probs[part].to(head.acc).unsqueeze(1)
                grad -= gl * p
                grad.scatter_add_(1, index, gl)
            grad = head.chain(grad, tanh)
            if grad_b is not None:
                grad_b += grad.sum(0)
            grad = grad.to(dtype)
            if grad_h is not None:
                grad_h[part] = grad @ head.weight
            if grad_w is not None:
                _add_product(grad_w, grad.t(), h.to(dtype))
    return grad_h, grad_w, grad_b


class _Dispatch:
    """Stands where `trl.trainer.utils` looks up `_ChunkedLogProbFunction`: CPU tensors go to `CpuLogProb`,
    the rest to TRL's kernel."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def apply(self, hidden: torch.Tensor, *args: Any) -> Any:
        if hidden.device.type == "cpu":
            return CpuLogProb.apply(torch.is_grad_enabled(), hidden, *args)
        return self.original.apply(hidden, *args)


def install() -> bool:
    """Route TRL's fused LM head to `CpuLogProb` on CPU tensors, in this process; False when this TRL has
    none of the names patched (the fused head then runs as TRL ships it)."""
    try:
        from trl.trainer import utils as trl_utils
    except ImportError:
        return False
    original = getattr(trl_utils, "_ChunkedLogProbFunction", None)
    use_triton = getattr(trl_utils, "_use_triton", None)
    if original is None or use_triton is None:
        return False
    if isinstance(original, _Dispatch):
        return True
    trl_utils._ChunkedLogProbFunction = _Dispatch(original)

    def compact(device: torch.device) -> bool:  # score only the labelled positions on a CPU too
        return device.type == "cpu" or use_triton(device)

    trl_utils._use_triton = compact
    return True
