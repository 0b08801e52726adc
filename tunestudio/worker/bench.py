"""One benchmark run inside the worker process (kind "bench"), top to bottom.

validate → write the user's eval file as a harness task (YAML + its rows) → find every task, its data and its
kind (offline: a standard task whose data is not in the local HF datasets cache fails here, before any model is
asked, naming the task and what to download) → plan the harness's runs: generation tasks (`generate_until`)
with the chat template go to its `local-chat-completions` model against the studio's /v1/chat/completions, the
rest (loglikelihoods: multiple choice, perplexity; or every task without the chat template) to its
`local-completions` model against /v1/completions → run them for the base model ("before"), then for the job
("after"), and merge each side's runs → compare per task and metric → report (`Completed.benchmarks`, and
`benchmarks.json` in the output folder), naming the harness model and address each task went through.

The harness is the pinned `lm_eval` package, not a re-implementation: `simple_evaluate` with the job's own
tokenizer (`tokenizer_backend=huggingface`, token-id requests) for completions, so a loglikelihood is one
`/v1/completions` call with `echo` and `logprobs`; chat completions send the task's turns as messages and the
server applies the job's template (the harness's chat model has no loglikelihoods, hence the two). A stop or
cancel ends the process at once (what was measured is thrown away: a benchmark has no checkpoint).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import traceback
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunestudio.bench_config import BenchConfig
from tunestudio.bench_tasks import TASK_INDEX_FILE, eval_task_name, index_key, unknown_task
from tunestudio.config import format_validation_error
from tunestudio.worker.channel import Channel, quiet_libraries
from tunestudio.worker.errors import UserError

__all__ = ["CHAT", "COMPLETIONS", "RESULTS_FILE", "HarnessRun", "compare", "custom_task", "merge", "plan", "run"]

RESULTS_FILE = "benchmarks.json"
STOP_POLL_S = 0.2
BATCH = 16  # requests per /v1/completions call (a choice each): one HTTP round trip for many loglikelihoods
COMPLETIONS = "local-completions"  # the harness's model for /v1/completions: loglikelihoods and generation
CHAT = "local-chat-completions"  # the harness's model for /v1/chat/completions: generation only
GENERATION = "generate_until"


@dataclass(frozen=True)
class HarnessRun:
    """One `simple_evaluate` per side: the harness's model type, the address it calls and the tasks it runs."""

    model: str
    url: str
    tasks: list[str]


def run(config: BenchConfig | dict[str, Any], channel: Channel, secrets: dict[str, str] | None = None,
        cache_dir: str | None = None) -> int:
    """Run one benchmark to its end; the process exit code (0 completed, 1 failed; a stop exits at once).

    cache_dir: where the harness's index of its bundled tasks is kept between runs (`task_manager`)."""
    cfg: BenchConfig | None = None
    try:
        cfg = config if isinstance(config, BenchConfig) else BenchConfig.from_parts(config, secrets)
    except ValidationError as exc:
        fields = "; ".join(f"{e['field']}: {e['message']}" for e in format_validation_error(exc))
        channel.failed(f"invalid benchmark config: {fields}")
        return 1
    _end_on_stop(channel)
    try:
        quiet_libraries()
        return _bench(cfg, channel, Path(cache_dir) if cache_dir else None)
    except UserError as exc:
        channel.failed(str(exc), traceback.format_exc())
    except Exception as exc:
        channel.failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    return 1


def _end_on_stop(channel: Channel) -> None:
    """A stop (or cancel) ends the run where it is: the harness has no step boundary to stop at."""

    def watch() -> None:
        while channel.stop_request is None:
            time.sleep(STOP_POLL_S)
        channel.completed(output_dir=None, stopped=True, saved=False)
        channel.close()
        os._exit(0)

    threading.Thread(target=watch, name="bench-stop", daemon=True).start()


