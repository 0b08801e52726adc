"""The paths of a job: made absolute and checked, as an explicit step outside `JobConfig`.

`JobConfig` is pure data: its validators never touch the filesystem, so
validating a config twice gives the same config. What the filesystem says is
asked here, at submit (and again in the worker, which may run later or
elsewhere):

- `resolve(cfg)`: every local path made absolute; local datasets, a local
  model folder, an eval file, a local hub-dataset folder, a user reward
  function's file and a held-out record (`held_out_rows`) must exist.
- `confine(cfg, roots)`: for clients that must not reach the whole machine
  (the HTTP API): every path a job reads or writes lies inside its allowed
  roots. It runs *before* `resolve`, on paths alone, so a refusal never tells
  whether an outside path exists.
- `resolve_inputs(spec)`, `confine_inputs(spec, roots)`: the same for what a
  job reads of its data and model, which a dataset report (`ReportSpec`)
  reads too; `resolve` and `confine` begin with them.
- `protect_data_dir(cfg, data_dir, others)`: no job writes over the data
  directory's own folders or another job's outputs (every caller).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tunestudio.config import JobConfig, ReportSpec, reward_model_folder, reward_source

__all__ = [
    "PathRefused",
    "Roots",
    "confine",
    "confine_inputs",
    "confine_output",
    "expand",
    "export_checkpoint",
    "looks_like_path",
    "protect_data_dir",
    "protect_export_dir",
    "protect_export_inputs",
    "protect_inputs",
    "resolve",
    "resolve_inputs",
    "tensorboard_path",
]


# The data directory's folders tunestudio keeps (jobs/ID is the manager's to assign): no job writes there.
KEPT_FOLDERS = ("jobs", "data", "slots", "cache", "rewards", "sweeps", "mlflow", "judgements")


class PathRefused(ValueError):
    """A path of the config is missing or not allowed; `field` names the config field."""

    def __init__(self, field: str, message: str, code: str = "path_not_allowed", also: str | None = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code
        self.also = also  # the other field, when a path clashes with another one (output_dir and model_name)

    @property
    def fields(self) -> list[str]:
        return [self.field, *([self.also] if self.also else [])]


@dataclass(frozen=True)
class Roots:
    """Where a confined job may read and write."""

    data_dir: Path
    dataset_roots: tuple[Path, ...]  # datasets, eval files, output folders
    model_roots: tuple[Path, ...]  # local model folders
    reward_roots: tuple[Path, ...] = ()  # GRPO reward function files: code the worker runs
    bundled: tuple[Path, ...] = ()  # datasets shipped with tunestudio: always readable, never an output folder


def expand(raw: str | Path) -> Path:
    """Path(raw) with a leading ~ or ~user expanded; left as written, as a shell leaves it, when there is no
    such user or no home (pathlib raises RuntimeError there, which would reach a client as a server error)."""
    path = Path(raw)
    try:
        return path.expanduser()
    except RuntimeError:
        return path


def looks_like_path(value: str) -> bool:
    """Whether a model or dataset name is meant as a local path rather than a hub id ("org/name")."""
    return value.startswith(("/", "./", "../", "~")) or value.count("/") > 1 or value in (".", "..")


def _abs(raw: str) -> Path:
    return expand(raw).resolve(strict=False)


def _inside(path: Path, roots: Iterable[Path], strictly: bool = False) -> bool:
    return any(path.is_relative_to(root) and not (strictly and path == root) for root in roots)


def _eval_path(cfg: JobConfig | ReportSpec) -> str | None:
    """eval_split when it names a file or folder ("data/val.jsonl") rather than a split ("test")."""
    raw = cfg.eval_split
    if raw and ("/" in raw or Path(raw).suffix):
        return raw
    return None


def _on_disk(raw: str, test: str) -> bool:
    """expand(raw).<test>(), False for a name no filesystem takes (too long, a NUL byte)."""
    try:
        return bool(getattr(expand(raw), test)())
    except (OSError, ValueError):
        return False


def _local_model(cfg: JobConfig | ReportSpec) -> str | None:
    raw = cfg.model_name  # a report without a model has none
    return raw if raw is not None and (looks_like_path(raw) or _on_disk(raw, "is_dir")) else None


def _local_hub_dataset(cfg: JobConfig | ReportSpec) -> str | None:
    raw = cfg.hf_dataset
    return raw if raw and (looks_like_path(raw) or _on_disk(raw, "exists")) else None


def tensorboard_path(cfg: JobConfig) -> Path:
    """Where TensorBoard files go: tensorboard_dir, relative to output_dir unless absolute."""
    path = expand(cfg.tensorboard_dir)
    return path if path.is_absolute() else Path(cfg.output_dir or ".") / path


def resolve_datasets(raws: Iterable[str]) -> list[str]:
    """local_datasets made absolute; PathRefused for one that does not exist or is listed twice."""
    datasets: list[str] = []
    for raw in raws:
        path = _abs(raw)
        if not _on_disk(str(path), "exists"):
            raise PathRefused("local_datasets", f"dataset path {raw!r} does not exist", code="not_found")
        if str(path) in datasets:  # two spellings of one file ("a.jsonl" and its absolute path)
            raise PathRefused("local_datasets", f"dataset {raw!r} is listed twice (as {path}); list each once")
        datasets.append(str(path))
    return datasets


def confine_datasets(raws: Iterable[str], roots: Roots) -> None:
    """PathRefused unless every local dataset lies in the dataset folders (or is a bundled one)."""
    for raw in raws:
        if not _inside(_abs(raw), (*roots.dataset_roots, *roots.bundled)):
            raise PathRefused("local_datasets", f"{raw} is outside the allowed dataset folders "
                                                f"({', '.join(map(str, roots.dataset_roots))})")


def resolve(cfg: JobConfig) -> JobConfig:
    """The config with every local path absolute; raises PathRefused for one that must exist and does not."""
    update = resolve_inputs(cfg)
    for name in ("output_dir", "resume_from_checkpoint"):
        raw = getattr(cfg, name)
        if raw and raw != "latest":
            update[name] = str(_abs(raw))
    rewards = []
    for entry in cfg.reward_functions:  # GRPO: a user reward function's file (its code runs in the worker)
        source = reward_source(entry)
        if source is not None:
            path = _abs(source)
            if not _on_disk(str(path), "is_file"):
                raise PathRefused("reward_functions", f"reward function file {source!r} does not exist",
                                  code="not_found")
            entry = f"{path}:{entry.rpartition(':')[2]}"
        folder = reward_model_folder(entry)
        if folder is not None:  # a reward model: a folder the worker loads
            path = _abs(folder)
            if not _on_disk(str(path), "is_dir"):
                raise PathRefused("reward_functions", f"reward model folder {folder!r} does not exist",
                                  code="not_found")
            entry = f"model:{path}"
        rewards.append(entry)
    update["reward_functions"] = rewards
    return cfg.model_copy(update=update)


def resolve_inputs(cfg: JobConfig | ReportSpec) -> dict[str, object]:
    """What a job reads of its data and model made absolute, as the fields to update: local datasets, a local
    model folder, a local hub-dataset folder, an eval file, a held-out record. PathRefused for one that must
    exist and does not."""
    update: dict[str, object] = {"local_datasets": resolve_datasets(cfg.local_datasets)}
    if (model := _local_model(cfg)) is not None:
        path = _abs(model)
        if not _on_disk(str(path), "is_dir"):
            raise PathRefused("model_name", f"local model folder {model!r} does not exist (a hub id reads "
                                            "'org/name')", code="not_found")
        update["model_name"] = str(path)
    if (dataset := _local_hub_dataset(cfg)) is not None:
        path = _abs(dataset)
        if not _on_disk(str(path), "exists"):
            raise PathRefused("hf_dataset", f"local dataset {dataset!r} does not exist", code="not_found")
        update["hf_dataset"] = str(path)
    if (eval_file := _eval_path(cfg)) is not None:
        path = _abs(eval_file)
        if not _on_disk(str(path), "exists"):
            raise PathRefused("eval_split", f"eval file {eval_file!r} does not exist", code="not_found")
        update["eval_split"] = str(path)
    if cfg.held_out_rows:  # an earlier job's record of the rows it held out (its resume's, its clone's)
        path = _abs(cfg.held_out_rows)
        if not _on_disk(str(path), "is_file"):
            raise PathRefused("held_out_rows", f"held-out record {cfg.held_out_rows!r} does not exist (the job that "
                                               "wrote it was deleted with its files?); unset held_out_rows for a "
                                               "new split", code="not_found")
        update["held_out_rows"] = str(path)
    return update


def _refuse(field: str, raw: str, where: Iterable[Path], what: str) -> PathRefused:
    return PathRefused(field, f"{raw} is outside the allowed {what} ({', '.join(map(str, where))})")


def confine_inputs(cfg: JobConfig | ReportSpec, roots: Roots) -> None:
    """PathRefused unless what a job reads of its data and model lies inside its roots (paths only): local
    datasets, an eval file and a local hub-dataset folder in the dataset folders, a local model folder in the
    model folders, a held-out record in the data directory or the dataset folders."""
    confine_datasets(cfg.local_datasets, roots)
    readable = (*roots.dataset_roots, *roots.bundled)
    for field, raw in (("eval_split", _eval_path(cfg)), ("hf_dataset", _local_hub_dataset(cfg))):
        if raw is not None and not _inside(_abs(raw), readable):
            raise _refuse(field, raw, roots.dataset_roots, "dataset folders")
    if (model := _local_model(cfg)) is not None and not _inside(_abs(model), roots.model_roots):
        raise _refuse("model_name", model, roots.model_roots, "model folders (TUNESTUDIO_MODEL_ROOTS)")
    records = (roots.data_dir, *roots.dataset_roots)
    if cfg.held_out_rows and not _inside(_abs(cfg.held_out_rows), records):
        raise _refuse("held_out_rows", cfg.held_out_rows, records, "folders")


def confine(cfg: JobConfig, roots: Roots) -> None:
    """Raise PathRefused unless every path the job touches lies inside its roots (paths only, no lookups)."""
    allowed = (roots.data_dir, *roots.dataset_roots)
    confine_inputs(cfg, roots)
    for raw in filter(None, map(reward_source, cfg.reward_functions)):  # user code: only from the reward folders
        if not _inside(_abs(raw), roots.reward_roots):
            raise _refuse("reward_functions", raw, roots.reward_roots, "reward function folders "
                                                                       "(TUNESTUDIO_REWARD_ROOTS)")
    for raw in filter(None, map(reward_model_folder, cfg.reward_functions)):  # a reward model: read as a model is
        if not _inside(_abs(raw), (roots.data_dir, *roots.model_roots)):
            raise _refuse("reward_functions", raw, (roots.data_dir, *roots.model_roots), "model folders "
                                                                                         "(TUNESTUDIO_MODEL_ROOTS)")
    if cfg.output_dir and not _inside(_abs(cfg.output_dir), allowed, strictly=True):
        raise PathRefused("output_dir", f"{cfg.output_dir} must be a folder strictly inside one of "
                                        f"{', '.join(map(str, allowed))}")
    checkpoint = cfg.resume_from_checkpoint
    if checkpoint and checkpoint != "latest" and not _inside(_abs(checkpoint), allowed):
        raise _refuse("resume_from_checkpoint", checkpoint, allowed, "folders")
    if cfg.enable_tensorboard or Path(cfg.tensorboard_dir).is_absolute():
        board = tensorboard_path(cfg).resolve(strict=False)
        if cfg.output_dir is None and not expand(cfg.tensorboard_dir).is_absolute():
            # relative, with no output_dir: under the output folder the manager assigns (jobs/ID/output), not the cwd
            board = (roots.data_dir / "jobs" / "ID" / "output" / expand(cfg.tensorboard_dir)).resolve(strict=False)
        inside_output = cfg.output_dir is not None and board.is_relative_to(_abs(cfg.output_dir))
        if not inside_output and not _inside(board, [roots.data_dir]):
            raise PathRefused("tensorboard_dir", f"{cfg.tensorboard_dir} must be inside output_dir or the data "
                                                 f"directory {roots.data_dir}")
    uri = cfg.mlflow_tracking_uri
    if uri is not None and not uri.startswith(("http://", "https://")):
        # a local store is a file the worker writes: only the data directory's (the default leaves it unset)
        store = uri.removeprefix("sqlite:///").removeprefix("file://")
        if "://" in store or not _inside(_abs(store), [roots.data_dir]):
            raise PathRefused("mlflow_tracking_uri", f"{uri}: the API takes an http(s) tracking server, or a store "
                                                     f"inside the data directory {roots.data_dir}; unset: its own")


def protect_inputs(cfg: JobConfig) -> None:
    """Refuse an output_dir that would write into the job's own inputs (after `resolve`: absolute paths).

    Not the model folder or a dataset folder, nor inside or around one; not a folder holding a dataset file,
    the eval file, a reward function's file or the checkpoint the job resumes from ("latest", its own
    output's newest checkpoint, is the one exception). A folder beside the data is fine.
    """
    if cfg.output_dir:
        _refuse_overlap(cfg.output_dir, *_inputs(cfg))


def _inputs(cfg: JobConfig) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(field, path) of what the job reads that is a folder, and of what is a file (a checkpoint: a folder)."""
    folders: list[tuple[str, str]] = []
    files: list[tuple[str, str]] = []
    if (model := _local_model(cfg)) is not None:
        folders.append(("model_name", model))
    for raw in cfg.local_datasets:
        (folders if _on_disk(raw, "is_dir") else files).append(("local_datasets", raw))
    if (dataset := _local_hub_dataset(cfg)) is not None:
        (folders if _on_disk(dataset, "is_dir") else files).append(("hf_dataset", dataset))
    if (eval_file := _eval_path(cfg)) is not None:
        (folders if _on_disk(eval_file, "is_dir") else files).append(("eval_split", eval_file))
    files += [("reward_functions", raw) for raw in filter(None, map(reward_source, cfg.reward_functions))]
    folders += [("reward_functions", raw) for raw in filter(None, map(reward_model_folder, cfg.reward_functions))]
    if cfg.held_out_rows:
        files.append(("held_out_rows", cfg.held_out_rows))
    if cfg.resume_from_checkpoint and cfg.resume_from_checkpoint != "latest":
        folders.append(("resume_from_checkpoint", cfg.resume_from_checkpoint))
    return folders, files


