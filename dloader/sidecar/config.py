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
from dloader.errors import ConfigError, InvalidArgument
from dloader.sidecar.node_policy import check_policy

__all__ = ["STORED_POLICY", "PolicySettings", "SidecarDaemonConfig"]

log = logging.getLogger(__name__)

#: The settings key under which ``dloaderctl policy set`` is stored.
STORED_POLICY = "policy"

_DEFAULT_PERIOD_S = 2.0
_WORKERS_PER_CPU = 8  # default worker budget per usable CPU
DEFAULT_MEMORY_BUDGET = 0.5  # of the memory the node could give the loader workers
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
        if not 1 <= self.worker_budget <= 4096:
            raise InvalidArgument(
                "config.worker_budget", f"{self.worker_budget} must be within [1, 4096]"
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
    allocator: Endpoint | None = None
    """The cluster allocator to join (None: none)."""
    node_id: str = ""
    node_host: str = ""
    """Where other nodes reach this one for a multi-node job's rendezvous ("": the node id)."""
    gpus: int = 0
    """GPUs offered to the allocator (0: the GPUs NVML sees)."""
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

    @classmethod
    def resolve(cls, args: argparse.Namespace, stored_policy: str | None) -> SidecarDaemonConfig:
        """The settings from the parsed flags (``None``: not given), the environment and the
        stored policy, by the daemons' precedence rule."""
        cpus = len(os.sched_getaffinity(0))
        policy = layered(
            PolicySettings("adaptive", _WORKERS_PER_CPU * cpus, cpus, _DEFAULT_PERIOD_S),
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
            log_level=args.log_level,
            job_timeout_s=args.job_timeout,
        )