def _offline() -> None:
    """No hub here: every library reads its data from the local caches only (set before and after import: the
    forkserver may have imported them already)."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    import datasets.config
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True


def _bench(cfg: BenchConfig, channel: Channel, cache_dir: Path | None = None) -> int:
    output = Path(cfg.output_dir or ".")
    output.mkdir(parents=True, exist_ok=True)
    channel.phase("loading_dataset", "finding the tasks and their data")
    _offline()
    os.environ["OPENAI_API_KEY"] = cfg.api_token.get_secret_value() if cfg.api_token is not None else "unused"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import lm_eval

    chat = cfg.chat_template if cfg.chat_template is not None else _has_chat_template(Path(cfg.tokenizer))
    names = list(cfg.tasks)
    include = None
    if cfg.eval_file:
        include = output / "tasks"
        names.append(custom_task(Path(cfg.eval_file), include, chat))
    tasks = task_manager(include, cache_dir)
    kinds = {name: _check_task(tasks, name) for name in names}
    runs = plan(kinds, chat, cfg.base_url, cfg.chat_url)
    channel.log(f"tasks: {', '.join(names)}; lm-eval {metadata.version('lm_eval')}; "
                f"{'chat template' if chat else 'plain prompts'}; limit {cfg.limit or 'none'}; "
                + "; ".join(f"{r.model} at {r.url}: {', '.join(r.tasks)}" for r in runs))

    sides: dict[str, dict[str, Any]] = {}
    for side, step in (("before", "evaluating_base"), ("after", "evaluating")):
        model = cfg.models[side]
        measured = []
        for done, harness in enumerate(runs):
            channel.phase(step, f"{model}: {', '.join(harness.tasks)} ({harness.model})", done=done, total=len(runs))
            started = time.monotonic()
            results = lm_eval.simple_evaluate(
                model=harness.model, model_args=_model_args(harness, model, cfg),
                batch_size=BATCH if harness.model == COMPLETIONS else 1, tasks=harness.tasks, limit=cfg.limit,
                task_manager=tasks, apply_chat_template=chat, log_samples=False,
                bootstrap_iters=1000, random_seed=0, numpy_random_seed=1234, torch_random_seed=1234,
                fewshot_random_seed=1234)
            if results is None:
                raise UserError(f"lm-evaluation-harness returned no results for {model} ({harness.model})")
            measured.append((harness, results))
            channel.log(f"{model} ({harness.model}): {_summary(results)} in {time.monotonic() - started:.0f} s")
        sides[side] = merge(measured)
        channel.phase(step, f"{model}: done", done=len(runs), total=len(runs))

    channel.phase("saving", "comparing and writing the figures")  # the status a job completes from
    report = compare(sides["before"], sides["after"])
    report.update(harness=f"lm-eval {metadata.version('lm_eval')}", models=dict(cfg.models), limit=cfg.limit,
                  chat_template=chat, runs=[{"model": r.model, "url": r.url, "tasks": r.tasks} for r in runs])
    (output / RESULTS_FILE).write_text(json.dumps(report, indent=2))
    channel.completed(output_dir=str(output), benchmarks=report)
    return 0


def plan(kinds: dict[str, set[str]], chat: bool, completions_url: str, chat_url: str | None) -> list[HarnessRun]:
    """The harness's runs for tasks of these output types (name → its leaf tasks' types): with the chat template
    and a chat address, the tasks that only generate go through chat completions; every other task (and all of
    them without the template: chat completions always apply it) through completions. Empty runs are left out."""
    to_chat = [n for n, types in kinds.items() if chat and chat_url and types == {GENERATION}]
    rest = [n for n in kinds if n not in to_chat]
    runs = [HarnessRun(COMPLETIONS, completions_url, rest), HarnessRun(CHAT, chat_url or "", to_chat)]
    return [r for r in runs if r.tasks]


def _model_args(harness: HarnessRun, model: str, cfg: BenchConfig) -> dict[str, Any]:
    common = {"base_url": harness.url, "model": model, "num_concurrent": 1, "max_retries": 1, "timeout": 600}
    if harness.model == CHAT:  # messages, not tokens: the server's template renders them
        return {**common, "tokenizer_backend": None, "tokenized_requests": False}
    return {**common, "tokenizer_backend": "huggingface", "tokenizer": cfg.tokenizer, "tokenized_requests": True,
            "max_length": _context(cfg)}


def merge(measured: list[tuple[HarnessRun, dict[str, Any]]]) -> dict[str, Any]:
    """One side's harness results of several runs as one (their tasks are disjoint), each task's figures marked
    with the run that measured them (`via`: the harness model)."""
    merged: dict[str, Any] = {"via": {}}
    for harness, results in measured:
        for key, value in results.items():
            if isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
        for task in results.get("results", {}):
            merged["via"][task] = harness.model
    return merged


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def _context(cfg: BenchConfig) -> int:
    """The model's context (the harness cuts prompts to it from the left), from config.json where it is."""
    for folder in (Path(cfg.tokenizer), Path(cfg.base_model or "")):
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            continue
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            if isinstance(config.get(key), int) and config[key] > 0:
                return int(config[key])
    return 2048


