"""Sweeps: an Optuna study over a JobConfig's fields whose trials run as ordinary jobs of the queue.

Parent side: never imports torch. It uses the jobs' public face (`jobs.manager`) only.
"""

from tunestudio.sweeps.config import SweepConfig
from tunestudio.sweeps.runner import SweepConflict, SweepNotFound, SweepRunner
from tunestudio.sweeps.service import Sweeps

__all__ = ["SweepConfig", "SweepConflict", "SweepNotFound", "SweepRunner", "Sweeps"]
