"""`python -m tunestudio.worker CONFIG.json`: run one job, events as JSON lines on stdout.

Secrets come from the environment (HF_TOKEN, WANDB_API_KEY), never from the file.
Stop commands are read as JSON lines on stdin: {"kind": "stop", "save": true}.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tunestudio.worker CONFIG.json", file=sys.stderr)
        return 2
    from tunestudio.worker.channel import StdioChannel
    from tunestudio.worker.optional import hide_unused

    channel = StdioChannel()
    try:
        with open(argv[0], encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        channel.failed(f"cannot read config {argv[0]}: {exc}")
        return 1
    hide_unused(config)  # before the modelling libraries load (worker/optional.py)
    from tunestudio.worker.main import run

    secrets = {k: v for k, v in (("hf_token", os.environ.get("HF_TOKEN")),
                                 ("wandb_token", os.environ.get("WANDB_API_KEY"))) if v}
    try:
        return run(config, channel, secrets)
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