def _refuse_overlap(output_dir: str, folders: list[tuple[str, str]], files: list[tuple[str, str]]) -> None:
    """PathRefused (naming output_dir and the input's field) if output_dir is, holds or lies inside one of the
    input folders, or holds one of the input files."""
    out = _abs(output_dir)
    for field, raw in folders:
        path = _abs(raw)
        if out == path or out.is_relative_to(path) or path.is_relative_to(out):
            where = "is" if out == path else "lies inside" if out.is_relative_to(path) else "holds"
            raise PathRefused("output_dir", f"{output_dir} {where} the {field} folder {path}: a job never "
                                            "writes into its own inputs; choose a folder of its own",
                              also=field)
    for field, raw in files:
        path = _abs(raw)
        if path.is_relative_to(out):
            raise PathRefused("output_dir", f"{output_dir} holds the {field} file {path}: a job never writes "
                                            "where its inputs are; choose a folder of its own (beside the data "
                                            "is fine)", also=field)


def protect_data_dir(cfg: JobConfig, data_dir: Path, other_outputs: Iterable[tuple[str, bool]]) -> None:
    """Refuse an output_dir that would write over the data directory's own files or another job's outputs.

    Not the data directory or a folder above it, not one of its KEPT_FOLDERS (or inside them: jobs/ID/
    folders are the manager's to assign), not a folder that holds, or lies in, another job's outputs, and
    not the output folder of a live job. other_outputs: (output_dir, live) of the other jobs. The same
    folder as a finished job's is allowed (running a job file again); deleting either job's artefacts is
    then refused while the other refers to the folder.
    """
    if cfg.output_dir:
        _protect_output(cfg.output_dir, data_dir, other_outputs)


