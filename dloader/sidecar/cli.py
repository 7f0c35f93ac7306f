"""``dloader-sidecar``: the node daemon."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from dloader.sidecar._config import default_socket, default_state_dir
from dloader.sidecar.allocator_link import AllocatorLink
from dloader.sidecar.cgroups import CgroupWeights, detect
from dloader.sidecar.core import NodeCore, PolicySettings
from dloader.sidecar.errors import SidecarError
from dloader.sidecar.metrics import Metrics
from dloader.sidecar.monitors import GpuMonitor, NodeMonitor
from dloader.sidecar.server import ListenConfig, build_server
from dloader.sidecar.store import Store
from dloader.v1 import node_pb2 as pb

__all__ = ["main", "run_daemon", "serve", "stop_on_signals"]

log = logging.getLogger("dloader.sidecar")


def parser() -> argparse.ArgumentParser:
    cpus = len(os.sched_getaffinity(0))
    p = argparse.ArgumentParser(
        prog="dloader-sidecar",
        description="Per-node daemon that divides the node's data-loader resources (worker "
        "processes, CPU) between the training jobs on it, so that their accelerators wait for "
        "data as little as possible. Jobs connect with dloader.DataLoader(sidecar=...) or "
        "DLOADER_SIDECAR=unix:///path.",
    )
    p.add_argument(
        "--socket",
        default=default_socket(),
        help="Unix socket to listen on, mode 0660 (default: %(default)s)",
    )
    p.add_argument(
        "--state-dir",
        default=default_state_dir(),
        help="folder for the SQLite state (default: %(default)s)",
    )
    p.add_argument(
        "--policy",
        choices=["adaptive", "even"],
        default="adaptive",
        help="how to divide the node (default: %(default)s)",
    )
    p.add_argument(
        "--worker-budget",
        type=int,
        default=8 * cpus,
        help="loader worker processes on the node, all jobs (default: %(default)s)",
    )
    p.add_argument(
        "--cpu-budget",
        type=int,
        default=cpus,
        help="cores loader work may use, all jobs (default: %(default)s)",
    )
    p.add_argument(
        "--period",
        type=float,
        default=2.0,
        help="seconds between policy decisions (default: %(default)s)",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", default=None, help="also listen on TCP (needs --token)"
    )
    p.add_argument(
        "--token",
        default=os.environ.get("DLOADER_SIDECAR_TOKEN"),
        help="bearer token required on TCP (default: $DLOADER_SIDECAR_TOKEN)",
    )
    p.add_argument("--tls-cert", default=None, help="TLS certificate (PEM) for TCP")
    p.add_argument("--tls-key", default=None, help="TLS private key (PEM) for TCP")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on 127.0.0.1:PORT (default: off)",
    )
    p.add_argument(
        "--pin-cpus",
        action="store_true",
        help="pin each job's loader workers to its own CPU set, sized by its CPU share "
        "(needs at least one CPU per job)",
    )
    p.add_argument(
        "--cgroup-weights",
        action="store_true",
        help="set each job's cgroup v2 cpu.weight from its CPU share (needs cgroup v2 with the "
        "cpu controller and write access; says so otherwise)",
    )
    p.add_argument(
        "--allocator",
        metavar="TARGET",
        default=os.environ.get("DLOADER_ALLOCATOR"),
        help="cluster allocator to join (unix:///path or host:port; default: "
        "$DLOADER_ALLOCATOR, else none)",
    )
    p.add_argument(
        "--allocator-token",
        default=os.environ.get("DLOADER_ALLOCATOR_TOKEN"),
        help="bearer token for a TCP allocator (default: $DLOADER_ALLOCATOR_TOKEN)",
    )
    p.add_argument(
        "--node-id", default=socket.gethostname(), help="this node's id for the allocator"
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs this node offers the allocator (default: the GPUs NVML sees)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="(default: %(default)s)",
    )
    return p


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Runs the daemon until ``stop`` is set (or SIGTERM/SIGINT)."""
    stop = stop_on_signals(stop)
    store = Store(Path(args.state_dir) / "sidecar.db")
    settings = PolicySettings(args.policy, args.worker_budget, args.cpu_budget, args.period)
    cgroup, cgroup_note = None, "off"
    if args.cgroup_weights:
        mount, cgroup_note = detect()
        if mount is None:
            log.warning("cgroup v2 CPU weights unavailable: %s", cgroup_note)
            cgroup_note = f"unavailable: {cgroup_note}"
        else:
            cgroup = CgroupWeights(mount)
    enforcement = (
        f"CPU sets: {'on' if args.pin_cpus else 'off'}; cgroup v2 cpu.weight: {cgroup_note}"
    )
    core = NodeCore(store, settings, pin_cpus=args.pin_cpus, cgroup=cgroup)
    node, gpus = NodeMonitor(), GpuMonitor()
    metrics = Metrics()
    link = None
    if args.allocator:
        link = AllocatorLink(
            core,
            args.allocator,
            node_id=args.node_id,
            gpus=args.gpus or len(gpus.read()),
            address=f"unix://{os.path.abspath(args.socket)}",
            token=args.allocator_token,
        )
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    last = {"cpu": 0.0, "rd": 0.0, "wr": 0.0}

    def sum_normalized() -> float:
        total = 0.0
        for job in core.jobs.values():
            if job.model.observations and job.last_report:
                limit = job.model.accelerator_limit(job.record.batch_size)
                total += job.last_report["samples_per_second"] / limit if limit > 0 else 0.0
        return total

    def node_status() -> pb.NodeStatus:
        return pb.NodeStatus(
            hostname=node.hostname,
            cpu_count=node.cpu_count,
            cpu_percent=last["cpu"],
            disk_read_bytes_per_second=int(last["rd"]),
            disk_write_bytes_per_second=int(last["wr"]),
            nvml_available=gpus.available,
            nvml_message=gpus.message,
            cpu_enforcement=enforcement,
            gpus=[
                pb.GpuStatus(
                    index=g.index,
                    name=g.name,
                    utilization=g.utilization,
                    memory_used_bytes=g.memory_used,
                    memory_total_bytes=g.memory_total,
                )
                for g in gpus.read()
            ],
            jobs=len(core.jobs),
            policy=core.settings.name,
            sum_normalized_throughput=sum_normalized(),
        )

    server, addresses = await build_server(
        core,
        node_status,
        ListenConfig.from_args(args),
    )
    log.info(
        "dloader-sidecar listening on %s; state in %s; policy %s",
        ", ".join(addresses),
        args.state_dir,
        settings.name,
    )

    async def monitor() -> None:
        while not stop.is_set():
            last["cpu"], last["rd"], last["wr"] = node.read()
            metrics.update(core, last["cpu"], sum_normalized())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    tasks = [asyncio.create_task(core.run(stop)), asyncio.create_task(monitor())]
    if link is not None:
        tasks.append(asyncio.create_task(link.run(stop)))
    await stop.wait()
    log.info("shutting down")
    await server.stop(grace=2.0)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for job in core.jobs.values():
        store.save_model(job.job_id, job.model.to_dict())
    store.close()


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """``stop`` (or a new event), set on SIGTERM or SIGINT; call from the running loop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run_daemon(
    prog: str,
    serve_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
    args: argparse.Namespace,
) -> int:
    """Runs a daemon's ``serve`` with logging set up; a bad setting exits 2 with its message."""
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(serve_fn(args))
    except (ValueError, SidecarError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloader-sidecar``."""
    return run_daemon("dloader-sidecar", serve, parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
