"""``dloader-allocator``: the cluster allocator daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from dloader.allocator.core import AllocatorCore, Settings
from dloader.allocator.policies import POLICIES
from dloader.allocator.server import build_server
from dloader.allocator.store import Store
from dloader.sidecar._config import default_socket, default_state_dir
from dloader.sidecar.cli import run_daemon, stop_on_signals
from dloader.sidecar.server import ListenConfig

__all__ = ["main", "serve"]

log = logging.getLogger("dloader.allocator")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dloader-allocator",
        description="Cluster-level elastic GPU allocator: picks every job's GPU count and batch "
        "size with a dynamic-programming optimizer, every interval and on each event. Node "
        "sidecars (dloader-sidecar --allocator) register nodes and apply batch sizes; "
        "dloader-launch restarts jobs under torchrun when their GPU count changes; external "
        "schedulers call the ClusterAllocator gRPC API (proto/dloader/v1/allocator.proto).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--socket", default=default_socket("allocator.sock"), help="Unix socket (mode 0660)"
    )
    p.add_argument("--state-dir", default=default_state_dir(), help="folder for allocator.db")
    p.add_argument("--policy", choices=POLICIES, default="goodput-dp", help="allocation policy")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between decisions")
    p.add_argument(
        "--restart-cost", type=float, default=30.0, help="default seconds a restart costs a job"
    )
    p.add_argument(
        "--node-timeout",
        type=float,
        default=60.0,
        help="seconds without a node report before its GPUs leave the pool (0: never)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="only recommend; never change a job's allocation"
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP (needs --token)")
    p.add_argument(
        "--token",
        default=os.environ.get("DLOADER_ALLOCATOR_TOKEN"),
        help="bearer token required on TCP (env: DLOADER_ALLOCATOR_TOKEN)",
    )
    p.add_argument("--tls-cert", help="TLS certificate (PEM) for TCP")
    p.add_argument("--tls-key", help="TLS private key (PEM) for TCP")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Runs the daemon until ``stop`` is set (or SIGTERM/SIGINT)."""
    stop = stop_on_signals(stop)
    store = Store(Path(args.state_dir) / "allocator.db")
    settings = Settings(args.policy, args.interval, args.dry_run, args.restart_cost)
    core = AllocatorCore(store, settings, node_timeout_s=args.node_timeout)
    server, addresses = await build_server(
        core,
        ListenConfig.from_args(args),
    )
    log.info(
        "dloader-allocator listening on %s; state in %s; policy %s%s; %d job(s), %d node(s)",
        ", ".join(addresses),
        args.state_dir,
        core.settings.policy,
        " (dry run)" if core.settings.dry_run else "",
        len(core.jobs),
        len(core.nodes),
    )
    task = asyncio.create_task(core.run(stop))
    await stop.wait()
    log.info("shutting down")
    await server.stop(grace=2.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    store.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloader-allocator``."""
    return run_daemon("dloader-allocator", serve, parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
