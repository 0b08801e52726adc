"""Scripted workers for orchestration edge cases. Same signature as `tunestudio.worker.child.main`.

They talk the real protocol (JSON events on the queue, Stop commands back)
but import nothing heavy, so they start in milliseconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
import sys
import time
from typing import Any

from tunestudio.worker import child
from tunestudio.worker.child import WorkerArgs

from .checkpoints import write_checkpoint


def _setup(args: WorkerArgs) -> None:
    child.become_worker(dataclasses.replace(args, log_path=None))  # their output stays on the terminal


class _Emitter:
    def __init__(self, events: Any) -> None:
        self.events = events
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> None:
        self.seq += 1
        self.events.put(json.dumps({"kind": kind, "seq": self.seq, "ts": time.time(), **fields}))

    def close(self) -> None:
        self.events.close()
        self.events.join_thread()


def ignores_stop(args: WorkerArgs) -> None:
    """Trains forever, deaf to stop commands and to SIGTERM: only SIGKILL ends it."""
    _setup(args)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    emit = _Emitter(args.events)
    emit("phase", phase="loading_model")
    emit("phase", phase="loading_dataset")
    emit("phase", phase="training")
    step = 0
    while True:
        step += 1
        emit("progress", step=step, total_steps=10**6, loss=1.0)
        time.sleep(0.05)


def malformed(args: WorkerArgs) -> None:
    """Garbage of every kind between valid events; ends with a proper Completed."""
    _setup(args)
    emit = _Emitter(args.events)
    emit("phase", phase="loading_model")
    args.events.put({"not": "a string"})
    args.events.put(42)
    args.events.put("this is not json")
    args.events.put(json.dumps({"kind": "progress", "seq": 1000, "step": "three", "total_steps": 10}))
    args.events.put(json.dumps({"kind": "unknown-kind", "seq": 1001}))
    emit("log", message="x" * 5_000_000)  # a huge but valid message
    args.events.put(json.dumps({"kind": "log", "seq": 1, "ts": 0, "message": "replayed seq"}))  # out of order
    emit("phase", phase="loading_dataset")
    emit("phase", phase="training")
    for step in range(1, 6):
        emit("progress", step=step, total_steps=5, loss=2.0 / step)
    emit("phase", phase="saving")
    emit("completed", output_dir=args.public_config["output_dir"], stopped=False, saved=True, global_step=5)
    emit.close()
    sys.exit(0)


def instant(args: WorkerArgs) -> None:
    """Completes at once."""
    _setup(args)
    emit = _Emitter(args.events)
    emit("phase", phase="training")
    emit("progress", step=1, total_steps=1, loss=1.0)
    emit("completed", output_dir=None, stopped=False, saved=True, global_step=1)
    emit.close()
    sys.exit(0)


def flood(args: WorkerArgs, live_steps: int = 0) -> None:
    """As many progress events as max_steps says, as fast as the real worker channel sends them.

    The last `live_steps` of them come one per millisecond instead, as from a (very fast) live job.
    """
    from tunestudio.events import Completed, Phase, Progress
    from tunestudio.worker.channel import QueueChannel

    _setup(args)
    channel = QueueChannel(args.events, args.commands)
    channel.emit(Phase, phase="training")
    total = int(args.public_config["max_steps"])
    for step in range(1, total + 1):
        channel.emit(Progress, step=step, total_steps=total, loss=1.0 / step, learning_rate=1e-3, grad_norm=0.5,
                     num_tokens=step * 100, tokens_per_second=1000.0, elapsed_seconds=step * 0.01)
        if step > total - live_steps:
            time.sleep(0.001)
    channel.emit(Completed, output_dir=None, stopped=False, saved=True, global_step=total)
    channel.close()
    sys.exit(0)


def flood_then_live(args: WorkerArgs) -> None:
    """`flood`, its last 3,000 steps one per millisecond: a long history that is still growing."""
    flood(args, live_steps=3000)


def checkpoints_then_fails(args: WorkerArgs) -> None:
    """Writes a checkpoint, says which secrets it was given (names only), then exits with code 1."""
    from pathlib import Path

    _setup(args)
    emit = _Emitter(args.events)
    emit("phase", phase="training")
    write_checkpoint(Path(args.public_config["output_dir"]), 1)
    emit("log", level="info", message="secrets given: " + ",".join(sorted(args.secrets)))
    emit("progress", step=1, total_steps=2, loss=1.0)
    emit.close()
    sys.exit(1)


def waits_for_go(args: WorkerArgs) -> None:
    """Trains until a file named `go` appears in its output_dir, then completes: the test decides when it ends."""
    from pathlib import Path

    _setup(args)
    emit = _Emitter(args.events)
    emit("phase", phase="training")
    go = Path(args.public_config["output_dir"]) / "go"
    go.parent.mkdir(parents=True, exist_ok=True)
    step = 0
    while not go.exists():
        step += 1
        emit("progress", step=step, total_steps=10**6, loss=1.0)
        time.sleep(0.02)
    emit("completed", output_dir=None, stopped=False, saved=True, global_step=step)
    emit.close()
    sys.exit(0)


def killed_while_saving_second_checkpoint(args: WorkerArgs) -> None:
    """The real worker, killed by SIGKILL in the middle of its second checkpoint: weights written, optimizer not."""
    from transformers import Trainer

    original = Trainer._save_optimizer_and_scheduler
    saves = {"count": 0}

    def dies_on_the_second(self: Any, output_dir: str) -> None:
        saves["count"] += 1
        if saves["count"] == 2:
            signal.raise_signal(signal.SIGKILL)
        original(self, output_dir)

    Trainer._save_optimizer_and_scheduler = dies_on_the_second
    child.main(args)


# What `stops_early` reports: exact match at each evaluation, the best, and why it stopped.
EARLY_SCORES = {5: 0.5, 10: 0.75, 15: 0.75, 20: 0.625}
EARLY_REASON = ("stopped early at step 20: exact_match did not improve for 2 evaluations; "
                "best at step 10: exact_match 0.7500")


def stops_early(args: WorkerArgs) -> None:
    """A job watched by early stopping (exact_match, patience 2): evaluations every 5 steps, best at step 10, stopped
    at step 20 of 40, the artefacts the best checkpoint's."""
    _setup(args)
    emit = _Emitter(args.events)
    output = args.public_config["output_dir"]
    emit("phase", phase="training")
    for step in range(1, 21):
        emit("progress", step=step, total_steps=40, loss=1.0 / step)
        if step in EARLY_SCORES:
            emit("progress", step=step, total_steps=40, eval_loss=2.0 - step / 20,
                 extra={"eval_exact_match": EARLY_SCORES[step]})
    emit("completed", output_dir=output, stopped=False, saved=True, global_step=20, reason=EARLY_REASON,
         best={"step": 10, "metric": "exact_match", "value": 0.75, "checkpoint": f"{output}/checkpoint-10"})
    emit.close()


