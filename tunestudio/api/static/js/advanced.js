// The form's Advanced section: every JobConfig field the main form does not show, in groups, each with a
// human label and one line of help. A field missing here still appears (under "Other", with its schema
// title), so a new JobConfig field is never hidden from the page.

export const GROUPS = [
  ["data", "Data"], ["lora", "LoRA"], ["optimisation", "Optimisation"], ["evaluation", "Evaluation"],
  ["logging", "Logging and outputs"], ["other", "Other"],
];

// name: [group, label, help]
export const ADVANCED = {
  subset: ["data", "Hub subset", "The configuration of a hub dataset that has several (e.g. 'main')."],
  train_split: ["data", "Training split", "Which split of the dataset to train on."],
  dataset_slice_start: ["data", "First row", "Keep rows from this one (0-based, inclusive)."],
  dataset_slice_end: ["data", "Last row", "Keep rows up to this one (inclusive)."],
  custom_format_mapping: ["data", "Column roles (JSON)",
    'Which column plays which role, e.g. {"question": "user", "answer": "assistant"}.'],
  packing: ["data", "Pack short rows", "Join short rows into full-length sequences: faster, same tokens."],
  padding_free: ["data", "Padding-free batches",
    "A batch as one row without padding; the loss is the same. auto: per batch, whichever costs less."],
  train_on_completions: ["data", "Train on answers only", "Compute the loss on the completion, not the prompt."],
  dedupe: ["data", "Remove duplicates", "Before the eval split: exact (same after normalising whitespace) or "
    + "near (also ≥ 0.8 similar word 3-grams); the first of each is kept. The dataset report counts them."],
  target_modules: ["lora", "Target modules", "Module names to adapt, one a line; empty: every linear layer."],
  use_rslora: ["lora", "Rank-stabilised LoRA", "Scale adapters by alpha/√r instead of alpha/r."],
  use_loftq: ["lora", "LoftQ initialisation", "Start the adapters from a quantisation-aware estimate."],
  finetune_attention_modules: ["lora", "Adapt attention layers", "Put adapters on the attention projections."],
  finetune_mlp_modules: ["lora", "Adapt MLP layers", "Put adapters on the feed-forward layers."],
  precision: ["optimisation", "Precision", "auto: bf16 where it pays, else fp32."],
  warmup_steps: ["optimisation", "Warm-up steps", "Steps of rising learning rate at the start."],
  warmup_ratio: ["optimisation", "Warm-up ratio", "Or: the fraction of all steps spent warming up."],
  weight_decay: ["optimisation", "Weight decay", "L2-style shrinkage of the weights each step."],
  optim: ["optimisation", "Optimizer", "The update rule; adamw_torch_fused (the default) is AdamW in one kernel."],
  lr_scheduler_type: ["optimisation", "Learning-rate schedule", "How the learning rate changes over the run."],
  gradient_checkpointing: ["optimisation", "Activation checkpointing",
    "Recompute activations to save memory; slower (3.5× on CPU). auto: on only if the job would not fit."],
  random_seed: ["optimisation", "Random seed", "The same seed and data give the same run."],
  eval_split: ["evaluation", "Evaluation split or file", "A split name (test) or a file (data/val.jsonl)."],
  eval_fraction: ["evaluation", "Held-out share",
    "Without an evaluation split: the share of rows held out (0.1 = 10%). Empty: 5%, 16 to 128 rows."],
  held_out_rows: ["evaluation", "Held-out rows of a job",
    "A job's held_out.json: hold out exactly its rows again (Clone to form sets it). Empty: a new seeded split."],
  early_stopping: ["evaluation", "Early stopping (JSON)",
    'Stop when the eval metric stalls, e.g. {"metric": "exact_match", "patience": 3, "min_delta": 0.01}; metric: '
    + "eval_loss, exact_match, token_f1, rouge_l or the method's (eval_rewards/margins). Needs Eval every > 0."],
  keep_best: ["evaluation", "Keep the best checkpoint",
    "With early stopping: the job's result is the best evaluation's weights, not the last step's."],
  early_stopping_rows: ["evaluation", "Early stopping rows",
    "Held-out rows answered at each evaluation for exact_match, token_f1 or rouge_l; empty: as the evaluation."],
  save_steps: ["logging", "Checkpoint every", "Steps between checkpoints; 0: only at a stop and the end."],
  sample_prompts: ["logging", "Sample prompts", "Prompts answered before and after training, one a line."],
  output_dir: ["logging", "Output folder", "Where the result goes; empty: the job's own folder."],
  resume_from_checkpoint: ["logging", "Resume from checkpoint", "A checkpoint folder, or 'latest' in the output folder."],
  enable_tensorboard: ["logging", "TensorBoard", "Write TensorBoard event files."],
  tensorboard_dir: ["logging", "TensorBoard folder", "Relative: inside the output folder."],
  enable_wandb: ["logging", "Weights & Biases", "Send metrics to W&B (needs its token)."],
  wandb_project: ["logging", "W&B project", "The W&B project the run goes to."],
  wandb_token: ["logging", "W&B token", "Used for this job only; never stored."],
  report_to: ["logging", "Report to", "Experiment trackers, one a line: mlflow, wandb, tensorboard."],
  mlflow_tracking_uri: ["logging", "MLflow store", "An http(s) tracking server; empty: the studio's own store."],
  mlflow_experiment: ["logging", "MLflow experiment", "The experiment the job's run goes into."],
  mlflow_run_name: ["logging", "MLflow run name", "Empty: MLflow names the run."],
  mlflow_parent_run_id: ["logging", "MLflow parent run", "The run this one nests under (a sweep sets it)."],
  hf_token: ["data", "Hub token", "For gated models and datasets; used for this job only, never stored."],
};

/** [group, label, help] of a field; fields not listed fall under "Other". */
export function describe(field) {
  return ADVANCED[field.name] || ["other", field.title, field.description || ""];
}
