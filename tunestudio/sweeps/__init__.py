"""Sweeps: an Optuna study over a JobConfig's fields whose trials run as ordinary jobs of the queue.

Parent side: never imports torch; Optuna (runner.py) loads with the first sweep a process opens. It uses
the jobs' public face (`jobs.manager`) only.
"""

from tunestudio.sweeps.config import SweepConfig
from tunestudio.sweeps.errors import SecretRefused, SecretsNeeded, SweepConflict, SweepNotFound
from tunestudio.sweeps.service import Sweeps
from tunestudio.sweeps.views import BeforeAfter, BestTrial, SweepList, SweepView, TrialRow

__all__ = ["BeforeAfter", "BestTrial", "SecretRefused", "SecretsNeeded", "SweepConfig", "SweepConflict", "SweepList",
           "SweepNotFound", "SweepView", "Sweeps", "TrialRow"]