def task_manager(include: Path | None, cache_dir: Path | None) -> Any:
    """The harness's TaskManager over its bundled tasks and `include`'s.

    Indexing the ~14,700 task files lm_eval bundles parses each as YAML: 8-15 s of CPU at every benchmark's start.
    That index depends only on the installed lm_eval, so it is kept in `cache_dir/lm_eval-tasks.json` (written
    once, keyed by lm_eval's version and the place and time of its tasks folder, so a reinstall rebuilds it); each
    run then indexes only `include` (the user's eval file) and lays it over the bundled tasks, as TaskManager does
    (a later path's task overrides an earlier one's of the same name). The fields set here are those
    TaskManager.__init__ sets, for the pinned lm-eval (tests/worker/test_bench.py compares it with a fresh one)."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    bundled = Path(lm_eval.tasks.__file__).parent
    index = _bundled_index(bundled, cache_dir)
    if index is None:
        return TaskManager(include_path=str(include) if include else None)
    manager = TaskManager(include_path=str(include) if include else None, include_defaults=False)
    manager._index = {**index, **manager._index}
    kinds: dict[Any, list[str]] = {}
    for name, entry in manager._index.items():
        kinds.setdefault(entry.kind, []).append(name)
    manager._all_tasks = sorted(manager._index)
    manager._all_subtasks = sorted(kinds.get(Kind.TASK, []) + kinds.get(Kind.PY_TASK, []))
    manager._all_groups = sorted(kinds.get(Kind.GROUP, []))
    manager._all_tags = sorted(kinds.get(Kind.TAG, []))
    return manager


def _bundled_index(bundled: Path, cache_dir: Path | None) -> dict[str, Any] | None:
    """The index of lm_eval's bundled tasks, from the cache or built (and then cached); None without a cache."""
    if cache_dir is None:
        return None
    from lm_eval.tasks._index import Entry, Kind, TaskIndex

    key = index_key(bundled)
    path = cache_dir / TASK_INDEX_FILE
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept.get("key") == key:
            return {name: Entry(name, Kind[kind], Path(yaml_path) if yaml_path else None, cfg, set(tags))
                    for name, kind, yaml_path, cfg, tags in kept["entries"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: built again below
    _drop_stale_writes(path)
    index = TaskIndex.build([bundled])
    entries = [[e.name, e.kind.name, str(e.yaml_path) if e.yaml_path else None, e.cfg, sorted(e.tags)]
               for e in index.values()]
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        text = json.dumps({"key": key, "entries": entries})
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except (OSError, TypeError, ValueError):  # a configuration JSON cannot hold, or a read-only cache: indexed again
        tmp.unlink(missing_ok=True)  # next time (the temporary file is this process's own)
    return index


def _drop_stale_writes(path: Path) -> None:
    """Remove the half-written copies (`<name>.<pid>.tmp`, 19 MB) of benchmarks stopped while writing the index:
    a stop ends the process at once. Only this module's own names, of processes no longer running."""
    from tunestudio.process import pid_alive

    for stale in path.parent.glob(f"{path.stem}.*.tmp"):
        pid = stale.suffixes[-2].lstrip(".") if len(stale.suffixes) >= 2 else ""
        if pid.isdigit() and not pid_alive(int(pid)):
            stale.unlink(missing_ok=True)


def _check_task(tasks: Any, name: str) -> set[str]:
    """The output types of the task's (or group's) leaf tasks, once it is found and its data loads from the local
    cache; else a UserError naming what to download."""
    if name not in tasks.task_index:
        raise UserError(f"tasks: {unknown_task(name, tasks.all_tasks)}")
    try:
        loaded = tasks.load([name])
    except Exception as exc:
        dataset = _dataset_of(tasks, name)
        what = f"the dataset {dataset}" if dataset else "its dataset"
        raise UserError(
            f"tasks: {name} needs {what}, which is not in the local HF datasets cache and there is no hub access "
            f"here (offline). Download it where the hub is reachable (python -c \"import datasets; "
            f"datasets.load_dataset({dataset.split(' ')[0]!r})\" or `lm_eval --tasks {name} --limit 1` there) and copy "
            f"the cache (~/.cache/huggingface) to this machine. ({type(exc).__name__}: {str(exc)[:300]})"
            if dataset else
            f"tasks: {name} could not load {what} offline: {type(exc).__name__}: {str(exc)[:300]}") from None
    return {str(task.OUTPUT_TYPE) for task in loaded["tasks"].values()}


def _dataset_of(tasks: Any, name: str) -> str | None:
    entry = tasks.task_index.get(name)
    config = getattr(entry, "cfg", None) or {}
    if not config.get("dataset_path") and getattr(entry, "yaml_path", None):
        import yaml

        try:
            config = yaml.load(Path(entry.yaml_path).read_text(), Loader=_lenient_loader()) or {}
        except (OSError, yaml.YAMLError):
            config = {}
    path = config.get("dataset_path")
    if not path:
        return None
    return f"{path} ({config['dataset_name']})" if config.get("dataset_name") else str(path)


def _lenient_loader() -> Any:
    import yaml

    class Lenient(yaml.SafeLoader):
        """The harness's YAML with its `!function` tags left unresolved."""

    Lenient.add_multi_constructor("!", lambda loader, suffix, node: None)
    return Lenient


def custom_task(eval_file: Path, folder: Path, chat: bool) -> str:
    """Write the user's eval file as a harness task (its rows checked and normalised beside its YAML); its name.

    Multiple choice: rows {question, choices, answer} (answer: the right choice's index or text), scored by
    accuracy of the loglikelihoods. Generation: rows {question, answer}, scored by exact match (case and
    punctuation ignored) of the greedy answer up to its first line break.
    """
    import yaml

    rows = _read_rows(eval_file)
    multiple_choice = "choices" in rows[0]
    normalised = [_row(row, number, multiple_choice, eval_file) for number, row in enumerate(rows, 1)]
    name = eval_task_name(eval_file)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in normalised))
    task: dict[str, Any] = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
        "test_split": "test",
        "doc_to_text": "question",
        "doc_to_target": "answer",
        "metadata": {"version": 1.0, "source": str(eval_file)},
    }
    if multiple_choice:
        # With the chat template the prompt ends where the answer starts (its generation prompt): no space between.
        task.update(output_type="multiple_choice", doc_to_choice="choices", target_delimiter="" if chat else " ",
                    metric_list=[{"metric": "acc", "aggregation": "mean", "higher_is_better": True}])
    else:
        task.update(output_type="generate_until", target_delimiter="" if chat else " ",
                    generation_kwargs={"until": ["\n"], "max_gen_toks": 64, "do_sample": False, "temperature": 0},
                    filter_list=[{"name": "strip", "filter": [{"function": "remove_whitespace"},
                                                              {"function": "take_first"}]}],
                    metric_list=[{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                                  "ignore_case": True, "ignore_punctuation": True}])
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return name


