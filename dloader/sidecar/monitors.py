"""What the sidecar sees of the node: CPU and memory per job process tree (``/proc``, read
directly: a walk is the daemon's most frequent work), node CPU and disk I/O (psutil), and GPUs
through NVML.

NVML sits behind :class:`GpuBackend`, a thin adapter: :class:`NvmlBackend` calls nvidia-ml-py;
tests use a fake at that boundary only. Without a driver or a GPU the monitor says why once and
reports no GPU; the sidecar then relies on the loaders' own data-wait measurements.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import psutil

__all__ = [
    "GpuBackend",
    "GpuInfo",
    "GpuMonitor",
    "NodeMonitor",
    "NvmlBackend",
    "ProcessTreeStats",
    "host_pids",
    "process_owner",
    "process_start",
    "process_tree_stats",
    "run_delay_s",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU's state."""

    index: int
    name: str
    utilization: float  # share of time busy, [0, 1]
    memory_used: int
    memory_total: int
    pids: tuple[int, ...] = ()  # processes using it


class GpuBackend(Protocol):
    """The NVML boundary."""

    def gpus(self) -> list[GpuInfo]:
        """The node's GPUs now (raises on failure)."""
        ...


class NvmlBackend:
    """GPUs through nvidia-ml-py (pynvml). Construction raises if NVML cannot start."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._count = pynvml.nvmlDeviceGetCount()

    def gpus(self) -> list[GpuInfo]:
        nv = self._nvml
        out = []
        for i in range(self._count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
                pids = tuple(int(p.pid) for p in procs)
            except nv.NVMLError:
                pids = ()
            out.append(
                GpuInfo(
                    i,
                    name if isinstance(name, str) else name.decode(),
                    util.gpu / 100.0,
                    int(mem.used),
                    int(mem.total),
                    pids,
                )
            )
        return out


class GpuMonitor:
    """GPU state, or a clear statement that there is none."""

    def __init__(self, backend: GpuBackend | None = None) -> None:
        self.message = ""
        self._backend: GpuBackend | None = backend
        if backend is None:
            try:
                self._backend = NvmlBackend()
            except Exception as exc:  # no library, no driver, no GPU: all mean "no NVML"
                self.message = (
                    f"NVML unavailable ({type(exc).__name__}: {exc}); relying on "
                    "the loaders' data-wait measurements"
                )
                log.info("%s", self.message)

    @property
    def available(self) -> bool:
        """Whether GPU data can be read."""
        return self._backend is not None

    def read(self) -> list[GpuInfo]:
        """The GPUs now; on a read failure, logs once and returns nothing."""
        if self._backend is None:
            return []
        try:
            return self._backend.gpus()
        except Exception as exc:
            if not self.message:
                self.message = f"NVML read failed: {exc}"
                log.warning("%s", self.message)
            return []


@dataclass(frozen=True)
class ProcessTreeStats:
    """A job's training process and its children (loader workers), summed."""

    pids: tuple[int, ...]
    alive: bool
    cpu_percent: float  # 100 per core
    rss_bytes: int
    worker_pids: tuple[int, ...] = field(default_factory=tuple)
    main_cpu_percent: float = 0.0
    """CPU of the registered (training) processes alone, without their loader workers."""
    run_delay_s: dict[int, float] = field(default_factory=dict)
    """Per loader worker (``worker_pids``): seconds it has ever waited, runnable, for a CPU
    (Linux schedstat; empty where the kernel does not say). Its rate is the CPU contention the
    job's workers meet."""
    uss_bytes: dict[int, int] = field(default_factory=dict)
    """Per process: its unique set size, the memory only it holds (what a forked worker has
    copied from its parent; empty where the kernel does not say)."""
    pss_bytes: int = 0
    """The tree's proportional set size (shared pages counted once overall)."""
    anon_bytes: dict[int, int] = field(default_factory=dict)
    """Per process: its anonymous resident memory, private or shared. What a forked worker
    shares of it with its parent it may yet copy (writing to a page, or reading a Python object:
    its reference count is written), so it bounds what the worker can come to hold."""
    truncated: bool = False
    """The tree had more processes than the walk reads (its limit): what it says covers
    those nearest the registered processes."""


@dataclass(frozen=True)
class _Stat:
    """What one read of ``/proc/PID/stat`` says of a process."""

    state: str
    start: int
    """Start time (clock ticks since boot): with the PID, the process's identity."""
    cpu_s: float
    """CPU seconds used, user and system."""
    rss: int
    threads: int


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAVE_PROC_STAT = os.path.exists(f"/proc/{os.getpid()}/stat")


def _read(path: str) -> bytes:
    """A whole ``/proc`` file, read with plain system calls (no Python file object: a walk
    reads thousands of small files; raises ``OSError`` as ``open`` does). The kernel makes
    these files a page at a time: a read shorter than a page is the end."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) >= 4096:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _stat(pid: int) -> _Stat | None:
    """One read of the process's stat (None: gone). The monitor's hot path: a walk reads it
    once per process, where psutil read it two or three times (its identity check, then CPU and
    memory), and skips psutil's per-call overhead."""
    if not _HAVE_PROC_STAT:  # not Linux: psutil
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                return _Stat(
                    "Z" if p.status() == psutil.STATUS_ZOMBIE else "R",
                    int(p.create_time() * _TICK),
                    t.user + t.system,
                    p.memory_info().rss,
                    p.num_threads(),
                )
        except psutil.Error:
            return None
    return _proc_stat(pid)


