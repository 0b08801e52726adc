"""A job on a Ray cluster: the driver (job, `python -m tunestudio.worker.ray.job`, started by jobs/ray_cluster.py),
one rank on a Ray worker (rank: main.py's recipe over a RayRankChannel) and what both ends share (ship).

Nothing imports this room: it is started as a process. Inside it `import ray` is the library (absolute imports
only, never `from . import`).
"""

from __future__ import annotations

__all__: list[str] = []