def _read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"eval_file: cannot read {path}: {exc.strerror or exc}") from None
    rows: list[Any] = []
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as exc:
            raise UserError(f"eval_file: {path} is not valid JSON: {exc}") from None
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise UserError(f"eval_file: {path} line {number} is not JSON: {exc}") from None
    if not rows:
        raise UserError(f"eval_file: {path} has no rows")
    if not all(isinstance(row, dict) for row in rows):
        raise UserError(f"eval_file: every row of {path} must be an object with question and answer")
    return rows


def _row(row: dict[str, Any], number: int, multiple_choice: bool, path: Path) -> dict[str, Any]:
    where = f"eval_file: {path} row {number}"
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where} has no 'question' text")
    answer = row.get("answer")
    if not multiple_choice:
        if "choices" in row:
            raise UserError(f"{where} has choices, but the first row has none: all rows are one kind")
        if not isinstance(answer, str | int | float) or isinstance(answer, bool) or str(answer).strip() == "":
            raise UserError(f"{where} has no 'answer' text")
        return {"question": question, "answer": str(answer)}
    choices = row.get("choices")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise UserError(f"{where}: 'choices' must be a list of at least 2 texts (the first row has choices)")
    if isinstance(answer, bool) or not isinstance(answer, int | str):
        raise UserError(f"{where}: 'answer' must be the right choice's index or its text")
    if isinstance(answer, str):
        if answer not in choices:
            raise UserError(f"{where}: 'answer' {answer!r} is not one of its choices")
        answer = choices.index(answer)
    if not 0 <= answer < len(choices):
        raise UserError(f"{where}: 'answer' {answer} is not a choice's index (0 to {len(choices) - 1})")
    return {"question": question, "choices": choices, "answer": answer}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
        value) else None


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per task and metric: before, after, their difference and its standard error (the two runs' errors
    combined as independent: sqrt(se_before² + se_after²)); each task's version, sample count and the harness
    model that measured it (`via`, from `merge`)."""
    tasks: dict[str, Any] = {}
    for task, figures in after.get("results", {}).items():
        old = before.get("results", {}).get(task, {})
        metrics: dict[str, Any] = {}
        for key, value in figures.items():
            if "," not in key or "_stderr," in key:
                continue
            metric, _, kept = key.partition(",")
            label = metric if kept == "none" else f"{metric} ({kept})"
            b, a = _number(old.get(key)), _number(value)
            sb, sa = _number(old.get(f"{metric}_stderr,{kept}")), _number(figures.get(f"{metric}_stderr,{kept}"))
            metrics[label] = {
                "before": b, "after": a, "difference": a - b if a is not None and b is not None else None,
                "stderr": math.sqrt(sb**2 + sa**2) if sb is not None and sa is not None else None,
                "stderr_before": sb, "stderr_after": sa,
            }
        samples = after.get("n-samples", {}).get(task, {})
        tasks[task] = {"version": after.get("versions", {}).get(task),
                       "samples": samples.get("effective") if isinstance(samples, dict) else None,
                       "via": after.get("via", {}).get(task), "metrics": metrics}
    return {"tasks": tasks}


def _summary(results: dict[str, Any]) -> str:
    parts = []
    for task, figures in results.get("results", {}).items():
        for key, value in figures.items():
            if "," in key and "_stderr," not in key and _number(value) is not None:
                parts.append(f"{task} {key.split(',')[0]} {value:.4f}")
    return "; ".join(parts) or "no figures"
