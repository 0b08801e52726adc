"""Server and CLI settings, from the environment (TUNESTUDIO_*) or a .env file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    def data_dir(self) -> Path:
        path = self.home.expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def jobs_dir(self) -> Path:
        path = self.data_dir() / "jobs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def logs_dir(self) -> Path:
        path = self.data_dir() / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path
