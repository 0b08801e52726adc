"""The terminal on a fresh machine (issue 32): what a job's start and end print."""

from __future__ import annotations

import logging

import pytest

from tunestudio.cli import follow
from tunestudio.jobs.models import Job
from tunestudio.jobs.status import JobStatus


def test_the_summary_line_says_the_status_once(capsys: pytest.CaptureFixture[str]) -> None:
    done = Job(id="j1", status=JobStatus.completed, message="completed", config={}, created_at=0)
    follow.summary(done, None, [], None)
    assert capsys.readouterr().out.splitlines()[0] == "completed"

    stopped = Job(id="j2", status=JobStatus.stopped, message="stopped at step 4: saved", config={}, created_at=0)
    follow.summary(stopped, None, [], None)
    assert capsys.readouterr().out.splitlines()[0] == "stopped: stopped at step 4: saved"


def test_bitsandbytes_asking_for_the_kernels_package_is_not_printed(caplog: pytest.LogCaptureFixture) -> None:
    import tunestudio.worker.channel  # noqa: F401  (a worker's first import; the forkserver's too)

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        # bitsandbytes' own words, on a CPU with AVX512-BF16 and no `kernels` package
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you "
                       "already `pip install kernels` and the kernels >= 0.11.1", "No module named 'kernels'")
        logger.warning("a warning worth reading")
    assert [r.getMessage() for r in caplog.records] == ["a warning worth reading"]