def writes_output(args: WorkerArgs) -> None:
    """Writes `weights.bin` (and, for a training job, `checkpoint-1/`) into its output folder and completes;
    an export to the hub fails having written nothing."""
    from pathlib import Path

    _setup(args)
    emit = _Emitter(args.events)
    output = Path(args.public_config["output_dir"])
    emit("phase", phase="training" if args.kind == "train" else "saving")
    if args.kind == "export" and args.public_config.get("target") == "hub":
        emit("failed", message="the hub is unreachable")
        emit.close()
        sys.exit(1)
    (output / "weights.bin").write_bytes(b"w")
    if args.kind == "train":
        write_checkpoint(output, 1)
    emit("completed", output_dir=str(output), stopped=False, saved=True, global_step=1)
    emit.close()


def fine_tunes(args: WorkerArgs) -> None:
    """An OpenAI fine-tuning job (api/fine_tuning.py), paced at 20 ms a step: `save_steps` steps an epoch for
    `num_epochs` epochs, a checkpoint at each epoch's end, an adapter in output_dir at the end. It obeys stop
    commands (with save: a checkpoint at the step reached) and resumes from `resume_from_checkpoint`'s step."""
    import re
    from pathlib import Path

    from tunestudio.events import Completed, Phase, Progress
    from tunestudio.worker.channel import QueueChannel

    _setup(args)
    config = args.public_config
    output = Path(config["output_dir"])
    output.mkdir(parents=True, exist_ok=True)
    per_epoch = int(config["save_steps"])
    total = per_epoch * int(config["num_epochs"])
    resumed = re.search(r"checkpoint-(\d+)$", config.get("resume_from_checkpoint") or "")
    channel = QueueChannel(args.events, args.commands)
    for phase in ("loading_model", "loading_dataset", "training"):
        channel.emit(Phase, phase=phase)
    for step in range(int(resumed.group(1)) + 1 if resumed else 1, total + 1):
        stop = channel.stop_request
        if stop is not None:
            folder = write_checkpoint(output, step - 1) if stop.save else None
            channel.emit(Completed, output_dir=str(output), stopped=True, saved=stop.save,
                         checkpoint=str(folder) if folder else None, global_step=step - 1)
            channel.close()
            sys.exit(0)
        time.sleep(0.02)
        channel.emit(Progress, step=step, total_steps=total, epoch=step / per_epoch, loss=2.0 / step,
                     learning_rate=float(config["learning_rate"]), num_tokens=step * 100)
        if step % per_epoch == 0:
            channel.emit(Progress, step=step, total_steps=total, eval_loss=3.0 / step)
            write_checkpoint(output, step)
    channel.emit(Phase, phase="saving")
    (output / "adapter_config.json").write_text("{}")
    channel.emit(Completed, output_dir=str(output), stopped=False, saved=True, global_step=total)
    channel.close()
    sys.exit(0)