def _protect_output(output_dir: str, data_dir: Path, other_outputs: Iterable[tuple[str, bool]]) -> None:
    out = _abs(output_dir)
    data_dir = data_dir.resolve()
    if data_dir.is_relative_to(out):
        raise PathRefused("output_dir", f"{output_dir} is the data directory {data_dir} or holds it")
    for own in KEPT_FOLDERS:
        if out.is_relative_to(data_dir / own):
            raise PathRefused("output_dir", f"{output_dir} is inside the data directory's {own}/ folder, "
                                            "which tunestudio manages; leave output_dir unset or pick another")
    for other, live in other_outputs:
        theirs = _abs(other)
        if (out != theirs or live) and (out.is_relative_to(theirs) or theirs.is_relative_to(out)):
            raise PathRefused("output_dir", f"{output_dir} overlaps the output folder {theirs} of another job")


def protect_export_dir(
    output_dir: str, source_output: str, data_dir: Path, other_outputs: Iterable[tuple[str, bool]]
) -> None:
    """`protect_data_dir` for an export's folder, which may lie inside the output folder of the job it exports.

    There (the default is `<its output>/exports/<target>`) it is the export's own; elsewhere every rule of
    `protect_data_dir` holds. other_outputs: (output_dir, live) of the other jobs, the exported one included.
    """
    out, source = _abs(output_dir), _abs(source_output)
    if out == source:
        raise PathRefused("output_dir", f"{output_dir} is the job's own output folder; export into a folder of "
                                        "its own (the default is exports/ inside it)")
    if out.is_relative_to(source):
        others = [(o, live) for o, live in other_outputs if _abs(o) != source and _abs(o).is_relative_to(source)]
        for other, live in others:
            if live and (out.is_relative_to(_abs(other)) or _abs(other).is_relative_to(out)):
                raise PathRefused("output_dir", f"{output_dir} overlaps the folder {other} of a running export")
        return
    _protect_output(output_dir, data_dir, other_outputs)


