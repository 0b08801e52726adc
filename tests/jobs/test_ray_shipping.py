"""What a Ray job ships, without a cluster: the inputs a config names, their node copies, the limit, the paths back.

The shipping itself (object store, storage URI) runs in tests/jobs/test_ray.py on a real cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunestudio.worker.ray.ship import (
    Input,
    PathMap,
    TooLarge,
    check_size,
    local_inputs,
    localise,
    node_output,
    node_path,
    resolve_latest,
    shippable,
)


def _studio(tmp_path: Path) -> dict:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "train.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "rewards.py").write_text("def r(**kw): return [0.0]\n")
    (tmp_path / "out" / "checkpoint-4").mkdir(parents=True)
    return {
        "model_name": str(tmp_path / "model"),
        "local_datasets": [str(tmp_path / "train.jsonl")],
        "hf_dataset": "org/hub-dataset",  # a hub id: the cluster fetches it itself
        "eval_split": "test",  # a split, not a file
        "reward_functions": ["exact_match", f"{tmp_path / 'rewards.py'}:r"],
        "resume_from_checkpoint": str(tmp_path / "out" / "checkpoint-4"),
        "output_dir": str(tmp_path / "out"),
    }


def test_the_local_paths_of_a_config_are_shipped_and_the_rank_runs_on_its_node_copies(tmp_path: Path) -> None:
    config = _studio(tmp_path)
    inputs = local_inputs(config)
    assert [(i.field, i.folder) for i in inputs] == [("model_name", True), ("local_datasets", False),
                                                     ("reward_functions", False), ("resume_from_checkpoint", True)]
    stage = "/node/tmp/tunestudio-ray/run"
    local = localise(config, inputs, stage)
    assert local["model_name"] == node_path(stage, 0, config["model_name"]) == f"{stage}/inputs/0/model"
    assert local["local_datasets"] == [f"{stage}/inputs/1/train.jsonl"]
    assert local["reward_functions"] == ["exact_match", f"{stage}/inputs/2/rewards.py:r"]
    assert local["resume_from_checkpoint"] == f"{stage}/inputs/3/checkpoint-4"
    assert local["output_dir"] == node_output(stage) and local["hf_dataset"] == "org/hub-dataset"
    assert inputs[0].node_folder(stage, 0) == Path(f"{stage}/inputs/0/model")  # a folder is unpacked as itself
    assert inputs[1].node_folder(stage, 1) == Path(f"{stage}/inputs/1")  # a file into its folder


def test_latest_is_the_newest_complete_checkpoint_on_the_studios_side(tmp_path: Path) -> None:
    config = {"resume_from_checkpoint": "latest", "output_dir": str(tmp_path / "out")}
    assert resolve_latest(config) == config  # none yet: the worker says so
    checkpoint = tmp_path / "out" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    assert resolve_latest(config) == config  # incomplete: no weights, no optimizer


def test_inputs_past_the_limit_are_refused_naming_each(tmp_path: Path) -> None:
    inputs = local_inputs(_studio(tmp_path))
    assert check_size(inputs, 10_000) == 1002 + 14 + 26
    with pytest.raises(TooLarge) as refused:
        check_size(inputs, 1000)
    message = str(refused.value)
    assert message.startswith("the job's local inputs take 1.0 KB (model_name ")
    assert "at most half its size (1.0 KB)" in message and "--object-store-memory" in message


def test_the_node_paths_in_events_and_files_become_the_studios(tmp_path: Path) -> None:
    studio = tmp_path / "stüdio \"x\""  # JSON escapes quotes: the replacement is made in JSON text
    inputs = [Input("model_name", str(studio / "model"), True), Input("local_datasets", "/d/train.jsonl")]
    paths = PathMap("/n/stage", inputs, str(studio / "out"))
    event = json.dumps({"kind": "completed", "output_dir": "/n/stage/output",
                        "checkpoint": "/n/stage/output/checkpoint-2", "message": "loading /n/stage/inputs/0/model"})
    back = json.loads(paths.text(event))
    assert back["output_dir"] == str(studio / "out") and back["checkpoint"] == str(studio / "out" / "checkpoint-2")
    assert back["message"] == f"loading {studio / 'model'}"
    folder = tmp_path / "returned"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/n/stage/inputs/0/model"}))
    (folder / "weights.bin").write_bytes(b"/n/stage/inputs/0/model")
    paths.files(folder, ["adapter_config.json", "weights.bin"])
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == str(studio / "model")
    assert (folder / "weights.bin").read_bytes() == b"/n/stage/inputs/0/model"  # only JSON and Markdown


def test_rank_0_sends_back_complete_checkpoints_and_its_files_not_the_marker(tmp_path: Path) -> None:
    out = tmp_path / "output"
    (out / "checkpoint-2").mkdir(parents=True)  # incomplete: not sent
    (out / ".checkpoint-staging" / "checkpoint-4").mkdir(parents=True)
    (out / "runs").mkdir()
    (out / "runs" / "events.out").write_text("x")
    (out / "adapter_model.safetensors").write_text("x")
    (out / ".tunestudio-owner.json").write_text("{}")
    assert shippable(out) == ([], ["adapter_model.safetensors", "runs/events.out"])


def test_a_node_stage_whose_ranks_were_killed_is_swept_by_the_next_rank_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from tunestudio.worker.ray.rank import STAGE_ROOT, NodeStage

    def rank_of(run: str) -> subprocess.Popen:
        """A rank of `run` on this 'node' that entered its stage and lives until killed."""
        code = ("import sys, time\nfrom tunestudio.worker.ray.rank import NodeStage\n"
                f"stage = NodeStage({run!r})\nstage.enter(0, [])\nprint('in', flush=True)\ntime.sleep(600)\n")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "TMPDIR": str(tmp_path)})
        assert proc.stdout is not None and proc.stdout.readline() == "in\n"
        proc.stdout.close()
        return proc

    root = tmp_path / STAGE_ROOT
    killed, alive = rank_of("killed"), rank_of("alive")
    try:
        killed.send_signal(signal.SIGKILL)  # as Ray ends the workers of a driver killed after a cancel
        killed.wait()
        assert (root / "killed").is_dir()  # its leave never ran
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        stage = NodeStage("next")
        stage.enter(0, [])
        assert sorted(p.name for p in root.iterdir()) == ["alive", "alive.live", "alive.lock", "next", "next.live",
                                                           "next.lock"]
        stage.leave(0)  # the last rank of its run here: nothing of it stays; a live stage is never taken
        assert sorted(p.name for p in root.iterdir()) == ["alive", "alive.live", "alive.lock"]
    finally:
        alive.kill()
        alive.wait()
