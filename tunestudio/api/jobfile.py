"""A job's settings as the job file `tunestudio train JOB.yaml` reads, and as a command a shell runs.

The YAML comes from `config.dump_config`, so it is what `load_job_file` (the CLI's reader) turns back into the
same config and the job's name; secrets never enter it. The command writes that file with a quoted here-document
(nothing in it is expanded) and runs `tunestudio train` on it, with this server's data directory as
TUNESTUDIO_HOME so the job is listed on this page: `train` has no flag per field, so the file is the honest form.
It names the `tunestudio` this server runs from by its absolute path (`cli_executable`): a shell whose virtual
environment is not activated has no `tunestudio` on its PATH.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from tunestudio.config import JobConfig
from tunestudio.config.files import dump_config

# What a job chose for itself, not its user: where it wrote, what it resumed, a sweep's MLflow run (as the
# page's Clone to form leaves them out).
JOB_OWN = ("output_dir", "resume_from_checkpoint", "mlflow_parent_run_id", "mlflow_run_name")
DELIMITER = "TUNESTUDIO_JOB_FILE"


class JobFile(BaseModel):
    yaml: str = Field(description="The job file: `tunestudio train` reads it as this config (no secrets).")
    command: str = Field(description="A shell command that writes the job file and runs `tunestudio train` on it.")
    filename: str


def cli_executable() -> str:
    """This server's `tunestudio`, for a shell: the script beside the Python that runs the server (a virtual
    environment's bin/), by its absolute path and quoted; else that Python running the CLI module."""
    python = Path(sys.executable).absolute()  # not resolved: a venv's python is a link out of its bin/
    script = python.with_name("tunestudio")
    if script.is_file():
        return shlex.quote(str(script))
    return f"{shlex.quote(str(python))} -m tunestudio.cli"


def shell_command(yaml_text: str, filename: str, home: Path) -> str:
    """`(set -C; cat > FILE <<'END' … END) && TUNESTUDIO_HOME=… …/bin/tunestudio train FILE`, every word quoted as
    shlex does. `set -C` (noclobber): a file of that name already in the user's folder is never overwritten; the shell
    says so and nothing runs."""
    end = DELIMITER
    lines = set(yaml_text.splitlines())
    while end in lines:  # a quoted here-document ends at the first line equal to its word
        end += "_"
    body = yaml_text if yaml_text.endswith("\n") else yaml_text + "\n"
    file = shlex.quote(filename)
    return (f"(set -C; cat > {file} <<'{end}'\n{body}{end}\n"
            f") && TUNESTUDIO_HOME={shlex.quote(str(home))} {cli_executable()} train {file}\n")


def job_file(cfg: JobConfig, filename: str, home: Path, header: str, leave_out: tuple[str, ...] = (),
             name: str | None = None) -> JobFile:
    text = dump_config(cfg, header, leave_out, name)
    return JobFile(yaml=text, command=shell_command(text, filename, home), filename=filename)
