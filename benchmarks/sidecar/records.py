"""What the node benchmarks read of a sidecar's run: the records in its state file (the jobs
registered, the node policy's events: :class:`~dloader.sidecar.node_policy.PolicyEvent`), not
its log text. One copy, for ``bench_sidecar`` and its generated mixes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dloader.sidecar.node_policy import PolicyEvent
from dloader.sidecar.store import SidecarStore

__all__ = ["Records", "read_records", "state_file"]


def state_file(folder: Path) -> Path:
    """The state file of the sidecar run in ``folder`` (``apps.experiment.sidecar_process``)."""
    return folder / "state" / "sidecar.db"


@dataclass(frozen=True)
class Records:
    """A sidecar run's jobs and the node policy's events (times: ``time.time()``)."""

    registered: list[tuple[str, str, float]]
    """(job id, name, when), in the order they registered."""
    events: list[tuple[float, PolicyEvent]]
    """Oldest first."""

    @property
    def names(self) -> dict[str, str]:
        """Job id -> its name."""
        return {job: name for job, name, _ in self.registered}

    def nth(self, name: str, n: int) -> tuple[str, float] | None:
        """The ``n``-th (0-based) job of this name to register: (job id, when); None: fewer."""
        found = [(job, at) for job, other, at in self.registered if other == name]
        return found[n] if len(found) > n else None

    def first(self, job_id: str, *kinds: str) -> float | None:
        """When the job's first event of one of ``kinds`` was recorded (None: none)."""
        return next((at for at, e in self.events if e.job_id == job_id and e.kind in kinds), None)


def read_records(folder: Path) -> Records:
    """The records of the (stopped) sidecar run in ``folder``."""
    path = state_file(folder)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no sidecar state file (did the sidecar run here?)")
    store = SidecarStore(path)
    try:
        return Records(store.registrations(), store.events())
    finally:
        store.close()
