"""method: reward (issue 44): a score head trained on preference pairs, evaluated on held-out pairs before and after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunestudio.config import JobConfig
from tunestudio.events import Progress
from tunestudio.worker.tiny_rewards import reward_pairs
from tunestudio.worker.train.reward_eval import summary

from ..helpers.jobs import Run, job_config, run_job


def _jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def test_the_bundled_pairs_pit_right_against_wrong_of_one_kind_and_no_held_out_triple_trains() -> None:
    train, held = reward_pairs(60, 20)

    def key(p: dict[str, Any]) -> tuple[str, str, str]:
        return p["prompt"][0]["content"], p["chosen"][0]["content"], p["rejected"][0]["content"]

    assert len(train) == 60 and len(held) == 20
    assert not {key(p) for p in held} & {key(p) for p in train}
    assert all(p["chosen"] != p["rejected"] for p in train + held)
    colours = [p for p in train if p["prompt"][0]["content"].startswith("What colour")]
    assert colours and all(p["rejected"][0]["content"] in {"yellow", "red", "purple", "orange", "green", "brown"}
                           for p in colours)


def test_accuracy_counts_pairs_whose_chosen_scores_strictly_higher() -> None:
    assert summary([(1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (2.0, 1.0)]) == {"accuracy": 0.5, "margin": 0.25}
    assert summary([]) == {"accuracy": None, "margin": None}


def test_a_reward_model_writes_no_sample_replies() -> None:
    with pytest.raises(ValueError, match="sample_prompts: method 'reward'"):
        JobConfig(model_name="m", method="reward", local_datasets=["x.jsonl"], sample_prompts=["hi"])


@pytest.fixture(scope="module")
def reward_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("reward")
    train, held = reward_pairs(32, 8)
    cfg = job_config(tiny_model, tmp / "out", method="reward", local_datasets=[str(_jsonl(tmp / "t.jsonl", train))],
                     eval_split=str(_jsonl(tmp / "e.jsonl", held)), max_steps=3, batch_size=4, max_seq_length=48,
                     learning_rate=1e-3, eval_steps=3)
    return run_job(cfg)


def test_a_reward_job_trains_logs_accuracy_evaluates_before_and_after_and_saves_its_head(reward_run: Run) -> None:
    done = reward_run.completed
    logged = [e.extra or {} for e in reward_run.of(Progress)]
    assert any({"accuracy", "margin"} <= set(x) for x in logged)  # TRL's figures, the method's main metric
    assert any("eval_accuracy" in x for x in logged)
    evaluation = done.evaluation
    assert evaluation is not None and evaluation.rows == 8
    for name in ("accuracy", "margin"):
        assert evaluation.metrics[name].before is not None and evaluation.metrics[name].after is not None
    assert evaluation.examples and evaluation.examples[0].before.startswith("chosen ")
    saved = json.loads((Path(done.output_dir) / "adapter_config.json").read_text())
    assert saved["task_type"] == "SEQ_CLS" and "score" in saved["modules_to_save"]
    from safetensors import safe_open

    with safe_open(str(Path(done.output_dir) / "adapter_model.safetensors"), "pt") as f:
        assert any("score" in k for k in f.keys())  # noqa: SIM118 (not a dict)  the head travels with it


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft's own read of transformers
def test_a_reward_jobs_merged_export_loads_as_a_sequence_classifier_and_scores_as_base_plus_adapter(
        reward_run: Run, tiny_model: Path, tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tunestudio.events import Completed, Failed, parse_event
    from tunestudio.export_config import ExportConfig
    from tunestudio.worker.export import job as export

    from ..helpers.channel import ListChannel

    def run_export(target: str) -> tuple[int, Completed | Failed]:
        channel = ListChannel()
        code = export.run(ExportConfig.model_validate({"source_dir": reward_run.completed.output_dir, "target": target,
                                                       "output_dir": str(tmp_path / target)}), channel)
        return code, [e for e in map(parse_event, channel.lines) if isinstance(e, (Completed, Failed))][-1]

    code, done = run_export("merged")
    assert code == 0 and isinstance(done, Completed), done
    merged = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged"))
    assert merged.config.num_labels == 1 and merged.config.pad_token_id is not None
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "merged"))
    # plain peft: the base with a one-output head, the job's adapter (and its trained head) on it
    plain = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=1),
                                      reward_run.completed.output_dir)
    tokenizer.padding_side = "right"
    batch = tokenizer(["What colour is the sky? blue", "What colour is grass? a much longer wrong answer"],
                      return_tensors="pt", padding=True)
    with torch.no_grad():
        ours, theirs = merged(**batch).logits, plain(**batch).logits
    assert ours.shape == (2, 1) and torch.allclose(ours, theirs, atol=1e-4), (ours, theirs)

    code, refused = run_export("gguf")  # a score head has no place in llama.cpp's chat GGUF: said before any work
    assert code == 1 and isinstance(refused, Failed) and "export it as merged" in refused.message
    assert not (tmp_path / "gguf").exists()


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_the_reward_model_scores_as_its_evaluation_did_and_refuses_what_is_not_one(reward_run: Run,
                                                                                  tiny_model: Path) -> None:
    from tunestudio.worker.errors import UserError
    from tunestudio.worker.train import RewardModel

    scorer = RewardModel(reward_run.completed.output_dir)
    example = reward_run.completed.evaluation.examples[0]  # "chosen <score> · rejected <score>" after training
    prompt = [{"role": "user", "content": example.prompt}]
    chosen = scorer.score(prompt, example.reference)  # the adapter merged: as the job's own head scored it
    assert abs(chosen - float(example.after.split()[1].rstrip(","))) < 2e-3, (chosen, example.after)
    with pytest.raises(UserError, match="not a sequence classifier"):
        RewardModel(tiny_model)


def test_a_reward_model_is_a_grpo_reward(reward_run: Run, tiny_model: Path, tmp_path: Path) -> None:
    rows = tmp_path / "prompts.jsonl"
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n"
                            for q in ("What colour is the sky?", "What sound does a cow make?") * 4))
    folder = reward_run.completed.output_dir
    cfg = job_config(tiny_model, tmp_path / "out", method="grpo", local_datasets=[str(rows)], max_steps=1,
                     batch_size=4, num_generations=2, max_completion_length=4, max_seq_length=48,
                     reward_functions=[f"model:{folder}", "length_penalty"])
    run = run_job(cfg)
    name = "model_" + Path(folder).name.replace("-", "_")
    means = [(e.extra or {}).get(f"rewards/{name}/mean") for e in run.of(Progress)]
    assert run.completed and [m for m in means if m is not None], means  # the head scored every step's replies
