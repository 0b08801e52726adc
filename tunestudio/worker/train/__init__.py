"""Training: the model loaded and prepared (model), the trainer built for the job's method (train, methods) with
its callbacks (progress and stop in train, early stopping in best, MLflow in tracking), the measures that decide
precision, gradient checkpointing, batching and threads (calibrate, memory, batching, performance), CPU's fused
LM head (lmhead), atomic checkpoints (checkpointing) and the held-out evaluation (evaluation; a reward model's in
reward_eval; a trained reward model scoring answers for /v1/rewards and GRPO in reward_model).

main.py runs these as its steps, modalities/ loads and scores through them, export/ loads a base model with them.
The face is lazy (`tunestudio.worker.lazy_face`): a name's module loads when the name is first used.
"""

from __future__ import annotations

from tunestudio.worker import lazy_face

# What the other rooms may use, by the module of this room that defines it.
_FACE = {
    "batching": ("ChoosingCollator", "describe"),
    "best": ("stopper_of",),
    "calibrate": ("cached", "for_job"),
    "evaluation": ("BATCH", "Evaluator", "LOSS_BATCH", "MAX_NEW_TOKENS", "SCORED_ROWS"),
    "image_eval": ("ImageEvaluator", "answer_with_images"),
    "integrations": ("setup",),
    "lmhead": ("install",),
    "model": ("count_4bit_layers", "count_parameters", "from_pretrained", "hidden_size", "load_model",
              "load_tokenizer", "prepare_model"),
    "performance": ("configure_allocator", "configure_threads", "peak_memory_mb"),
    "reward_eval": ("RewardEvaluator",),
    "reward_model": ("RewardModel", "reward_function"),
    "speech_eval": ("SpeechEvaluator", "error_rates", "normalise", "transcribe", "wav_url"),
    "tracking": ("callback", "end_open_runs", "finish", "job_run"),
    "vision_layers": ("describe_targets", "targets"),
    "train": ("build_trainer", "generate", "precision_named", "resolve_checkpoint", "resolve_gradient_checkpointing",
              "resolve_precision"),
}
__all__ = [name for names in _FACE.values() for name in names]
__getattr__ = lazy_face(__name__, _FACE)
