"""`python -m tunestudio.worker.launch TORCHRUN-ARGS`: torchrun, plus which rank failed first and how.

torchrun (`torch.distributed.run`) prints its failure summary for humans. This
wrapper runs the same launcher and, when a rank fails, writes the first
failure as JSON ({"rank", "exitcode"}; a negative exit code is a signal) to
the file named by TUNESTUDIO_LAUNCH_RESULT, which the supervisor's executor
reads to say "rank 1 killed by signal 9 (SIGKILL)". It also dies with the
manager, like every worker (the ranks die with it through PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tunestudio.worker.child import die_with_parent
from tunestudio.worker.rank import MANAGER_PID_ENV

RESULT_ENV = "TUNESTUDIO_LAUNCH_RESULT"
LOOPBACK_ENV = "TUNESTUDIO_LOOPBACK_UP"


def main(argv: list[str]) -> int:
    die_with_parent(int(os.environ[MANAGER_PID_ENV]))
    if os.environ.get(LOOPBACK_ENV) == "1":  # a fresh network namespace: its loopback starts down
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    try:
        run(get_args_parser().parse_args(argv))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        result = os.environ.get(RESULT_ENV)
        if result:
            Path(result).write_text(json.dumps({"rank": rank, "exitcode": failure.exitcode}))
        print(f"rank {rank} failed with exit code {failure.exitcode}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
