"""Jobs on a real two-node Ray cluster that shares no disk with the studio, inside private namespaces.

Ray listens on every interface and probes a public resolver by default, so the cluster and every process that
talks to it run under `unshare -n -p -f --mount-proc` with only the loopback interface up; the PID namespace
ends every Ray process with the helper (tests/helpers/ray_cluster.py, which describes the simulation). Skipped,
with the reason, where ray is not installed (`pip install -e '.[ray]'`) or unshare is not allowed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunestudio.config import JobConfig
from tunestudio.jobs.executor import executor_for
from tunestudio.jobs.ray_cluster import RayExecutor
from tunestudio.settings import Settings

from ..helpers import fake_workers
from ..helpers.netns import namespace_problem

REPO = Path(__file__).resolve().parents[2]


def test_the_ray_settings_choose_the_ray_executor_and_reach_its_driver() -> None:
    config = JobConfig.model_validate({"model_name": "org/fake", "local_datasets": ["x.jsonl"], "num_processes": 2})
    settings = Settings(executor="ray", ray_address="127.0.0.1:6390", ray_storage="s3://bucket/runs",
                        ray_worker_resources={"GPU": 1, "A100": 1})
    chosen = executor_for(config, fake_workers.ignores_stop, kind=settings.executor, ray_address=settings.ray_address,
                          ray_worker_resources=settings.ray_worker_resources, ray_storage=settings.ray_storage)
    assert isinstance(chosen, RayExecutor) and chosen.address == "127.0.0.1:6390" and chosen.num_processes == 2
    env = chosen._environment()
    assert json.loads(env["TUNESTUDIO_RAY_WORKER_RESOURCES"]) == {"GPU": 1, "A100": 1}
    assert env["TUNESTUDIO_RAY_STORAGE"] == "s3://bucket/runs"
    # Unset in the settings: empty for the driver, whatever the manager's own environment says.
    assert RayExecutor(1, None)._environment()["TUNESTUDIO_RAY_WORKER_RESOURCES"] == ""


def test_worker_resources_are_a_json_object_of_non_negative_amounts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNESTUDIO_RAY_WORKER_RESOURCES", '{"CPU": 2, "A100": 1}')
    assert Settings().ray_worker_resources == {"CPU": 2, "A100": 1}
    monkeypatch.setenv("TUNESTUDIO_RAY_WORKER_RESOURCES", '{"GPU": -1}')
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Settings()


def test_a_failure_ray_train_reports_is_said_in_one_line_naming_each_rank_and_its_exception() -> None:
    from tunestudio.worker.ray.job import failure_cause

    text = """Training failed due to worker errors:
[Rank 1 Error Snippet]:
Traceback (most recent call last):
  File "/x/rewards.py", line 3, in score
    raise ValueError("no answer: row 7")
ValueError: no answer: row 7

