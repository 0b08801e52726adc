"""Pushing an export to a hub repository with huggingface_hub, with a model card built from the job.

The token comes in the request, reaches this process through the secrets
channel, and goes only to `HfApi`: it is never written, logged or reported
(`export.run` scrubs it from any error text as well). Before any upload the
hub is probed with one short connect (`hub.hub_reachable`), so an offline
machine fails at once with "hub unreachable" instead of after a minute of
retries; a connection that breaks later is reported the same way. An answer
from the hub is not "unreachable": 401/403 is the token refused, 5xx the hub's
own fault, any other status named with the hub's message.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

from tunestudio.export_config import ExportConfig, hub_repo_problem
from tunestudio.worker import hub
from tunestudio.worker.channel import Channel
from tunestudio.worker.errors import UserError
from tunestudio.worker.export.model import write_merged
from tunestudio.worker.export.source import ExportStep, Source

# What an adapter folder holds that belongs on the hub (checkpoints' optimizer states do not); an image job's
# processor is saved as processor_config.json (older processors: preprocessor_config.json).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja", "tokenizer.model", "generation_config.json",
                 "processor_config.json", "preprocessor_config.json")


def require_hub(cfg: ExportConfig) -> None:
    if not hub.hub_reachable():
        raise UserError(f"hub unreachable: {hub.hub_endpoint()} does not answer, so {cfg.repo!r} cannot be "
                        "pushed. Connect to the hub (or set HF_ENDPOINT to one that answers) and export again.")
    if cfg.hf_token is None:
        raise UserError("hf_token: pushing to the hub needs a token with write access")


def push(source: Source, cfg: ExportConfig, staging: Path, step: ExportStep) -> None:
    """Build the folder to push in `staging`, then create the repository and upload it."""
    channel = step.channel
    if cfg.hub_content == "merged" or not source.adapter:
        channel.phase("loading_model", "merging the adapter" if source.adapter else "loading the model")
        write_merged(source, cfg.dtype, staging, step.within(0, 50))
    else:
        for name in ADAPTER_FILES:
            if (source.path / name).is_file():
                shutil.copy2(source.path / name, staging / name)
    (staging / "README.md").write_text(model_card(source, cfg), encoding="utf-8")
    step.check_stop()
    channel.phase("saving", f"uploading to {cfg.repo}")
    step.within(50, 100).report(0.0)
    _upload(cfg, staging, channel)


def _upload(cfg: ExportConfig, folder: Path, channel: Channel) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    assert cfg.hf_token is not None and cfg.repo is not None
    api = HfApi(endpoint=hub.hub_endpoint(), token=cfg.hf_token.get_secret_value())
    try:
        url = api.create_repo(cfg.repo, private=cfg.private, exist_ok=True)
        api.upload_folder(repo_id=url.repo_id, folder_path=str(folder), commit_message="Upload from tunestudio")
    except HfHubHTTPError as exc:  # first: it is an OSError too, and the hub did answer
        raise UserError(_refusal(cfg, exc)) from None
    except _transport_errors() as exc:
        raise UserError(f"hub unreachable: the upload to {cfg.repo!r} at {hub.hub_endpoint()} broke off "
                        f"({type(exc).__name__})") from None
    channel.log(f"pushed to {url} ({'private' if cfg.private else 'public'})")


def _refusal(cfg: ExportConfig, exc: Any) -> str:
    """What an HTTP answer of the hub means for the push (HfHubHTTPError carries the response)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    reason = (getattr(response, "reason_phrase", "") or "").strip()
    said = (getattr(exc, "server_message", None) or "").strip().replace("\n", " ")[:300]
    answer = " ".join(str(p) for p in (status or "?", reason) if p) + (f" ({said})" if said else "")
    if status in (401, 403):
        return (f"the hub refused the token: {answer}; pushing to {cfg.repo!r} needs a token with write access to "
                "that repository's owner (a 'write' token, or a fine-grained one allowed to write there)")
    if isinstance(status, int) and status >= 500:
        return (f"the hub answered {answer} while pushing to {cfg.repo!r}: a fault on the hub's side "
                f"({hub.hub_endpoint()}); try the export again later")
    return f"the hub refused the upload to {cfg.repo!r} (HTTP {answer}); check the repository name and the token"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """A connection that fails or breaks, in whichever HTTP client this huggingface_hub uses (2.x: httpx2)."""
    errors: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(importlib.import_module(name).TransportError)
    return tuple(errors)


def model_card(source: Source, cfg: ExportConfig) -> str:
    """A README with the hub's metadata header, the job's settings, its data and its last metrics."""
    job = source.job_config
    adapter = source.adapter and cfg.hub_content == "adapter"
    base, hub_id = _card_base(source.base_model or job.get("model_name") or "")
    header = ["---", *([f"base_model: {hub_id}"] if hub_id else []),
              f"library_name: {'peft' if adapter else 'transformers'}", "tags:", "- tunestudio",
              f"- {job.get('training_type', 'full' if not source.adapter else 'lora')}", "---", ""]
    title = cfg.repo.split("/")[-1] if cfg.repo else "model"
    what = "A LoRA adapter" if adapter else "A model" + (" (base + adapter, merged)" if source.adapter else "")
    lines = [f"# {title}", "", f"{what} fine-tuned with tunestudio from `{base}`"
             + ("" if hub_id else " (a local model folder)") + ".", ""]
    # Local files by name only: the card is public-facing, the folders on this machine are not its business.
    data = [Path(d).name for d in job.get("local_datasets", [])]
    data += [_card_base(job["hf_dataset"])[0]] if job.get("hf_dataset") else []  # a local one by name only
    if data:
        lines += ["## Data", "", *[f"- `{d}`" for d in data], ""]
    settings = {k: job[k] for k in ("training_type", "max_steps", "num_epochs", "learning_rate", "batch_size",
                                     "gradient_accumulation_steps", "lora_r", "lora_alpha", "max_seq_length",
                                     "random_seed") if k in job}
    if settings:
        lines += ["## Training", "", "| setting | value |", "| --- | --- |",
                  *[f"| {k} | {v} |" for k, v in settings.items()], ""]
    metrics = _last_metrics(source)
    if metrics:
        lines += ["## Metrics (last logged)", "", "| metric | value |", "| --- | --- |",
                  *[f"| {k} | {v:.4g} |" for k, v in metrics.items()], ""]
    return "\n".join(header + lines)


def _card_base(name: str) -> tuple[str, str | None]:
    """(how the card names the base model, its hub id or None): a hub id as it is; a local folder by its name only
    (the card is public, this machine's paths are not), and no `base_model` metadata, which takes hub ids alone."""
    if name and not hub.looks_like_local_path(name) and hub_repo_problem(name) is None:
        return name, name
    return Path(name.rstrip("/")).name or "model", None


def _last_metrics(source: Source) -> dict[str, float]:
    path = Path(source.job_config.get("output_dir") or source.path) / "metrics.jsonl"
    if not path.is_file():
        return {}
    last: dict[str, Any] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        last.update({k: v for k, v in record.items() if isinstance(v, (int, float)) and k in
                     ("step", "loss", "eval_loss", "epoch", "num_tokens")})
    return {k: float(v) for k, v in last.items()}
