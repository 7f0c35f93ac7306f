"""CPU weights per job through cgroup v2 (``dloader-sidecar --cgroup-weights``).

Under contention the kernel divides CPU between cgroups in proportion to ``cpu.weight``
(1-10000, default 100), and leaves idle CPU to whoever wants it (work-conserving), so weights
enforce the policy's division of the cores without wasting any. The sidecar sets the weight of
each job's own cgroup (the one its training process is in, e.g. its container), proportional to
the CPU share the policy gives the job. It never touches the root cgroup or its own.

It needs a cgroup v2 hierarchy with the ``cpu`` controller enabled for the jobs' cgroups, and
write access to their ``cpu.weight`` (root, or a delegated subtree). :func:`detect` says whether
that holds and why not; without it the sidecar says so once and enforces nothing this way.

On Kubernetes a training process sits in its container's cgroup inside its pod's
(``.../kubepods/burstable/pod<uid>/<container>``, or the systemd ``kubepods-...-pod<uid>.slice``
form). Pods are the siblings that compete for the node's CPU, so the weight is set on the pod's
cgroup, the level at which a node agent can shift CPU between pods without the cluster API
(within what each pod's CPU limit allows; changing limits needs the API and is not done).

The file-system root is a parameter so the logic can be tested against a directory laid out
like cgroupfs; this project's machines have no cgroup v2 ``cpu`` controller to test against.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CgroupWeights", "cgroup_of", "detect", "weighted_group"]

log = logging.getLogger(__name__)

_DEFAULT_WEIGHT = 100


def _cgroup2_mount(mounts: Path) -> Path | None:
    try:
        for line in mounts.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "cgroup2":
                return Path(parts[1])
    except OSError:
        return None
    return None


def cgroup_of(pid: int | str, proc: Path) -> str | None:
    """The cgroup v2 path (``0::/path`` line) of a process, or None."""
    try:
        for line in (proc / str(pid) / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        return None
    return None


_POD = re.compile(r"^(pod[0-9a-f-]{8,}|kubepods(-[a-z]+)*-pod[0-9a-f_]+\.slice)$")


def weighted_group(group: str) -> str:
    """The cgroup whose weight divides CPU for a process in ``group``: its Kubernetes pod's
    cgroup if it is in a pod, else ``group`` itself."""
    parts = group.strip("/").split("/")
    for i, part in enumerate(parts):
        if _POD.match(part):
            return "/" + "/".join(parts[: i + 1])
    return group


def detect(proc: Path = Path("/proc")) -> tuple[Path | None, str]:
    """(cgroup v2 mount point, or None; a sentence saying what is available)."""
    mount = _cgroup2_mount(proc / "self" / "mounts")
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    try:
        controllers = (mount / "cgroup.controllers").read_text().split()
    except OSError:
        return None, f"cgroup v2 at {mount} has no readable cgroup.controllers"
    if "cpu" not in controllers:
        return None, f"cgroup v2 at {mount} has no cpu controller (cgroup v1 may hold it)"
    return mount, f"cgroup v2 cpu.weight at {mount}"


class CgroupWeights:
    """Sets ``cpu.weight`` of each job's cgroup in proportion to its CPU share."""

    def __init__(self, mount: Path, *, proc: Path = Path("/proc")) -> None:
        self.mount = mount
        self.proc = proc
        self.own = cgroup_of("self", proc)
        self._warned: set[str] = set()
        self.applied: dict[str, int] = {}
        """cgroup path -> weight last written."""

    def apply(self, shares: dict[str, tuple[Sequence[int], float]]) -> None:
        """``shares``: job id -> (its training PIDs, its CPU share in cores)."""
        if not shares:
            return
        mean = sum(s for _, s in shares.values()) / len(shares)
        for job_id, (pids, share) in shares.items():
            found = next((g for p in pids if (g := cgroup_of(p, self.proc))), None)
            group = weighted_group(found) if found else None
            if group in (None, "/", self.own):
                self._warn(job_id, f"job {job_id}: not in a cgroup of its own; no cpu.weight")
                continue
            weight = max(1, min(10000, round(_DEFAULT_WEIGHT * share / mean))) if mean else 100
            if self.applied.get(group) == weight:
                continue
            path = self.mount / group.lstrip("/") / "cpu.weight"
            try:
                path.write_text(f"{weight}\n")
            except OSError as exc:
                self._warn(job_id, f"job {job_id}: cannot write {path}: {exc.strerror or exc}")
                continue
            self.applied[group] = weight
            log.info("job %s: cpu.weight %d in %s (share %.2f cores)", job_id, weight, group, share)

    def _warn(self, job_id: str, message: str) -> None:
        if job_id not in self._warned:
            self._warned.add(job_id)
            log.warning(message)
