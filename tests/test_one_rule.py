"""The parent process never imports torch or the HF libraries (shared/ARCHITECTURE.md)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "peft", "trl", "datasets", "bitsandbytes")


def test_parent_modules_import_no_heavy_library() -> None:
    script = f"""
import sys
import tunestudio.cli, tunestudio.jobs, tunestudio.jobs.supervisor, tunestudio.config, tunestudio.events
import tunestudio.export_config
import tunestudio.settings, tunestudio.worker.child, tunestudio.api
tunestudio.api.create_app()
print(",".join(m for m in {HEAVY!r} if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
