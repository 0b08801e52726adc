"""`python -m tunestudio.worker.make_data`: a recipe's preview in a child of the CLI (documents are read and the
teacher asked here, never in the parent). Reads {"public": ..., "secrets": ..., "rows": N} on stdin, writes the
rows as one JSON line on stdout, or {"error": ...} and exit 1."""

from __future__ import annotations

import json
import sys

from pydantic import ValidationError

from tunestudio.make_data_config import MakeDataConfig
from tunestudio.worker.errors import UserError
from tunestudio.worker.make_data.job import preview


def main() -> int:
    given = json.loads(sys.stdin.read())
    try:
        cfg = MakeDataConfig.from_parts(given["public"], given.get("secrets"))
        rows = preview(cfg, given.get("rows"))
    except (UserError, ValidationError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"rows": rows}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