def _proc_stat(pid: int) -> _Stat | None:
    """``/proc/PID/stat`` read and parsed (None: no such process, or exiting mid-read)."""
    try:
        data = _read(f"/proc/{pid}/stat")
        # after "pid (comm) " (the name may hold spaces and parentheses: split after its last
        # ")"): state, then fields 4.. (utime 14, stime 15, threads 20, start 22, rss 24)
        rest = data[data.rindex(b")") + 2 :].split()
        return _Stat(
            rest[0].decode(),
            int(rest[19]),
            (int(rest[11]) + int(rest[12])) / _TICK,
            int(rest[21]) * _PAGE,
            int(rest[17]),
        )
    except (OSError, ValueError, IndexError):
        return None


_cpu_seen: dict[int, tuple[int, float, float]] = {}  # pid -> (start, CPU seconds, when read)


def _cpu_percent(pid: int, st: _Stat) -> float:
    """CPU use since the previous walk saw this process (100 per core; 0.0 the first time, as
    psutil's ``cpu_percent(None)``)."""
    now = time.monotonic()
    seen = _cpu_seen.get(pid)
    _cpu_seen[pid] = (st.start, st.cpu_s, now)
    if seen is None or seen[0] != st.start or now <= seen[2]:
        return 0.0  # first sight, or the PID now names another process
    return max(100.0 * (st.cpu_s - seen[1]) / (now - seen[2]), 0.0)


_MEMORY_TTL_S = 10.0
_memory: dict[int, tuple[float, int, int, int]] = {}  # pid -> (when, USS, PSS, anonymous)


def _smaps(pid: int) -> tuple[int, int, int]:
    """A process's USS, PSS and anonymous resident memory (``/proc/PID/smaps_rollup``; where
    the kernel has none, psutil's USS and PSS and the RSS as the anonymous part)."""
    try:
        text = _read(f"/proc/{pid}/smaps_rollup").decode()
    except FileNotFoundError:
        if psutil.pid_exists(pid):  # a kernel without smaps_rollup
            full = psutil.Process(pid).memory_full_info()
            return full.uss, getattr(full, "pss", full.uss), full.rss
        raise psutil.NoSuchProcess(pid) from None
    except PermissionError:
        raise psutil.AccessDenied(pid) from None
    except OSError:  # ESRCH: it is exiting
        raise psutil.NoSuchProcess(pid) from None
    kb: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            kb[name] = int(value[0])
    uss = kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0) + kb.get("Private_Hugetlb", 0)
    return uss * 1024, kb.get("Pss", 0) * 1024, kb.get("Anonymous", 0) * 1024


def _uss_pss_anon(pid: int) -> tuple[int, int, int]:
    """A process's USS, PSS and anonymous memory, read at most every ``_MEMORY_TTL_S``
    (smaps_rollup walks the page tables: the dearest thing the monitor reads; memory moves
    slowly)."""
    now = time.monotonic()
    seen = _memory.get(pid)
    if seen is None or now - seen[0] > _MEMORY_TTL_S:
        seen = _memory[pid] = (now, *_smaps(pid))
    return seen[1], seen[2], seen[3]


_CHILDREN_TTL_S = 0.5
_children: tuple[float, dict[int, list[int]]] = (-1.0, {})


def _children_map() -> dict[int, list[int]]:
    """Parent PID -> child PIDs of every process on the node. Reading it means reading every
    process's ``/proc`` entry, so all the jobs measured within ``_CHILDREN_TTL_S`` share one
    scan (``Process.children`` scans once per call: once per job)."""
    global _children
    now = time.monotonic()
    if now - _children[0] > _CHILDREN_TTL_S:
        kids: dict[int, list[int]] = {}
        for p in psutil.process_iter(["ppid"]):
            ppid = p.info["ppid"]
            if ppid is not None:
                kids.setdefault(ppid, []).append(p.pid)
        _children = (now, kids)
    return _children[1]


_HAVE_TASK_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children_of(pid: int, threads: int = 0) -> list[int]:
    """Direct children of ``pid``: from ``/proc/PID/task/*/children`` where the kernel has it
    (a few small reads per process, not a scan of every process on the node; a process known
    to have one thread has one such file), else from the shared scan."""
    if not _HAVE_TASK_CHILDREN:
        return _children_map().get(pid, [])
    if threads == 1:
        tasks = [str(pid)]
    else:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone
            return []
    kids: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            kids += [int(x) for x in _read(f"/proc/{pid}/task/{task}/children").split()]
    return kids


_PRUNE_EVERY_S = 30.0
_pruned_at = 0.0


