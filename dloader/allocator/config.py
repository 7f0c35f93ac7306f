"""The allocator's settings: one frozen object, built in one place, by the daemons' precedence
rule (:mod:`dloader._daemon.config`): a ``Configure`` call (policy, interval, restart cost, dry
run) survives a restart unless the operator's command line says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import asdict, dataclass

from dloader._daemon.config import layered
from dloader._daemon.server import ListenConfig
from dloader._shared import env
from dloader.allocator.optimizer import DEFAULT_RESTART_S
from dloader.allocator.policies import POLICIES
from dloader.errors import ConfigError, InvalidArgument

__all__ = ["STORED_SETTINGS", "AllocatorDaemonConfig", "Settings"]

log = logging.getLogger(__name__)

#: The settings key under which ``Configure`` is stored.
STORED_SETTINGS = "settings"


@dataclass(frozen=True)
class Settings:
    """The allocator's policy and loop (what ``Configure`` changes)."""

    policy: str = "goodput-dp-lend"
    """goodput-dp, lending spare cores only from nodes that may lend (``--lend-cores``): where none
    may, it decides exactly as goodput-dp."""
    interval_s: float = 60.0
    """Seconds between periodic decisions."""
    dry_run: bool = False
    """Only recommend: never change a job's allocation."""
    restart_s: float = DEFAULT_RESTART_S
    """Default restart cost of a job that does not state its own."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgument("config.policy", f"{self.policy!r} is not one of {POLICIES}")
        if not (math.isfinite(self.interval_s) and 0.1 <= self.interval_s <= 86400):
            raise InvalidArgument(
                "config.interval_seconds", f"{self.interval_s} must be within [0.1, 86400]"
            )
        if not (math.isfinite(self.restart_s) and 0 <= self.restart_s <= 86400):
            raise InvalidArgument(
                "config.restart_seconds", f"{self.restart_s} must be within [0, 86400]"
            )

    def to_json(self) -> str:
        """As stored."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> Settings:
        """From :meth:`to_json`."""
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"stored settings {raw!r} are unreadable: {exc}") from None


def port_range(text: str) -> tuple[int, int]:
    """``FIRST-LAST`` (argparse type of ``--rendezvous-ports``)."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected FIRST-LAST, two port numbers, e.g. 29400-29999"
        ) from None
    return lo, hi


@dataclass(frozen=True)
class AllocatorDaemonConfig:
    """Everything ``dloader-allocator`` runs with."""

    listen: ListenConfig
    state_dir: str
    settings: Settings
    node_timeout_s: float = 60.0
    """A node silent this long leaves the pool until it reports again (0: never)."""
    log_level: str = "INFO"
    rendezvous_ports: tuple[int, int] = (29400, 29999)
    """TCP ports handed out for the rendezvous of jobs that span nodes."""

    def __post_init__(self) -> None:
        if not self.state_dir.strip():
            raise ConfigError("--state-dir '': expected a folder for the daemon's state")
        t = self.node_timeout_s
        if not (math.isfinite(t) and 0 <= t <= 86400):
            raise ConfigError(f"--node-timeout {t}: expected seconds within [0, 86400] (0: never)")
        lo, hi = self.rendezvous_ports
        if not 1024 <= lo <= hi <= 65535:
            raise ConfigError(
                f"--rendezvous-ports {lo}-{hi}: expected FIRST-LAST within 1024-65535"
            )

    @classmethod
    def resolve(cls, args: argparse.Namespace, stored: str | None) -> AllocatorDaemonConfig:
        """The settings from the parsed flags (``None``: not given), the environment and the
        stored ``Configure``, by the daemons' precedence rule."""
        settings = layered(
            Settings(),
            Settings.from_json(stored) if stored else None,
            {
                "policy": args.policy,
                "interval_s": args.interval,
                "dry_run": args.dry_run,
                "restart_s": args.restart_cost,
            },
            stored_by="Configure",
        )
        token = env.secret(args.token or env.allocator_token(), "--token")
        return cls(
            listen=ListenConfig(
                socket=args.socket,
                tcp=args.listen,
                token=token,
                node_token=env.secret(args.node_token, "--node-token"),
                client_token=env.secret(args.client_token, "--client-token"),
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tls_client_ca=args.tls_client_ca,
            ),
            state_dir=args.state_dir,
            settings=settings,
            node_timeout_s=args.node_timeout,
            log_level=args.log_level,
            rendezvous_ports=args.rendezvous_ports,
        )
