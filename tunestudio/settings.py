"""Server and CLI settings, from the environment (TUNESTUDIO_*) or a .env file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tunestudio.paths import Roots

# What ships with tunestudio, beside the package: the embedded tiny model (`make` builds it) and the example
# datasets. The form fills them in, so a job may always read them, wherever the server runs; nothing is ever
# written there (they are not dataset roots, which also take output folders).
_SOURCE = Path(__file__).resolve().parents[1]
EMBEDDED_MODEL = _SOURCE / "models" / "tiny-llama"
BUNDLED_DATASETS = _SOURCE / "examples" / "data"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNESTUDIO_", env_file=".env", extra="ignore")

    home: Path = Field(default=Path("~/.tunestudio"), description="Data directory: database, job outputs, logs.")
    stop_grace_seconds: float = Field(
        default=30.0, gt=0, description="After a cancel, how long the worker may take before SIGTERM."
    )
    save_grace_seconds: float = Field(
        default=300.0, gt=0, description="After a stop with save, how long the worker may take before SIGTERM."
    )
    kill_after_seconds: float = Field(default=5.0, gt=0, description="After SIGTERM, how long before SIGKILL.")
    exit_after_terminal_seconds: float = Field(
        default=15.0, gt=0, description="How long a worker that reported its end may take to exit."
    )
    max_concurrent_jobs: int = Field(default=1, ge=1)
    max_queued_jobs: int = Field(default=500, ge=1, description="Beyond this many queued jobs, a submit is refused.")
    request_poll_seconds: float = Field(
        default=0.5, gt=0, description="How often a server or CLI run checks for stop requests from other processes."
    )
    prewarm: bool = Field(
        default=True, description="Fork workers from a server with the heavy imports done (TUNESTUDIO_PREWARM=0: off)."
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="At most this many torch threads per job or chat worker (default: one per "
        "usable core). Lower it on a machine other busy programs share: waiting threads spin (process.torch_threads).",
    )
    inference_idle_seconds: float = Field(
        default=300.0, gt=0, description="How long the chat worker keeps a model loaded without a request."
    )
    chat_warmup: bool = Field(
        default=True, description="Load a training job's chat model as it completes, when no other job runs or "
        "waits, so its first chat answers at once (TUNESTUDIO_CHAT_WARMUP=0: off).",
    )

    # --- where jobs run (issue 14) --------------------------------------------------
    executor: Literal["local", "ray"] = Field(
        default="local",
        description="local: this machine (num_processes > 1 under torchrun); ray: Ray Train on a Ray cluster.",
    )
    private_network: bool = Field(
        default=False,
        description="Run torchrun jobs in a network namespace of their own with only loopback (unshare -n, "
        "needs root): torchrun's rendezvous store otherwise listens on every interface while a job runs.",
    )
    ray_address: str | None = Field(
        default=None, description='The Ray cluster (e.g. "10.0.0.5:6379"); unset: "auto", the one `ray start` joined.'
    )
    ray_worker_resources: dict[str, Annotated[float, Field(ge=0)]] | None = Field(
        default=None,
        description='What each training worker asks the Ray cluster for, as a JSON object of Ray resources, '
                    'custom ones included (e.g. {"CPU": 4, "GPU": 1, "A100": 1}); unset: one GPU when the cluster '
                    'has one per rank, else one CPU.',
    )
    ray_storage: str | None = Field(
        default=None,
        description="A storage URI every node and this machine reach (s3://bucket/prefix, gs://..., file:///nfs/x): "
                    "Ray Train's storage, where the ranks write checkpoints and artefacts (then copied into the "
                    "job's output_dir); unset: they come back through Ray's object store.",
    )

    mlflow_uri: str | None = Field(
        default=None,
        description="The MLflow tracking store of jobs with report_to mlflow (an http(s) server, a sqlite:/// "
                    "file...); unset: a SQLite store in the data directory (mlflow/mlflow.db).",
    )

    # --- the server --------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Bind address; anything but loopback needs api_token.")
    port: int = Field(default=8765, ge=1, le=65535)
    api_token: SecretStr | None = Field(default=None, description="Bearer token every /api route then requires.")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the server answers to besides 127.0.0.1, localhost, ::1 and its bind address "
                    "(comma-separated or a JSON list; \"*\" turns the Host check off, e.g. behind a proxy).",
    )
    dataset_roots: list[Path] = Field(
        default_factory=list, description="Where local datasets may live; empty: the data directory and the cwd."
    )
    model_roots: list[Path] = Field(
        default_factory=list,
        description="Where local model folders may live (API); empty: the data directory, the cwd, the hub cache.",
    )
    reward_roots: list[Path] = Field(
        default_factory=list,
        description="Where GRPO reward function files (code the worker runs) may live (API); empty: the data "
                    "directory's rewards/ folder only, so code under the current directory is not importable.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    max_chat_body_bytes: int = Field(
        default=32_000_000, ge=1024,
        description="The largest chat request (/v1/chat/completions, /api/chat/prompt): images travel in it as "
                    "base64 data: URLs.",
    )
    max_audio_bytes: int = Field(
        default=25 * 1024 * 1024, ge=1024,
        description="The largest recording /v1/audio/transcriptions takes (OpenAI's limit: 25 MB).",
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, le=600, description="A connection whose request headers take longer is closed."
    )
    max_connections: int = Field(
        default=256, ge=4, description="Open connections (event streams included) beyond which the server says 503."
    )
    max_upload_bytes: int = Field(
        default=1 << 30, ge=1024, description="The largest dataset file the page may upload (POST /api/uploads)."
    )
    max_uploads_total_bytes: int = Field(
        default=10 << 30, ge=1024,
        description="The most the uploads folder (data/uploads) may hold in all; an upload past it is refused (413).",
    )
    sse_heartbeat_seconds: float = Field(default=5.0, gt=0)
    sse_retry_ms: int = Field(default=2000, ge=100)

    @field_validator("api_token", mode="before")
    @classmethod
    def _no_blank_token(cls, value: Any) -> Any:
        # A blank token would look like protection and be none: refuse it rather than serve open.
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(raw, str):
            if not raw.strip():
                raise ValueError("TUNESTUDIO_API_TOKEN is blank; set a real token or unset the variable")
            return raw.strip()
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [h.strip() for h in text.split(",") if h.strip()]
        return value

    def allowed_dataset_roots(self) -> list[Path]:
        roots = self.dataset_roots or [self.data_dir(), Path.cwd()]
        # Uploaded datasets and the arena's exported votes are always readable, whatever roots are set (they are in
        # the data directory).
        return [Path(r).expanduser().resolve() for r in roots] + [self.data_dir() / "data" / "uploads",
                                                                   self.arena_exports()]

    def arena_exports(self) -> Path:
        """Where the arena writes its votes as datasets (tunestudio/arena/)."""
        return self.data_dir() / "data" / "arena"

    def allowed_model_roots(self) -> list[Path]:
        """Where local model folders may live; the embedded tiny model's folder always (a model is only read)."""
        if self.model_roots:
            roots = list(self.model_roots)
        else:
            hub = os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
            roots = [self.data_dir(), Path.cwd(), Path(hub)]
        return [Path(r).expanduser().resolve() for r in roots] + [EMBEDDED_MODEL]

    def allowed_reward_roots(self) -> list[Path]:
        roots = self.reward_roots or [self.data_dir() / "rewards"]
        return [Path(r).expanduser().resolve() for r in roots]

    def roots(self) -> Roots:
        """Where a job submitted through the API may read and write (see tunestudio.paths)."""
        return Roots(self.data_dir(), tuple(self.allowed_dataset_roots()), tuple(self.allowed_model_roots()),
                     tuple(self.allowed_reward_roots()), bundled=(BUNDLED_DATASETS,))

    def data_dir(self) -> Path:
        """The data directory, made owner-only (0700) when the studio makes it. One that was there keeps its mode
        when the user named it (TUNESTUDIO_HOME: perhaps shared on purpose; what the studio writes in it is
        owner-only anyway); the default, ~/.tunestudio, is the studio's own and is tightened."""
        path = self.home.expanduser().resolve()
        private_dir(path, tighten="home" not in self.model_fields_set)
        return path

    def mlflow_tracking_uri(self) -> str:
        """Where jobs with report_to mlflow log: TUNESTUDIO_MLFLOW_URI, else the data directory's SQLite store."""
        return self.mlflow_uri or f"sqlite:///{self.data_dir() / 'mlflow' / 'mlflow.db'}"

    def cache_dir(self) -> Path:
        """Where workers keep what they measured or indexed between jobs (worker/train/calibrate.py:
        `precision.json`; worker/bench.py: `lm_eval-tasks.json`)."""
        return self.data_dir() / "cache"

    def uploads_dir(self) -> Path:
        """Where datasets uploaded through the API are kept (see api/routes/uploads.py)."""
        path = self.data_dir() / "data" / "uploads"
        private_dir(path)
        return path

    def jobs_dir(self) -> Path:
        path = self.data_dir() / "jobs"
        private_dir(path)
        return path


# Owner-only: another local user must not read the studio's jobs, datasets, metrics or sweeps (issue 38).
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def private_dir(path: Path, tighten: bool = True) -> None:
    """Make the folder `path` owner-only (its missing parents as the umask makes them); tighten: one that was
    there (the studio's own, made by an older version with the umask's mode) loses its group and other bits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        if tighten:
            _tighten(path)
        if not path.is_dir():
            raise


def private_file(path: Path) -> None:
    """Make the studio's own file `path` owner-only before anything writes it (SQLite then gives its journal, WAL
    and shared-memory files the same mode): created empty 0600, or an existing one (and its SQLite companions)
    tightened."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:
        for each in (path, *(path.with_name(path.name + end) for end in ("-wal", "-shm", "-journal"))):
            _tighten(each)


def _tighten(path: Path) -> None:
    """Drop group and other bits of our own file or folder; never follow a link, never fail over it (a file of
    another user, a read-only disk: the caller goes on with what it has)."""
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or not info.st_mode & 0o077:
            return
        path.chmod(stat.S_IMODE(info.st_mode) & ~0o077)
    except OSError:
        return
