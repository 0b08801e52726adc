"""The training process's allocator keeps a step's freed memory for the next step (worker/train/performance.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A step's activations as glibc sees them: after one block above its first mmap threshold is freed (its dynamic
# thresholds move), three blocks are allocated, used and freed each step; page faults counted over 20 steps.
SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from tunestudio.worker.train.performance import configure_allocator

    chosen = configure_allocator() if sys.argv[1] == "configure" else None
    np.ones(8 << 20, dtype=np.uint8)

    def step():
        blocks = [np.ones(6 << 20, dtype=np.uint8) for _ in range(3)]
        del blocks

    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(json.dumps({"set": chosen, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20}))
""")


def _run(how: str, **env: str) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, how], cwd=REPO, env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_step_memory_is_kept_unless_the_user_chose_the_thresholds() -> None:
    default = _run("as is")
    assert default["faults"] > 1000  # 18 MiB handed back and faulted in again every step (4 KiB pages)
    configured = _run("configure")
    assert configured["set"] is True and configured["faults"] < 50
    users_own = _run("configure", MALLOC_TRIM_THRESHOLD_="999999")
    assert users_own["set"] is False and users_own["faults"] > 1000  # their setting stands


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
def test_lora_on_an_fp32_model_skips_peft_s_input_casts_and_trains_bitwise_the_same(tiny_model: Path) -> None:
    """prepare_model turns off peft's cast of each adapted layer's input to the adapters' dtype on an all-fp32 model
    (under bf16 autocast it was cast to fp32 and straight back): the loss and every adapter gradient of a bf16
    autocast step stay bitwise those of peft's default."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForCausalLM

    from tunestudio.config import JobConfig
    from tunestudio.worker.train.model import prepare_model

    cfg = JobConfig.model_validate({"model_name": str(tiny_model), "local_datasets": ["x.jsonl"],
                                    "training_type": "lora", "lora_r": 8})
    ids = torch.randint(0, 500, (2, 48), generator=torch.Generator().manual_seed(0))

    def counted(cast_input, calls: list[bool]):  # type: ignore[no-untyped-def]
        def wrapper(x, dtype):  # type: ignore[no-untyped-def]
            out = cast_input(x, dtype)
            calls.append(out is not None and out.dtype != x.dtype)
            return out
        return wrapper

    def step(cast: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = prepare_model(AutoModelForCausalLM.from_pretrained(tiny_model), cfg, gradient_checkpointing=False)
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        assert layers and not any(m.cast_input_dtype_enabled for m in layers)
        calls = []
        for m in layers:
            m.cast_input_dtype_enabled = cast
            m.lora_B.default.weight.data.normal_(0, 0.02)  # B starts at zero: the adapters' path would add nothing
            m._cast_input_dtype = counted(m._cast_input_dtype, calls)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert any(calls) == cast  # with the casts on, peft did cast the bf16 input to fp32
        return [loss.detach()] + [p.grad for p in model.parameters() if p.requires_grad]

    skipped, cast = step(False), step(True)
    assert len(skipped) > 1 and all(torch.equal(a, b) for a, b in zip(skipped, cast, strict=True))