SECRETS_SEEN = "secrets_seen.json"


def seen_secrets(output_dir: str) -> dict[str, str]:
    """What `sweep_trial` was handed as secrets, each as its SHA-256 (compare with `secret_hash`)."""
    from pathlib import Path

    return json.loads((Path(output_dir) / SECRETS_SEEN).read_text())


def secret_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def sweep_objective(learning_rate: float, lora_r: int) -> float:
    """The eval loss `sweep_trial` converges to: best at learning_rate 5e-4 and a large lora_r."""
    import math

    return (math.log10(learning_rate) + 3.3) ** 2 + 4.0 / lora_r


def sweep_trial(args: WorkerArgs) -> None:
    """A sweep's trial with a known objective: every `eval_steps` steps (paced at 40 ms a step) an eval record
    with eval_loss = sweep_objective(learning_rate, lora_r) + 1/step; the last one is the final metric. It
    obeys stop commands (with save: a checkpoint at the step reached). It writes `secrets_seen.json` in its
    output: the SHA-256 of each secret its channel handed it (`seen_secrets` reads it; never the secret)."""
    _sweep_trial(args, finishing_seconds=0.0)


def sweep_trial_slow_to_finish(args: WorkerArgs) -> None:
    """`sweep_trial` that takes half a second after its last step before it completes, deaf to a stop then, as a
    real worker is while it saves and evaluates the result (a stop only ends training)."""
    _sweep_trial(args, finishing_seconds=0.5)


