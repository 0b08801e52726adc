"""A quick probe of what the tiny model learns from the bundled tool rows, outside the studio: a plain torch loop.

bench/tools_demo.py measures the demo through a real job; on these shared cores that job runs at 0.5–4 s a step,
so trying steps, learning rates and shapes of the data there takes an hour a try. This loop trains the same
model on the same rows (full fine-tune, AdamW, warm-up then cosine, the loss on the assistant turns as the
template's {% generation %} markers say) and scores the held-out rows as the studio does (tool_scores), in
minutes. --without-tools renders the rows without their tools (no <tools> block in the system turn) to measure
what the ~300 tokens of tool schemas cost the tiny model.

    .venv/bin/python bench/tools_probe.py [--steps 600] [--lr 3e-3] [--batch 8] [--constant] [--without-tools]
        [--data DIR] [--show 8]

The model: models/tiny-llama when its template writes tool calls, else bench/tools_demo.py builds one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools_demo import DATA, tool_model  # noqa: E402

from tunestudio.worker.train.tool_scores import calls_of, mean_scores, reader_for, score_calls  # noqa: E402


def encode(tokenizer, rows: list[dict], with_tools: bool) -> list[tuple[list[int], list[int]]]:  # type: ignore[no-untyped-def]
    out = []
    for row in rows:
        done = tokenizer.apply_chat_template(row["messages"], tools=row["tools"] if with_tools else None,
                                             return_dict=True, return_assistant_tokens_mask=True)
        ids = list(done["input_ids"])
        out.append((ids, [t if m else -100 for t, m in zip(ids, done["assistant_masks"], strict=True)]))
    return out


def train(model, tokenizer, rows, steps: int, lr: float, batch: int, constant: bool) -> None:  # type: ignore[no-untyped-def]
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    decay = (lambda s: 1.0) if constant else (lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10) * decay(s))
    rng, started = random.Random(0), time.monotonic()
    model.train()
    for step in range(steps):
        chosen = rng.sample(rows, batch)
        width = max(len(ids) for ids, _ in chosen)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in chosen])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in chosen])
        mask = (ids != tokenizer.pad_token_id).long()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d} loss {loss.item():.3f} {time.monotonic() - started:6.1f} s", flush=True)
    model.eval()


def evaluate(model, tokenizer, rows: list[dict], with_tools: bool, show: int) -> dict:  # type: ignore[no-untyped-def]
    import torch

    read, scores, loops = reader_for(tokenizer.chat_template), [], []
    for row in rows:
        messages = row["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        text = tokenizer.apply_chat_template(messages[:last], tools=row["tools"] if with_tools else None,
                                             tokenize=False, add_generation_prompt=True)
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=120, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        answer = tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        figures = score_calls(read(answer), calls_of(messages[last]))
        scores.append(figures)
        if last > 1:  # the whole loop: the answer after the tool's result
            loops.append(answer == messages[last]["content"])
        if show and figures.get("tool_args") == 0.0:
            show -= 1
            print(f"  {messages[0]['content']!r} -> {answer!r}")
    return {**mean_scores(scores), "loop_answers": sum(loops) / len(loops) if loops else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--without-tools", action="store_true")
    parser.add_argument("--constant", action="store_true", help="a constant learning rate after the warm-up")
    parser.add_argument("--data", type=Path, default=DATA, help="folder of tools.jsonl and tools_eval.jsonl")
    parser.add_argument("--show", type=int, default=8, help="wrong calls printed")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunestudio.process import torch_threads

    torch.set_num_threads(torch_threads())  # TUNESTUDIO_TORCH_THREADS caps it, as in a job
    torch.manual_seed(0)
    folder = tool_model(Path(tempfile.mkdtemp(prefix="bench-tools-probe-")))
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    read = lambda name: [json.loads(line) for line in (args.data / name).read_text().splitlines()]  # noqa: E731
    with_tools = not args.without_tools
    held = read("tools_eval.jsonl")
    before = evaluate(model, tokenizer, held, with_tools, 0)
    started = time.monotonic()
    train(model, tokenizer, encode(tokenizer, read("tools.jsonl"), with_tools), args.steps, args.lr, args.batch,
          args.constant)
    seconds = time.monotonic() - started
    after = evaluate(model, tokenizer, held, with_tools, args.show)
    print(json.dumps({"bench": "tools_probe", "steps": args.steps, "lr": args.lr, "batch": args.batch,
                      "tools_in_prompt": with_tools, "constant_lr": args.constant,
                      "data": str(args.data), "train_seconds": round(seconds, 1), "before": before,
                      "after": after}))


if __name__ == "__main__":
    main()