[Rank 0 Error Snippet]:
torch.distributed.DistBackendError: gloo: connection closed by peer
"""
    assert failure_cause(text) == ("Training failed due to worker errors: rank 1 raised ValueError: no answer: row 7; "
                                   "rank 0 raised torch.distributed.DistBackendError: gloo: connection closed by peer")
    assert failure_cause("The actor died unexpectedly.\nmore") == "The actor died unexpectedly."


@pytest.mark.slow
@pytest.mark.schedule_first
@pytest.mark.timeout(1200)
def test_a_cluster_without_the_studios_disk_trains_cancels_fails_stops_resumes_and_refuses_too_much(
    tiny_model: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ray", reason="ray is an optional extra: pip install -e '.[ray]'")
    problem = namespace_problem()
    if problem:
        pytest.skip(problem)
    if any(Path(p).absolute().is_relative_to("/tmp") for p in (sys.executable, REPO)):
        pytest.skip("the node without the studio's disk mounts a tmpfs over /tmp, hiding this checkout and its venv: "
                    "run this test from a checkout outside /tmp")
    # bash stays the namespace's first process (no exec): a worker whose parent is pid 1 takes itself for orphaned.
    script = f"ip link set lo up && {sys.executable} -m tests.helpers.ray_cluster {tiny_model} {tmp_path}; exit $?"
    proc = subprocess.run(["unshare", "-n", "-p", "--kill-child", "--mount-proc", "bash", "-c", script],
                          capture_output=True, text=True, timeout=1150, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-3000:], proc.stderr[-3000:])
    seen = json.loads(lines[0][len("RESULT "):])
    model = str(tmp_path / "inputs" / "tiny-model")
    assert seen["hidden_sees_studio"] is False  # the simulation holds: the cluster's node cannot open our files

    # Cancelled at step 1 while its rank is busy (frozen) past the grace period: the driver takes SIGTERM as Ray
    # Train takes Ctrl-C, its run's controller aborts (the rank killed, the placement-group cleaner stopped: a
    # detached actor that, without a dashboard, would poll for good), and Ray ends its queues with it. The rank
    # never left its stage, so the node's copy of the inputs stays, until the next rank on that node sweeps it (no
    # live rank holds its lock): the stopped job's below.
    cancelled = seen["cancelled"]
    # It exits as ray.init's own handler of SIGTERM made it, through its clean-up, not killed by the SIGKILL after.
    assert cancelled["status"] == "cancelled" and cancelled["message"] == "cancelled (worker exited with code 15)", \
        cancelled
    assert cancelled["left"] == []
    run = [name for name in cancelled["stages_running"] if "." not in name]
    assert len(run) == 1 and run[0] in cancelled["stages_after"], cancelled
    assert seen["stages_after_stopped"] == []

    # A rank on the hidden node fails (a row of its dataset is not JSON): the job failed, naming the cause with the
    # studio's path of the file, and what Ray Train said.
    failing = seen["failing"]
    assert failing["status"] == "failed", failing
    assert f"dataset {tmp_path / 'inputs' / 'broken.jsonl'} row 2 is not valid JSON" in failing["error"], failing
    assert failing["error"].startswith("ray: Training failed due to worker errors: rank 0 raised RuntimeError: "), \
        failing

    # Stopped with save, both ranks on the node that cannot see the studio's files: its checkpoint and artefacts
    # are in the output folder the manager took, as the job's own files, naming the studio's paths.
    stopped = seen["stopped"]
    assert stopped["status"] == "stopped", stopped
    assert stopped["workers_hidden"] == [True, True]
    # A LoRA job of an unquantized model: its ranks left bitsandbytes unimported, decided from the node's copy of
    # the model (worker/optional.py), which the studio's path would not reach there.
    assert stopped["bitsandbytes_loaded"] == [False, False], stopped
    # The job's log holds each rank's lines once, and no bytecode: Ray Train's print patch is off for its ranks
    # (it copied every print to the root logger, even one a library had captured).
    assert stopped["model_lines"] == [1, 1] and stopped["disassembly"] == 0, stopped
    # Ray's lines in it, "(RayTrainWorker pid=...)" first, are plain text: no terminal colour codes around them.
    assert stopped["ray_lines"] > 0 and stopped["escapes"] == 0, stopped
    checkpoint = Path(stopped["checkpoint"])
    assert checkpoint.parent == Path(stopped["output_dir"]) and checkpoint.name in stopped["files"]
    assert {"adapter_model.safetensors", "adapter_config.json", "job_config.json", checkpoint.name} \
        <= set(stopped["owned"])
    assert ".tunestudio-owner.json" in stopped["files"] and ".checkpoint-staging" not in stopped["files"]
    assert stopped["model_in_job_config"] == model
    # This cluster runs no dashboard: the job's log says so once, and leaves out Ray Train's placement-group
    # cleaner's warning that it cannot see the run's controller (every second, half a short job's log before).
    assert stopped["blind_cleaner"] == 0, stopped
    blind, shipping, placed, summary = stopped["logs"]  # the job's log (the page shows it): where and how much
    assert blind.startswith("ray: the cluster runs no dashboard, so Ray Train's placement-group cleaner "), blind
    assert shipping.startswith(f"ray: shipping 3.8 MB to the cluster through its object store: model_name {model} ")
    assert placed.startswith("ray: rank 0 on node ") and summary.startswith(placed)
    assert re.search(rf"shipped 3\.8 MB to the cluster .*, [\d.]+ MB back into {stopped['output_dir']} "
                     rf"\({checkpoint.name}, the artefacts\)$", summary), summary

    # Its resume: the checkpoint shipped back to the cluster, one rank on each node, through a storage URI.
    resumed = seen["resumed"]
    assert resumed["status"] == "completed", resumed
    assert resumed["workers_hidden"] == [False, True]
    step = int(checkpoint.name.split("-")[1])
    assert resumed["steps"][0] == step + 1 and resumed["steps"][-1] == 60
    assert "adapter_model.safetensors" in resumed["files"] and resumed["adapter_base"] == model
    # Its periodic checkpoints went through the storage as training went on, the artefacts at the end.
    assert {"checkpoint-40", "checkpoint-60"} <= set(resumed["files"])
    assert {"artefacts", "checkpoint-40", "checkpoint-60"} <= {Path(name).name for name in resumed["bucket"]}
    assert any("Ray Train's storage file:///var/tmp/tunestudio-bucket-" in log for log in resumed["logs"])
    # The job records the URI its files were written to (GET /api/jobs/{id} says `storage`), not only its log.
    run_folder = [Path(name).parent.name for name in resumed["bucket"] if Path(name).name == "artefacts"]
    assert resumed["storage"].startswith("file:///var/tmp/tunestudio-bucket-") and \
        resumed["storage"].endswith(f"/{run_folder[0]}"), resumed["storage"]
    loaded = subprocess.run([sys.executable, "-c", f"""
from peft import PeftModel
from transformers import AutoModelForCausalLM
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(tiny_model)!r}), {resumed['output_dir']!r})
print("LOADED", sum(p.numel() for n, p in model.named_parameters() if "lora_" in n))
"""], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0 and int(loaded.stdout.split("LOADED")[1]) > 0, loaded.stderr[-2000:]

    # Too large to ship: refused before anything is shipped, saying the limit and what to do.
    assert seen["too_large"]["status"] == "failed"
    assert re.match(r"the job's local inputs take 57\.9 MB \(model_name .* \(3\.7 MB\), local_datasets "
                    r".*huge\.jsonl \(54\.2 MB\)\); .* ships at most half its size \(50\.0 MB\)\. Name the model",
                    seen["too_large"]["error"]), seen["too_large"]

    assert seen["left"] == []  # no driver, training worker, queue or run's cleaner of any job survives
    assert seen["bookkeeping_left"] == []  # each driver, the cancelled one too, removed Ray Train's bookkeeping
    assert seen["hidden_has_studio"] is False  # no rank wrote to a path of the studio's
    assert seen["hidden_stages_left"] == []  # each node's copies of the inputs are gone