def export_checkpoint(raw: str | None, source_output: str) -> str | None:
    """An export's `checkpoint`, absolute: a bare name is a folder of the source's output (checkpoint-40),
    anything else a path (trusted callers only: the API allows names alone). PathRefused if it is missing."""
    if not raw:
        return None
    inside = Path(source_output) / raw
    path = inside if "/" not in raw and not raw.startswith("~") and raw not in (".", "..") else _abs(raw)
    if not _on_disk(str(path), "is_dir"):
        raise PathRefused("checkpoint", f"checkpoint {raw}: no such folder", code="not_found")
    return str(path.resolve())


def protect_export_inputs(output_dir: str, source: JobConfig, checkpoint: str | None) -> None:
    """`protect_inputs` for an export: its folder is not, holds or lies in the checkpoint it exports, nor any
    input of the job it exports (its model folder, dataset folders and files, eval file, hub-dataset folder,
    reward files, held-out record, the checkpoint it resumed from)."""
    folders, files = _inputs(source)
    if checkpoint:
        folders.insert(0, ("checkpoint", checkpoint))
    _refuse_overlap(output_dir, folders, files)


def confine_output(output_dir: str | None, roots: Roots) -> None:
    """`confine` for a bare output folder (an export's): strictly inside the data directory or a dataset root."""
    allowed = (roots.data_dir, *roots.dataset_roots)
    if output_dir and not _inside(_abs(output_dir), allowed, strictly=True):
        raise PathRefused("output_dir", f"{output_dir} must be a folder strictly inside one of "
                                        f"{', '.join(map(str, allowed))}")
