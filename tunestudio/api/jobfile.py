"""A job's settings as the job file `tunestudio train JOB.yaml` reads, and as a command a shell runs.

The YAML comes from `config.dump_config`, so it is what `load_config` (the CLI's reader) turns back into the
same config; secrets never enter it. The command writes that file with a quoted here-document (nothing in it
is expanded) and runs `tunestudio train` on it, with this server's data directory as TUNESTUDIO_HOME so the
job is listed on this page: `train` has no flag per field, so the file is the honest form.
"""

from __future__ import annotations

import shlex
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


def shell_command(yaml_text: str, filename: str, home: Path) -> str:
    """`(set -C; cat > FILE <<'END' … END) && TUNESTUDIO_HOME=… tunestudio train FILE`, every word quoted as shlex
    does. `set -C` (noclobber): a file of that name already in the user's folder is never overwritten; the shell
    says so and nothing runs."""
    end = DELIMITER
    lines = set(yaml_text.splitlines())
    while end in lines:  # a quoted here-document ends at the first line equal to its word
        end += "_"
    body = yaml_text if yaml_text.endswith("\n") else yaml_text + "\n"
    file = shlex.quote(filename)
    return (f"(set -C; cat > {file} <<'{end}'\n{body}{end}\n"
            f") && TUNESTUDIO_HOME={shlex.quote(str(home))} tunestudio train {file}\n")


def job_file(cfg: JobConfig, filename: str, home: Path, header: str, leave_out: tuple[str, ...] = ()) -> JobFile:
    text = dump_config(cfg, header, leave_out)
    return JobFile(yaml=text, command=shell_command(text, filename, home), filename=filename)
