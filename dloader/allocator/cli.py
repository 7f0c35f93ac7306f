"""``dloader-allocator``: the cluster allocator daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from dloader._daemon import add_daemon_arguments, run_daemon, shut_down, stop_on_signals
from dloader._shared.cli import finite
from dloader.allocator.config import STORED_SETTINGS, AllocatorDaemonConfig, port_range
from dloader.allocator.core import AllocatorCore
from dloader.allocator.policies import POLICIES
from dloader.allocator.server import build_server
from dloader.allocator.store import AllocatorStore

__all__ = ["main", "serve"]

log = logging.getLogger("dloader.allocator")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dloader-allocator",
        description="Cluster-level elastic GPU allocator: picks every job's GPU count and batch "
        "size with a dynamic-programming optimizer, every interval and on each event. Node "
        "sidecars (dloader-sidecar --allocator) register nodes and apply batch sizes; "
        "dloader-launch restarts jobs under torchrun when their GPU count changes; external "
        "schedulers call the ClusterAllocator gRPC API (proto/dloader/v1/allocator.proto). "
        "Settings: a flag given here wins over its environment variable, which wins over what "
        "a Configure call stored, which wins over the default.",
    )
    add_daemon_arguments(
        p,
        socket_name="allocator.sock",
        state_file="allocator.db",
        token_env="DLOADER_ALLOCATOR_TOKEN",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        help="allocation policy (default: stored, else goodput-dp-lend: goodput-dp, lending the "
        "spare cores of nodes whose sidecar runs with --lend-cores; with none, goodput-dp)",
    )
    p.add_argument(
        "--interval", type=finite, help="seconds between decisions (default: stored, else 60)"
    )
    p.add_argument(
        "--restart-cost",
        type=finite,
        help="default seconds a restart costs a job (default: stored, else 30)",
    )
    p.add_argument(
        "--node-token",
        help="token of the node role on TCP: sidecars register nodes and report with it "
        "(as itself or @FILE; default: none, so nodes need the operator --token)",
    )
    p.add_argument(
        "--client-token",
        help="token of the client role on TCP: launchers and schedulers submit jobs and act "
        "on the jobs whose job token they hold (as itself or @FILE; default: none)",
    )
    p.add_argument(
        "--node-timeout",
        type=finite,
        default=60.0,
        help="seconds without a node report before its GPUs leave the pool (0: never; "
        "default: %(default)s)",
    )
    p.add_argument(
        "--rendezvous-ports",
        type=port_range,
        default=(29400, 29999),
        metavar="FIRST-LAST",
        help="TCP ports handed out, in turn, for the c10d rendezvous of jobs placed on several "
        "nodes (dloader-launch on the job's first node hosts it) (default: 29400-29999)",
    )
    p.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only recommend; never change a job's allocation (default: stored, else off)",
    )
    return p


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Runs the daemon until ``stop`` is set (or SIGTERM/SIGINT)."""
    stop = stop_on_signals(stop)
    store = AllocatorStore(Path(args.state_dir) / "allocator.db")
    try:
        config = AllocatorDaemonConfig.resolve(args, store.get_setting(STORED_SETTINGS))
        core = AllocatorCore(
            store,
            config.settings,
            node_timeout_s=config.node_timeout_s,
            rendezvous_ports=config.rendezvous_ports,
        )
    except BaseException:
        store.close()
        raise
    serving = await build_server(core, config.listen)
    log.info(
        "dloader-allocator listening on %s; state in %s; policy %s%s; %d job(s), %d node(s)",
        ", ".join(serving.addresses),
        config.state_dir,
        core.settings.policy,
        " (dry run)" if core.settings.dry_run else "",
        len(core.jobs),
        len(core.nodes.nodes),
    )
    task = asyncio.create_task(core.run(stop))
    await stop.wait()
    log.info("shutting down")
    await shut_down(serving, [task])
    store.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloader-allocator``."""
    args = parser().parse_args(argv)
    return run_daemon("dloader-allocator", serve, args, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
