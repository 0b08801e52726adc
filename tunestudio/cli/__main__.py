"""`python -m tunestudio.cli ...`: the same command line as the `tunestudio` entry point."""

from __future__ import annotations

import sys

from tunestudio.cli import app

if __name__ == "__main__":
    sys.exit(app())
