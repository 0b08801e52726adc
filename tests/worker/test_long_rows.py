"""A 50 MB row: cut as text before tokenising, so the job stays small and quick (uncut it took over 11 GB)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tunestudio.worker.data.templates import clip_example, text_budget

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import torch, transformers, trl  # the worker's own imports count in the baseline
    from tests.helpers.channel import ListChannel
    from tunestudio.worker.main import run

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    channel = ListChannel()
    code = run(json.loads(sys.argv[1]), channel)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"code": code, "grew_mb": (peak - base) / 1024, "events": channel.lines}))
""")


@pytest.mark.timeout(600)
def test_a_50_mb_row_is_cut_before_tokenising_and_the_job_stays_small(tiny_model: Path, tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [{"instruction": f"Say {i}", "output": str(i)} for i in range(40)]
    rows.insert(3, {"instruction": "Repeat", "output": "abc " * (50_000_000 // 4)})
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"model_name": str(tiny_model), "local_datasets": [str(data)], "output_dir": str(tmp_path / "out"),
              "max_steps": 1, "batch_size": 2, "max_seq_length": 128, "logging_steps": 1}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["code"] == 0, got["events"][-1]
    # Reading the 50 MB line costs a few copies of it; tokenising it whole cost over 11 GB (measured).
    assert got["grew_mb"] < 1024, got["grew_mb"]
    notes = [json.loads(line).get("message", "") for line in got["events"]]
    assert any("1 row(s) far longer than max_seq_length 128 were cut" in n and "row 4" in n for n in notes), notes


def test_clipping_keeps_reading_order_and_every_turn(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    budget = text_budget(tokenizer, 128)
    longest = max(len(t) for t in tokenizer.get_vocab())
    assert budget == 128 * longest
    # Enough characters for 128 tokens survive the cut: training sees the same first 128 tokens.
    text = "the quick brown fox " * 10_000
    cut, was_cut = clip_example({"text": text}, budget)
    assert was_cut and len(cut["text"]) == budget
    assert tokenizer(cut["text"])["input_ids"][:128] == tokenizer(text[: budget * 2])["input_ids"][:128]

    small = {"prompt": "hi", "completion": "there"}
    assert clip_example(small, budget) == (small, False)
    pair, _ = clip_example({"prompt": "p" * 10, "completion": "c" * 10}, 15)
    assert pair == {"prompt": "p" * 10, "completion": "c" * 5}
    chat, _ = clip_example({"messages": [{"role": "user", "content": "u" * 20},
                                         {"role": "assistant", "content": "a" * 20}]}, 10)
    # A turn past the budget keeps its role (templates and masks need it); its prompt then fills max_seq_length,
    # and the usual check drops the row with a message.
    assert chat["messages"] == [{"role": "user", "content": "u" * 10}, {"role": "assistant", "content": ""}]
