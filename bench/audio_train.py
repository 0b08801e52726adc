"""Speech-to-text training throughput and memory: the tunestudio worker against a plain transformers script (issue 45),
and the served model's real-time factor.

The same Whisper-shaped model is LoRA-tuned on the same clips (examples/data/speech/train, 240 clips of 0.5-1.3 s),
two ways, each in a fresh process of its own, alternating (a, b, a, b):

  (a) plain: the script a user writes from Hugging Face's Whisper fine-tuning recipe (this file with --plain-child):
      the clips decoded with soundfile, `dataset.map` making each one's log-mel features and labels up front, the
      recipe's padding collator, `Seq2SeqTrainer` with LoRA (peft, the studio's default r and alpha, every linear
      layer but the output), fp32, use_cpu;
  (b) worker: a tunestudio job (is_dataset_audio, LoRA, the same batch, steps, rank and alpha; the rest its
      defaults), run through a JobManager as `tunestudio train` runs it.

Both count alike, between the first and the last training log (the first step's warm-up left out): audio seconds
trained on a second (the batch's clip seconds, summed, over the wall seconds), and the training process's peak
memory (ru_maxrss; the worker's own report of it). Both get one torch thread (TUNESTUDIO_TORCH_THREADS=1). Then
the tiny model's job transcribes 20 held-out clips through the inference worker (`tunestudio transcribe`'s path):
its real-time factor is the seconds it took over the seconds of audio (not measured on the random real-shaped
model, which never ends a transcript before its 448 tokens).

Two models: models/tiny-whisper (2 s window) and a real-shaped one built here with whisper-base's published shape
(d_model 512, 6 + 6 layers, 8 heads, FFN 2048, 51,865-token vocabulary, 80 mel bins, 30 s window: 1,500 encoder
positions), random weights.

    /work/runtest .venv/bin/python bench/audio_train.py [--rounds 2] [--models tiny,real]

Target (issue 45): (b) >= 1.0 x (a). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEECH = ROOT / "examples" / "data" / "speech"
TINY = ROOT / "models" / "tiny-whisper"
SHAPES = {"tiny": {"steps": 80, "batch": 8, "logging": 10}, "real": {"steps": 6, "batch": 2, "logging": 1}}
LORA_R, LORA_ALPHA, LEARNING_RATE, SEED = 16, 16, 2e-4, 3407  # JobConfig's defaults


def mean_clip_s() -> float:
    import soundfile

    rows = list(csv.DictReader((SPEECH / "train" / "metadata.csv").open()))
    return statistics.fmean(soundfile.info(SPEECH / "train" / r["file_name"]).duration for r in rows)


def audio_per_s(logs: list[tuple[int, float]], batch: int) -> float:
    """Audio seconds trained on a second between the first and the last log (steps x batch x the mean clip)."""
    (first_step, first_s), (last_step, last_s) = logs[0], logs[-1]
    return (last_step - first_step) * batch * mean_clip_s() / (last_s - first_s)


def build_real(directory: Path) -> None:
    from tunestudio.worker.tiny_audio import build_tiny_whisper

    build_tiny_whisper(directory, seed=0, window_s=30, width=512, layers=6, heads=8, vocab_size=51865,
                       max_target_positions=448)


# --- (a) the plain script -------------------------------------------------------------------
def plain_child(model_dir: Path, steps: int, batch: int, logging: int, out: Path) -> None:
    import soundfile
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForSpeechSeq2Seq,
        AutoProcessor,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        TrainerCallback,
    )

    torch.set_num_threads(1)
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.set_prefix_tokens(language="en", task="transcribe")
    rows = list(csv.DictReader((SPEECH / "train" / "metadata.csv").open()))

    def prepare(row: dict[str, Any]) -> dict[str, Any]:
        samples, rate = soundfile.read(SPEECH / "train" / row["file_name"], dtype="float32")
        return {"input_features": processor.feature_extractor(samples, sampling_rate=rate).input_features[0],
                "labels": processor.tokenizer(row["text"]).input_ids, "file_name": row["file_name"]}

    dataset = Dataset.from_list(rows).map(prepare, remove_columns=["text"])
    model = AutoModelForSpeechSeq2Seq.from_pretrained(model_dir)
    model = get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules="all-linear",
                                             lora_dropout=0.0))
    start_id = model.config.decoder_start_token_id

    def collate(features: list[dict[str, Any]]) -> dict[str, Any]:  # the recipe's DataCollatorSpeechSeq2SeqWithPadding
        batch_ = processor.feature_extractor.pad([{"input_features": f["input_features"]} for f in features],
                                                 return_tensors="pt")
        labels = processor.tokenizer.pad([{"input_ids": f["labels"]} for f in features], return_tensors="pt")
        ids = labels["input_ids"].masked_fill(labels["attention_mask"].ne(1), -100)
        if (ids[:, 0] == start_id).all():
            ids = ids[:, 1:]
        batch_["labels"] = ids
        return batch_

    logs: list[tuple[int, float]] = []
    started = time.time()

    class Clock(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs.append((state.global_step, time.time() - started))

    args = Seq2SeqTrainingArguments(output_dir=str(out.parent / "plain-out"), per_device_train_batch_size=batch,
                                    max_steps=steps, learning_rate=LEARNING_RATE, logging_steps=logging,
                                    save_strategy="no",
                                    report_to=[], use_cpu=True, seed=SEED, remove_unused_columns=False,
                                    disable_tqdm=True, dataloader_num_workers=0)
    Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                   callbacks=[Clock()]).train()
    out.write_text(json.dumps({"audio_per_s": audio_per_s(logs, batch),
                               "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def plain(model_dir: Path, steps: int, batch: int, logging: int, work: Path) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    out = work / "plain.json"
    env = {**os.environ, "TUNESTUDIO_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, __file__, "--plain-child", str(model_dir), str(steps), str(batch), str(logging),
                    str(out)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


# --- (b) the worker -------------------------------------------------------------------------
def worker(model_dir: Path, steps: int, batch: int, logging: int, work: Path) -> tuple[dict[str, float], Any]:
    """The job through a JobManager; its figures from its progress records; the manager and job, to transcribe."""
    from tunestudio.config import JobConfig
    from tunestudio.jobs.manager import JobManager
    from tunestudio.settings import Settings

    os.environ["TUNESTUDIO_TORCH_THREADS"] = "1"
    config = JobConfig(model_name=str(model_dir), is_dataset_audio=True, local_datasets=[str(SPEECH / "train")],
                       output_dir=str(work / "job"), training_type="lora", lora_r=LORA_R, lora_alpha=LORA_ALPHA,
                       lora_dropout=0.0, max_steps=steps, batch_size=batch, gradient_accumulation_steps=1,
                       logging_steps=logging, learning_rate=LEARNING_RATE, max_seq_length=448, random_seed=SEED)
    settings = Settings(home=work / "home", model_roots=[model_dir.parent, work], dataset_roots=[SPEECH])
    manager = JobManager(settings).start()
    job = manager.submit(config)
    while not (job := manager.get(job.id)).status.is_terminal:
        time.sleep(0.5)
    assert job.status.value == "completed", job.error
    records = [r for r in manager.metrics(job.id) if r.get("loss") is not None and r.get("elapsed_seconds")]
    logs = [(r["step"], r["elapsed_seconds"]) for r in records]
    peak = max((r.get("peak_memory_mb") or 0.0) for r in manager.metrics(job.id))
    return {"audio_per_s": audio_per_s(logs, batch), "peak_mb": peak}, (manager, job)


def real_time_factor(manager: Any, job: Any) -> float:
    """Seconds the served model takes over the seconds of audio, on the held-out clips (the inference worker)."""
    import queue

    import soundfile

    from tunestudio.inference import InferencePool, resolve
    from tunestudio.inference_protocol import Done, Error
    from tunestudio.jobs import inference_executor

    pool = InferencePool(manager.settings, inference_executor)
    spec = resolve(manager, job.id)
    clips = sorted((SPEECH / "test").glob("*.wav"))[:20]
    try:
        def one(path: Path) -> None:
            replies: queue.SimpleQueue = queue.SimpleQueue()
            pool.transcribe(spec, path.read_bytes(), deliver=replies.put)
            while not isinstance(reply := replies.get(timeout=600), (Done, Error)):
                pass
            assert isinstance(reply, Done), reply

        one(clips[0])  # the model's load is not transcription
        started = time.monotonic()
        for path in clips:
            one(path)
        spent = time.monotonic() - started
    finally:
        pool.close()
    return spent / sum(soundfile.info(p).duration for p in clips)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--plain-child":
        plain_child(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), Path(sys.argv[6]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default="tiny,real")
    options = parser.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="audio-bench-") as tmp:
        work = Path(tmp)
        for name in options.models.split(","):
            model_dir = TINY
            if name == "real":
                model_dir = work / "whisper-base-shaped"
                build_real(model_dir)
            shape = SHAPES[name]
            sides: dict[str, list[dict[str, float]]] = {"plain": [], "worker": []}
            rtf = None
            for n in range(options.rounds):
                sides["plain"].append(plain(model_dir, shape["steps"], shape["batch"], shape["logging"],
                                            work / f"{name}-p{n}"))
                figures, (manager, job) = worker(model_dir, shape["steps"], shape["batch"], shape["logging"],
                                                 work / f"{name}-w{n}")
                sides["worker"].append(figures)
                if n == 0 and name == "tiny":  # a random real-shaped model never ends a transcript: 448 tokens each
                    rtf = real_time_factor(manager, job)
                manager.close()
                print(f"{name} round {n + 1}: plain {sides['plain'][-1]}, worker {figures}", flush=True)
            median = {side: {k: statistics.median(r[k] for r in runs) for k in ("audio_per_s", "peak_mb")}
                      for side, runs in sides.items()}
            ratio = median["worker"]["audio_per_s"] / median["plain"]["audio_per_s"]
            print(f"{name}: audio s/s plain {median['plain']['audio_per_s']:.2f}, worker "
                  f"{median['worker']['audio_per_s']:.2f} ({ratio:.3f}x); peak MB plain "
                  f"{median['plain']['peak_mb']:.0f}, worker {median['worker']['peak_mb']:.0f}"
                  + (f"; real-time factor {rtf:.3f}" if rtf is not None else ""), flush=True)
            figures = {f"{side}_{k}": round(v, 2) for side, m in median.items() for k, v in m.items()}
            result[name] = {"ratio": round(ratio, 3), **figures,
                            "real_time_factor": round(rtf, 4) if rtf is not None else None}
    print(json.dumps({"bench": "audio_train", **result}))


if __name__ == "__main__":
    main()
