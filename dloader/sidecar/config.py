"""The sidecar's settings: one frozen object, built in one place, by the daemons' precedence
rule (:mod:`dloader._daemon.config`): a policy set at run time (``dloaderctl policy set``)
survives a restart unless the operator's command line says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
from dataclasses import asdict, dataclass

from dloader._daemon.config import layered
from dloader._daemon.server import ListenConfig
from dloader._shared import env
from dloader._shared.client import Endpoint
from dloader._shared.node_messages import MAX_NICE
from dloader.errors import ConfigError, InvalidArgument
from dloader.sidecar.node_policy import HEDGE_COST, MAX_SPARE, check_policy

__all__ = [
    "DEFAULT_WORKER_NICE",
    "STORED_POLICY",
    "BudgetLimits",
    "PolicySettings",
    "SidecarDaemonConfig",
    "default_budget",
]

log = logging.getLogger(__name__)

#: The settings key under which ``dloaderctl policy set`` is stored.
STORED_POLICY = "policy"

_DEFAULT_PERIOD_S = 2.0
DEFAULT_MEMORY_BUDGET = 0.5  # of the memory the node could give the loader workers
DEFAULT_WORKER_NICE = 10
"""Loader workers at nice 10 weigh 110 against a training process's 1024: a trainer that needs a
core gets it before any job's workers, which share what is left (a worker waiting for a core
delays a batch; a trainer waiting for one delays a step, with the accelerator idle)."""
_MAX_WORKER_BUDGET = 4096

# What one loader worker costs, measured on the 2-core EPYC VM (docs/benchmarks.md, "Default
# budgets"): the defaults divide what the node has by these.
WORKER_MEMORY_FLOOR = 8 * 2**20
"""The least private memory (USS) a forked worker holds: 6.7-7.0 MiB measured (it grows as it
copies the dataset's pages; the policy's memory budget follows what each job's workers hold)."""
WORKER_FILES = 5
"""File descriptors each worker holds open in its training process: 4.8-5.0 measured."""
WORKER_UPKEEP_CORES = 0.007
"""CPU a live worker costs beyond its samples' own work (waking, sending, the trainer's side):
1.2-6.6 thousandths of a core measured at 4-32 workers."""
UPKEEP_SHARE = 0.25
"""The share of the loader's cores the default budget lets the workers' upkeep take: a safety
bound, not the decision (the node policy prices each worker's measured upkeep in its CPU model
and adds none that does not pay). At 0.1 (28 workers on 2 cores) it bound the sidecar where
jobs tuning themselves were not: three I/O-bound jobs took 48 workers under ``auto`` (upkeep
~17% of the cores) and 1.37x the sidecar's throughput (``bench_sidecar --generated``, seed
728988715, mix 2)."""


@dataclass(frozen=True)
class BudgetLimits:
    """The default worker budget and what it comes from: the node's limits, each divided by
    what a worker costs of it (:func:`default_budget`)."""

    cpus: int
    memory: int
    """Workers the memory budget holds at ``WORKER_MEMORY_FLOOR`` each."""
    open_files: int
    """Workers a trainer's open-file limit (``RLIMIT_NOFILE``, as this process has it) holds at
    ``WORKER_FILES`` each, a job's own files aside."""
    processes: int
    """Half the processes the user and the node may still start (``RLIMIT_NPROC``,
    ``kernel.pid_max``, the cgroup's ``pids.max``)."""
    cpu: int
    """Workers whose upkeep takes ``UPKEEP_SHARE`` of the cores."""

    @property
    def workers(self) -> int:
        return max(
            1, min(self.memory, self.open_files, self.processes, self.cpu, _MAX_WORKER_BUDGET)
        )

    def describe(self) -> str:
        return (
            f"{self.workers} = the least of memory {self.memory}, open files "
            f"{self.open_files}, processes {self.processes}, CPU {self.cpu} (upkeep of "
            f"{WORKER_UPKEEP_CORES * 1000:g} thousandths of a core each, at most "
            f"{UPKEEP_SHARE:.0%} of {self.cpus} cores)"
        )


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None  # absent, or "max"


def default_budget(memory_fraction: float = DEFAULT_MEMORY_BUDGET) -> BudgetLimits:
    """The default worker budget on this node, from its measured limits: memory available
    (``memory_fraction`` of it, as ``--memory-budget``), open files, processes and CPU."""
    import resource

    import psutil

    cpus = len(os.sched_getaffinity(0))
    memory = int(memory_fraction * psutil.virtual_memory().available / WORKER_MEMORY_FLOOR)
    files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if files == resource.RLIM_INFINITY:
        files = 2**20
    open_files = max((files - 64) // WORKER_FILES, 1)
    nproc, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    caps = [
        x
        for x in (
            None if nproc == resource.RLIM_INFINITY else nproc,
            _read_int("/proc/sys/kernel/pid_max"),
            _read_int("/sys/fs/cgroup/pids.max"),
        )
        if x is not None
    ]
    running = len(psutil.pids())
    processes = max((min(caps, default=2**22) - running) // 2, 1)
    cpu = max(int(UPKEEP_SHARE * cpus / WORKER_UPKEEP_CORES), 1)
    return BudgetLimits(cpus, memory, open_files, processes, cpu)


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def memory_size(text: str) -> float:
    """``--memory-budget``: a fraction (``0.5``) or a size (``16G``, ``512M``, bytes)."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in _UNITS else ""
    try:
        value = float(raw[: len(raw) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a fraction of available memory (e.g. 0.5) or a size "
            "(e.g. 16G, 512M, or bytes)"
        ) from None
    return value


@dataclass(frozen=True)
class PolicySettings:
    """The node policy and its budget."""

    name: str
    """``adaptive`` or ``even``."""
    worker_budget: int
    """Loader worker processes on the node, all jobs together."""
    cpu_budget: int
    """Cores loader work may use, all jobs together."""
    period_s: float
    """Seconds between periodic decisions."""
    memory_budget: float = DEFAULT_MEMORY_BUDGET
    """Memory the jobs' loader workers may hold together: a fraction (0, 1] of what the node
    could give them (available memory plus what they hold), or bytes (> 1)."""

    def __post_init__(self) -> None:
        check_policy(self.name, "config.name")
        if not 1 <= self.worker_budget <= _MAX_WORKER_BUDGET:
            raise InvalidArgument(
                "config.worker_budget",
                f"{self.worker_budget} must be within [1, {_MAX_WORKER_BUDGET}]",
            )
        if not 1 <= self.cpu_budget <= 4096:
            raise InvalidArgument(
                "config.cpu_budget", f"{self.cpu_budget} must be within [1, 4096]"
            )
        if not (math.isfinite(self.period_s) and 0.1 <= self.period_s <= 3600):
            raise InvalidArgument(
                "config.period_seconds", f"{self.period_s} must be within [0.1, 3600]"
            )
        m = self.memory_budget
        if not (math.isfinite(m) and (0 < m <= 1 or 2**26 <= m <= 2**50)):
            raise InvalidArgument(
                "config.memory_budget",
                f"{m} must be a fraction in (0, 1] or bytes in [64 MiB, 1 PiB]",
            )

    def to_json(self) -> str:
        """As stored."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> PolicySettings:
        """From :meth:`to_json`."""
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"stored policy {raw!r} is unreadable: {exc}") from None


@dataclass(frozen=True)
class SidecarDaemonConfig:
    """Everything ``dloader-sidecar`` runs with."""

    listen: ListenConfig
    state_dir: str
    policy: PolicySettings
    metrics_port: int = 0
    """Prometheus metrics on ``metrics_host:PORT`` (0: off)."""
    metrics_host: str = "127.0.0.1"
    pin_cpus: bool = False
    cgroup_weights: bool = False
    worker_nice: int = DEFAULT_WORKER_NICE
    """The nice value the jobs' loader workers are directed to (0: left alone)."""
    spare_workers: float = HEDGE_COST
    """The storage slow-down an I/O-bound job's spare workers carry (1: none)."""
    allocator: Endpoint | None = None
    """The cluster allocator to join (None: none)."""
    node_id: str = ""
    node_host: str = ""
    """Where other nodes reach this one for a multi-node job's rendezvous ("": the node id)."""
    gpus: int = 0
    """GPUs offered to the allocator (0: the GPUs NVML sees)."""
    cpu_pool: bool = False
    """A CPU-only node: its ``cpu_budget`` cores join the allocator's CPU pool (remote loader
    workers run on them, through Ray); it offers no GPUs."""
    lend_cores: bool = False
    """A GPU node whose Ray node hosts other nodes' jobs' remote loader workers: the allocator
    may lend them the cores its own jobs do not need."""
    log_level: str = "INFO"
    job_timeout_s: float = 60.0
    """A job silent this long is ended (0: never)."""

    def __post_init__(self) -> None:
        if not self.state_dir.strip():
            raise ConfigError("--state-dir '': expected a folder for the daemon's state")
        t = self.job_timeout_s
        if not (math.isfinite(t) and 0 <= t <= 86400):
            raise ConfigError(f"--job-timeout {t}: expected seconds within [0, 86400] (0: never)")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {self.metrics_port}: expected 0..65535")
        if self.gpus < 0:
            raise ConfigError(f"--gpus {self.gpus}: expected >= 0")
        if not 0 <= self.worker_nice <= MAX_NICE:
            raise ConfigError(
                f"--worker-nice {self.worker_nice}: expected 0..{MAX_NICE} (0: workers left alone)"
            )
        s = self.spare_workers
        if not (math.isfinite(s) and 1.0 <= s <= MAX_SPARE):
            raise ConfigError(
                f"--spare-workers {s}: expected a storage slow-down within [1, {MAX_SPARE:g}] "
                "(1: no spare workers)"
            )
        if self.cpu_pool and (self.gpus or self.allocator is None):
            raise ConfigError(
                "--cpu-pool: a node of the allocator's CPU pool offers no GPUs (drop --gpus) "
                "and needs --allocator"
            )
        if self.lend_cores and (self.cpu_pool or self.allocator is None):
            raise ConfigError(
                "--lend-cores: a GPU node lends its spare cores through the allocator (needs "
                "--allocator; a --cpu-pool node's cores are all the pool's already)"
            )

    @classmethod
    def resolve(cls, args: argparse.Namespace, stored_policy: str | None) -> SidecarDaemonConfig:
        """The settings from the parsed flags (``None``: not given), the environment and the
        stored policy, by the daemons' precedence rule."""
        cpus = len(os.sched_getaffinity(0))
        policy = layered(
            PolicySettings("adaptive", default_budget().workers, cpus, _DEFAULT_PERIOD_S),
            PolicySettings.from_json(stored_policy) if stored_policy else None,
            {
                "name": args.policy,
                "worker_budget": args.worker_budget,
                "cpu_budget": args.cpu_budget,
                "period_s": args.period,
                "memory_budget": args.memory_budget,
            },
            stored_by="dloaderctl policy set",
        )
        token = env.secret(args.token or env.sidecar_token(), "--token")
        allocator = args.allocator or env.allocator_target()
        return cls(
            listen=ListenConfig(
                socket=args.socket,
                tcp=args.listen,
                token=token,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tls_client_ca=args.tls_client_ca,
            ),
            state_dir=args.state_dir,
            policy=policy,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            pin_cpus=args.pin_cpus,
            cgroup_weights=args.cgroup_weights,
            worker_nice=args.worker_nice,
            spare_workers=args.spare_workers,
            allocator=(
                Endpoint.of(
                    allocator,
                    env.secret(args.allocator_token or env.allocator_token(), "--allocator-token"),
                )
                if allocator
                else None
            ),
            node_id=args.node_id or socket.gethostname(),
            node_host=args.node_host,
            gpus=args.gpus,
            cpu_pool=args.cpu_pool,
            lend_cores=args.lend_cores,
            log_level=args.log_level,
            job_timeout_s=args.job_timeout,
        )
