"""A benchmark's config as the faces build it: the job's models and tokenizer, and the server to ask.

The API (`POST /api/jobs/{id}/benchmarks`) and the CLI (`tunestudio bench`) both hand the manager a
`BenchConfig` made here: the job's chat models (`<id>:base` before, `<id>` after) and its tokenizer folder come
from the inference wing's `resolve`, the addresses are the server the face runs (its `/v1/completions` and
`/v1/chat/completions`), and the token is the server's own, handed to the worker as a secret.
"""

from __future__ import annotations

from tunestudio.bench_config import BenchConfig, BenchOptions
from tunestudio.inference import BASE_SUFFIX, JobSource, resolve
from tunestudio.paths import PathRefused, Roots, expand

__all__ = ["bench_config", "confine_eval_file"]


def bench_config(jobs: JobSource, job_id: str, options: BenchOptions, base_url: str,
                 api_token: str | None = None) -> BenchConfig:
    """The BenchConfig of a benchmark of job_id against the server at base_url (http://host:port). Raises the
    inference wing's UnknownModel for a job that is no model; PathRefused for an eval file that is not there."""
    spec = resolve(jobs, job_id)
    eval_file = None
    if options.eval_file:
        path = expand(options.eval_file).resolve(strict=False)
        if not path.is_file():
            raise PathRefused("eval_file", f"{options.eval_file} is not a file", code="not_found")
        eval_file = str(path)
    server = base_url.rstrip("/")
    return BenchConfig(**{**options.model_dump(), "eval_file": eval_file}, source_job_id=job_id,
                       base_url=f"{server}/v1/completions", chat_url=f"{server}/v1/chat/completions",
                       tokenizer=spec.tokenizer, base_model=spec.base_model,
                       models={"before": f"{job_id}{BASE_SUFFIX}", "after": job_id}, api_token=api_token)


def confine_eval_file(options: BenchOptions, roots: Roots) -> None:
    """The API's rule for an eval file: inside the dataset roots (or the bundled data), as a job's datasets."""
    if not options.eval_file:
        return
    path = expand(options.eval_file).resolve(strict=False)
    readable = (*roots.dataset_roots, *roots.bundled)
    if not any(path.is_relative_to(root) for root in readable):
        raise PathRefused("eval_file", f"{options.eval_file} is outside the allowed dataset folders "
                                       f"({', '.join(map(str, roots.dataset_roots))})")
