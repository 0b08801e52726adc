"""Server and CLI settings, from the environment (TUNESTUDIO_*) or a .env file."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from tunestudio.paths import Roots


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

    # --- the server --------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Bind address; anything but loopback needs api_token.")
    port: int = Field(default=8765, ge=1, le=65535)
    api_token: SecretStr | None = Field(default=None, description="Bearer token every /api route then requires.")
    dataset_roots: list[Path] = Field(
        default_factory=list, description="Where local datasets may live; empty: the data directory and the cwd."
    )
    model_roots: list[Path] = Field(
        default_factory=list,
        description="Where local model folders may live (API); empty: the data directory, the cwd, the hub cache.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    max_upload_bytes: int = Field(
        default=1 << 30, ge=1024, description="The largest dataset file the page may upload (POST /api/uploads)."
    )
    sse_heartbeat_seconds: float = Field(default=5.0, gt=0)
    sse_retry_ms: int = Field(default=2000, ge=100)

    def allowed_dataset_roots(self) -> list[Path]:
        roots = self.dataset_roots or [self.data_dir(), Path.cwd()]
        # Uploaded datasets are always readable, whatever roots are set (they are in the data directory).
        return [Path(r).expanduser().resolve() for r in roots] + [self.data_dir() / "data" / "uploads"]

    def allowed_model_roots(self) -> list[Path]:
        if self.model_roots:
            roots = list(self.model_roots)
        else:
            hub = os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
            roots = [self.data_dir(), Path.cwd(), Path(hub)]
        return [Path(r).expanduser().resolve() for r in roots]

    def roots(self) -> Roots:
        """Where a job submitted through the API may read and write (see tunestudio.paths)."""
        return Roots(self.data_dir(), tuple(self.allowed_dataset_roots()), tuple(self.allowed_model_roots()))

    def data_dir(self) -> Path:
        path = self.home.expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def uploads_dir(self) -> Path:
        """Where datasets uploaded through the API are kept (see api/routes/uploads.py)."""
        path = self.data_dir() / "data" / "uploads"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def jobs_dir(self) -> Path:
        path = self.data_dir() / "jobs"
        path.mkdir(parents=True, exist_ok=True)
        return path