def _sweep_trial(args: WorkerArgs, finishing_seconds: float) -> None:
    from pathlib import Path

    from tunestudio.events import Completed, Phase, Progress
    from tunestudio.worker.channel import QueueChannel

    _setup(args)
    config = args.public_config
    output = Path(config["output_dir"])
    output.mkdir(parents=True, exist_ok=True)
    (output / SECRETS_SEEN).write_text(json.dumps({name: secret_hash(value) for name, value in args.secrets.items()}))
    total, every = int(config["max_steps"]), int(config["eval_steps"] or 1)
    target = sweep_objective(float(config["learning_rate"]), int(config["lora_r"]))
    channel = QueueChannel(args.events, args.commands)
    channel.emit(Phase, phase="training")
    eval_loss = None
    for step in range(1, total + 1):
        stop = channel.stop_request
        if stop is not None:
            folder = write_checkpoint(output, step - 1) if stop.save else None
            channel.emit(Completed, output_dir=str(output), stopped=True, saved=stop.save,
                         checkpoint=str(folder) if folder else None, global_step=step - 1)
            channel.close()
            sys.exit(0)
        time.sleep(0.04)
        channel.emit(Progress, step=step, total_steps=total, loss=target + 2.0 / step)
        if step % every == 0:
            eval_loss = target + 1.0 / step
            channel.emit(Progress, step=step, total_steps=total, eval_loss=eval_loss)
    time.sleep(finishing_seconds)
    (output / "adapter_config.json").write_text("{}")
    metrics = {"eval_loss": eval_loss} if eval_loss is not None else {}
    channel.emit(Completed, output_dir=str(output), stopped=False, saved=True, global_step=total, metrics=metrics)
    channel.close()
    sys.exit(0)


def reports_its_config(args: WorkerArgs) -> None:
    """Says what it was handed: the typed job's type, its model and whether its secret arrived whole."""
    _setup(args)
    emit = _Emitter(args.events)
    token = args.config.hf_token.get_secret_value() if args.config is not None and args.config.hf_token else None
    emit("log", level="info", message=f"{type(args.config).__name__} {getattr(args.config, 'model_name', None)} "
                                      f"token={hashlib.sha256((token or '').encode()).hexdigest()[:12]}")
    emit("completed", output_dir=None, stopped=False, saved=False, global_step=0)
    emit.close()


# What `evaluates_images` answered: an image job's held-out rows as worker/train/image_eval.py writes them (no
# per-row loss; exact match, token F1, ROUGE-L), each with its pictures; one also names a picture that is not inline.
IMAGE_ROWS = [("red", "square", "square", "circle"), ("blue", "circle", "triangle", "circle"),
              ("green", "triangle", "triangle", "triangle")]
NOT_INLINE = "https://example.com/a.png"


def picture(colour: str) -> str:
    """A 96 px PNG of one colour as a data: URL, as the rows file keeps a thumbnail."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def evaluates_images(args: WorkerArgs) -> None:
    """A completed image job evaluated on IMAGE_ROWS: its rows file written in its output folder."""
    from pathlib import Path

    from tunestudio.events import EVAL_ROWS_FILE

    _setup(args)
    emit = _Emitter(args.events)
    output = Path(args.public_config["output_dir"])
    emit("phase", phase="training")
    emit("progress", step=1, total_steps=1, loss=1.0)
    rows = []
    for n, (colour, reference, before, after) in enumerate(IMAGE_ROWS):
        images = [picture(colour)] + ([picture("white"), NOT_INLINE] if n == 1 else [])
        rows.append({"index": n, "file": "shapes.jsonl", "line": n + 1,
                     "prompt": "[image] " * len(images) + "What shape is this?", "reference": reference,
                     "messages": None, "loss": None, "loss_before": None, "answer": after, "answer_before": before,
                     "images": images, "exact_match": float(after == reference),
                     "exact_match_before": float(before == reference)})
    rows_file = output / EVAL_ROWS_FILE
    rows_file.write_text(json.dumps({"loss": None, "metrics": ["exact_match"], "rows": rows}))
    exact = {"before": sum(r["exact_match_before"] for r in rows) / 3, "after": sum(r["exact_match"] for r in rows) / 3}
    emit("completed", output_dir=str(output), stopped=False, saved=True, global_step=1,
         evaluation={"rows": len(rows), "metrics": {"exact_match": exact}, "rows_file": str(rows_file),
                     "scored_rows": len(rows)})
    emit.close()
    sys.exit(0)
