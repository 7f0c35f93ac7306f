"""What this process may use on its machine, read from ``/proc`` and the cgroup file system.

For the in-process worker tuner (``num_workers="auto"``) and ``dloaderctl doctor``; no psutil
(the plain DataLoader install has none). Each reader takes the file-system roots as parameters,
so its logic is tested against directories laid out like ``/proc`` and cgroupfs. Readers say
"unknown" (``None``) rather than guess when a file is missing or unreadable.

cgroup v2 (``cpu.max``, ``memory.max``/``memory.current``) and v1 (``cpu.cfs_quota_us``,
``memory.limit_in_bytes``/``memory.usage_in_bytes``) are both read; the tightest limit on the
path from the process's cgroup up to the root counts, as the kernel enforces each level.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuClock",
    "Limits",
    "cpu_seconds",
    "limits",
    "memory_available",
    "private_bytes",
]

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """What the process's cgroups allow (``None``: no limit found)."""

    cpu_quota: float | None
    """CPUs' worth of time per period the tightest ``cpu.max`` / CFS quota allows."""
    memory_room: int | None
    """Bytes the tightest memory limit still leaves (limit - usage), at least 0."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _groups(pid: int | str, proc: Path) -> dict[str, str]:
    """controller (``""`` for the v2 hierarchy) -> the process's cgroup path."""
    text = _read(proc / str(pid) / "cgroup") or ""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out[controller] = parts[2] or "/"
    return out


def _levels(root: Path, group: str) -> list[Path]:
    """The cgroup directory of ``group`` under ``root`` and each ancestor up to ``root``."""
    parts = [p for p in group.split("/") if p and p != ".."]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _number(text: str | None) -> int | None:
    if text is None or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value < 0 or value >= _UNLIMITED else value


def _cpu_quota(groups: dict[str, str], cgroup: Path) -> float | None:
    quotas: list[float] = []
    if "" in groups:
        for level in _levels(cgroup, groups[""]):
            fields = (_read(level / "cpu.max") or "").split()
            if len(fields) == 2 and (q := _number(fields[0])) and (p := _number(fields[1])):
                quotas.append(q / p)
    if "cpu" in groups:
        for base in (cgroup / "cpu", cgroup / "cpu,cpuacct"):
            for level in _levels(base, groups["cpu"]):
                q = _number(_read(level / "cpu.cfs_quota_us"))
                p = _number(_read(level / "cpu.cfs_period_us"))
                if q and p:
                    quotas.append(q / p)
    return min(quotas) if quotas else None


def _memory_room(groups: dict[str, str], cgroup: Path) -> int | None:
    rooms: list[int] = []
    if "" in groups:
        for level in _levels(cgroup, groups[""]):
            limit = _number(_read(level / "memory.max"))
            used = _number(_read(level / "memory.current"))
            if limit is not None and used is not None:
                rooms.append(max(limit - used, 0))
    if "memory" in groups:
        for level in _levels(cgroup / "memory", groups["memory"]):
            limit = _number(_read(level / "memory.limit_in_bytes"))
            used = _number(_read(level / "memory.usage_in_bytes"))
            if limit is not None and used is not None:
                rooms.append(max(limit - used, 0))
    return min(rooms) if rooms else None


def limits(pid: int | str = "self", *, proc: Path = PROC, cgroup: Path = CGROUP) -> Limits:
    """The CPU quota and memory room of ``pid``'s cgroups (v2 and v1)."""
    groups = _groups(pid, proc)
    return Limits(_cpu_quota(groups, cgroup), _memory_room(groups, cgroup))


def memory_available(proc: Path = PROC) -> int | None:
    """The kernel's estimate of memory available without swapping (``MemAvailable``), bytes."""
    for line in (_read(proc / "meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def private_bytes(pid: int, proc: Path = PROC) -> int | None:
    """Memory only ``pid`` maps (``Private_Clean + Private_Dirty`` of ``smaps_rollup``): what it
    costs beyond the pages it shares with its parent. A forked loader worker's grows as it
    touches the dataset's Python objects (copy-on-read, via reference counts)."""
    text = _read(proc / str(pid) / "smaps_rollup")
    if text is None:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def cpu_seconds(pid: int | str = "self", proc: Path = PROC) -> float | None:
    """CPU time (user + system) ``pid`` has used, seconds."""
    text = _read(proc / str(pid) / "stat")
    if text is None:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the command name may hold spaces
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (IndexError, ValueError):
        return None


class CpuClock:
    """Busy CPU time of the given CPUs, from ``/proc/stat``: between two readings, how many
    CPUs' worth of work the whole machine did on the CPUs this process may use."""

    def __init__(self, cpus: set[int] | None = None, proc: Path = PROC) -> None:
        self.cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        self._proc = proc

    def busy_seconds(self) -> float | None:
        """Busy time summed over the CPUs, seconds since boot (``None``: unreadable)."""
        text = _read(self._proc / "stat")
        if text is None:
            return None
        busy = 0
        for line in text.splitlines():
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *values = line.split()
            try:
                if int(name[3:]) not in self.cpus:
                    continue
                user, nice, system, _, _, irq, softirq, steal = map(int, values[:8])
            except ValueError:
                continue
            busy += user + nice + system + irq + softirq + steal  # idle and iowait are not busy
        return busy / _TICK