def _prune() -> None:
    """Forgets the cached processes that have ended (resized-away workers, finished jobs)."""
    global _pruned_at
    now = time.monotonic()
    if now - _pruned_at < _PRUNE_EVERY_S:
        return
    _pruned_at = now
    for pid in [pid for pid in _cpu_seen if not os.path.exists(f"/proc/{pid}")]:
        del _cpu_seen[pid]
        _memory.pop(pid, None)


def process_tree_stats(pids: Sequence[int], limit: int = 0) -> ProcessTreeStats:
    """CPU and memory of ``pids`` and their descendants, to at most ``limit`` processes in all
    (0: no limit), nearest first (their I/O is not read: no decision uses it, and
    ``/proc/PID/io`` was a quarter of a walk's reads). A tree cut at ``limit`` says so
    (``truncated``): what a user's own huge tree costs the node's daemon is bounded."""
    _prune()
    tree: dict[int, _Stat] = {}
    alive = truncated = False
    for pid in pids:
        root = _stat(pid)
        if root is None or root.state == "Z":
            continue
        alive = True
        tree[pid] = root
    todo = collections.deque((pid, st.threads) for pid, st in tree.items())
    while todo:
        parent, threads = todo.popleft()
        for child in _children_of(parent, threads):
            if child in tree:
                continue
            if limit and len(tree) >= limit:
                truncated = True
                todo.clear()
                break
            st = _stat(child)
            if st is None:  # gone since the scan
                continue
            tree[child] = st
            todo.append((child, st.threads))
    cpu = main = 0.0
    rss = pss = 0
    uss: dict[int, int] = {}
    anon: dict[int, int] = {}
    for pid, st in tree.items():
        used = _cpu_percent(pid, st)
        cpu += used
        main += used if pid in pids else 0.0
        rss += st.rss
        with contextlib.suppress(psutil.Error):  # not ours to read, or exiting
            u, q, a = _uss_pss_anon(pid)  # USS and PSS, not only RSS
            uss[pid], anon[pid], pss = u, a, pss + q
    workers = tuple(sorted(p for p in tree if p not in pids))
    delays = {pid: d for pid in workers if (d := run_delay_s(pid)) is not None}
    return ProcessTreeStats(
        tuple(pids), alive, cpu, rss, workers, main, delays, uss, pss, anon, truncated
    )


def available_memory_bytes() -> int:
    """Memory the node can give without swapping, now (``MemAvailable``)."""
    return int(psutil.virtual_memory().available)


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def host_pids(pids: Sequence[int], peer_pid: int) -> list[int]:
    """``pids`` as the caller (process ``peer_pid``) numbers them, in this process's numbering.

    A training pod has its own PID namespace: its trainer may be PID 7 inside and PID 41234 on
    the node, where the sidecar (``hostPID``) measures it. The kernel gives the sidecar the
    caller's node PID; the caller's PID namespace tells which node process each claimed PID is
    (the last field of ``NSpid``). Raises ``ValueError`` naming a PID not in that namespace.
    """
    theirs = _pid_namespace(peer_pid)
    if theirs is None or theirs == _pid_namespace("self"):
        return list(pids)
    inner: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _pid_namespace(entry.name) == theirs:
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            inner[int(line.split()[-1])] = int(entry.name)
                            break
            except (OSError, ValueError):
                continue
    missing = [p for p in pids if p not in inner]
    if missing:
        raise ValueError(f"process {missing[0]} is not in the caller's PID namespace")
    return [inner[p] for p in pids]


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/PID/stat`` field 22;
    None: no such process). A PID and its start time name one process: a PID the kernel hands
    out again gets another start time."""
    st = _proc_stat(int(pid))
    return None if st is None else st.start


def process_owner(pid: int) -> int | None:
    """The real uid of process ``pid`` (None: no such process). Read from ``status``, not from
    the owner of ``/proc/PID``, which is root for a process that changed its uid."""
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def run_delay_s(pid: int) -> float | None:
    """Seconds process ``pid``'s main thread has waited on a run queue (``/proc/PID/schedstat``,
    second field, in ns), or ``None`` where it cannot be read (not Linux, no schedstat, gone)."""
    try:
        return int(_read(f"/proc/{pid}/schedstat").split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class NodeMonitor:
    """Node-wide CPU and disk rates between two reads."""

    def __init__(self) -> None:
        self.hostname = socket.gethostname()
        self.cpu_count = psutil.cpu_count() or 1
        psutil.cpu_percent(None)
        self._last_io = psutil.disk_io_counters()
        self._last_t = time.monotonic()

    def read(self) -> tuple[float, float, float]:
        """(node CPU percent, disk read bytes/s, disk write bytes/s) since the last read."""
        cpu = psutil.cpu_percent(None) * self.cpu_count
        io = psutil.disk_io_counters()
        now = time.monotonic()
        dt = max(now - self._last_t, 1e-3)
        rd = wr = 0.0
        if io is not None and self._last_io is not None:
            rd = max(io.read_bytes - self._last_io.read_bytes, 0) / dt
            wr = max(io.write_bytes - self._last_io.write_bytes, 0) / dt
        self._last_io, self._last_t = io, now
        return cpu, rd, wr
