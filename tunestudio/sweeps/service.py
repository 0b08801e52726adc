"""The public face of sweeps: create, list, get, stop, delete, and the runners of the live ones.

A sweep's trials are ordinary jobs (the manager's); deleting a sweep forgets its study, not its jobs.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from pydantic import SecretStr

from tunestudio.jobs.manager import JobManager
from tunestudio.settings import private_dir
from tunestudio.sweeps.config import SweepConfig
from tunestudio.sweeps.errors import LIVE, SecretRefused, SecretsNeeded, SweepConflict, SweepNotFound
from tunestudio.sweeps.views import SweepView

if TYPE_CHECKING:
    from tunestudio.sweeps.runner import SweepRunner
    from tunestudio.sweeps.study import Study

log = logging.getLogger(__name__)


def _runner() -> ModuleType:
    """runner.py, imported on first use: Optuna (about a second to import) loads with the first sweep."""
    from tunestudio.sweeps import runner

    return runner


def _studies() -> ModuleType:
    """study.py, imported on first use (Optuna)."""
    from tunestudio.sweeps import study

    return study


class Sweeps:
    def __init__(self, manager: JobManager, poll_seconds: float = 0.5) -> None:
        self.manager = manager
        self.folder = manager.settings.data_dir() / "sweeps"
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._studies: dict[str, Study] = {}
        self._runners: dict[str, SweepRunner] = {}

    def start(self) -> Sweeps:
        """Continue every sweep left live (a restarted server picks its sweeps up where they were)."""
        for path in sorted(self.folder.glob("sw-*.db")):
            study = self._study(path.stem)
            if study.status in LIVE:
                if study.config.missing_secrets:  # its runner follows its jobs and starts no trial: say why
                    log.warning("sweep %s: %s", study.id, SecretsNeeded(study.config.missing_secrets, study.id))
                self._run(study)
        return self

    def close(self) -> None:
        """Stop the runners (the jobs keep running until the manager closes); the sweeps stay live."""
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.halt()
        for runner in runners:
            runner.join(timeout=10)
        with self._lock:
            for study in self._studies.values():
                study.close()
            self._studies.clear()
            self._runners.clear()

    def __enter__(self) -> Sweeps:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, config: SweepConfig, confined: bool = False) -> SweepView:
        """Start a sweep. confined (the API's): each trial's paths are confined to the settings' roots before it
        is submitted, whatever combination of values it draws (a trial outside them fails)."""
        private_dir(self.folder)
        sweep_id = _studies().new_sweep_id()
        study = _studies().Study(self.folder / f"{sweep_id}.db", config, confined=confined)
        with self._lock:
            self._studies[sweep_id] = study
        self._run(study)
        return self.get(sweep_id)

    def ids(self) -> list[str]:
        """Every sweep, newest first."""
        paths = sorted(self.folder.glob("sw-*.db"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        return [p.stem for p in paths]

    def list(self) -> list[SweepView]:
        out = []
        for sweep_id in self.ids():
            try:
                out.append(self.get(sweep_id))
            except SweepNotFound:  # deleted meanwhile
                continue
        return sorted(out, key=lambda s: s.created_at or 0, reverse=True)

    def get(self, sweep_id: str) -> SweepView:
        study = self._study(sweep_id)
        return _runner().view(study, _runner().jobs_by_trial(self.manager, sweep_id))

    def stop(self, sweep_id: str) -> SweepView:
        """No new trials; the running ones stop with a save; the sweep ends `stopped`."""
        study = self._study(sweep_id)
        if study.status not in LIVE:
            raise SweepConflict(f"sweep {sweep_id} is {study.status}; only a live sweep can be stopped")
        study.set_status("stopping")
        with self._lock:
            runner = self._runners.get(sweep_id)
        if runner is None or not runner.is_alive():
            self._run(study)
        return self.get(sweep_id)

    def resume(self, sweep_id: str, secrets: dict[str, SecretStr]) -> SweepView:
        """Give a live sweep that a restarted server read back its secrets again: it goes on making trials.
        SweepConflict when it is over or holds them already; SecretsNeeded naming a secret it needs and was not
        given; ValueError naming one its base never set."""
        study = self._study(sweep_id)
        missing = study.config.missing_secrets
        if study.status not in LIVE or not missing:
            held = "it is " + study.status if study.status not in LIVE else "it holds its secrets"
            raise SweepConflict(f"sweep {sweep_id} has nothing to resume: {held}")
        unknown = sorted(set(secrets) - set(study.config.secret_fields))
        if unknown:  # checked before any is taken: all or nothing
            raise SecretRefused(unknown[0], sweep_id)
        if not_given := [name for name in missing if name not in secrets]:
            raise SecretsNeeded(not_given, sweep_id)
        study.config.give_secrets(secrets)
        self._run(study)
        return self.get(sweep_id)

    def wait(self, sweep_id: str, timeout: float | None = None) -> SweepView:
        """Block until the sweep's runner ends (its budget spent, or stopped)."""
        with self._lock:
            runner = self._runners.get(sweep_id)
        if runner is not None:
            runner.join(timeout)
        return self.get(sweep_id)

    def delete(self, sweep_id: str) -> None:
        """Forget a finished sweep (its study); its trials stay, as the jobs they are."""
        study = self._study(sweep_id)
        if study.status in LIVE:
            raise SweepConflict(f"sweep {sweep_id} is {study.status}; stop it before deleting it")
        with self._lock:
            self._studies.pop(sweep_id, None)
            self._runners.pop(sweep_id, None)
        study.close()
        study.path.unlink(missing_ok=True)

    def _study(self, sweep_id: str) -> Study:
        with self._lock:
            if sweep_id in self._studies:
                return self._studies[sweep_id]
            if not sweep_id.startswith("sw-") or not sweep_id.replace("-", "").isalnum():
                raise SweepNotFound(sweep_id)
            if not (self.folder / f"{sweep_id}.db").is_file():
                raise SweepNotFound(sweep_id)
            study = _studies().Study(self.folder / f"{sweep_id}.db")
            self._studies[sweep_id] = study
            return study

    def _run(self, study: Study) -> None:
        with self._lock:
            current = self._runners.get(study.id)
            if current is not None and current.is_alive():
                return
            runner = _runner().SweepRunner(self.manager, study, self.poll_seconds)
            self._runners[study.id] = runner
        runner.start()
