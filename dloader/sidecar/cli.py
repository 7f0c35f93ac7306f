"""``dloader-sidecar``: the node daemon."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path

from dloader._daemon import add_daemon_arguments, run_daemon, shut_down, stop_on_signals
from dloader._shared.cli import finite
from dloader.sidecar.allocator_link import AllocatorLink
from dloader.sidecar.cgroups import CgroupWeights, detect
from dloader.sidecar.config import (
    DEFAULT_WORKER_NICE,
    STORED_POLICY,
    SidecarDaemonConfig,
    default_budget,
    memory_size,
)
from dloader.sidecar.core import NodeCore
from dloader.sidecar.metrics import Metrics
from dloader.sidecar.monitors import GpuMonitor, NodeMonitor
from dloader.sidecar.node_policy import HEDGE_COST, POLICIES
from dloader.sidecar.server import build_server
from dloader.sidecar.store import SidecarStore
from dloader.v1 import node_pb2 as pb

__all__ = ["main", "parser", "serve"]

log = logging.getLogger("dloader.sidecar")
_NODE_RATES_S = 5.0  # the node CPU and disk rates GetNodeStatus and /metrics show: their window


def parser() -> argparse.ArgumentParser:
    cpus = len(os.sched_getaffinity(0))
    p = argparse.ArgumentParser(
        prog="dloader-sidecar",
        description="Per-node daemon that divides the node's data-loader resources (worker "
        "processes, CPU) between the training jobs on it, so that their accelerators wait for "
        "data as little as possible. Jobs connect with dloader.DataLoader(sidecar=...) or "
        "DLOADER_SIDECAR=unix:///path. Settings: a flag given here wins over its environment "
        "variable, which wins over a policy stored with 'dloaderctl policy set', which wins "
        "over the default.",
    )
    add_daemon_arguments(
        p, socket_name="sidecar.sock", state_file="sidecar.db", token_env="DLOADER_SIDECAR_TOKEN"
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="how to divide the node: adaptive (the sidecar's model chooses every job's "
        "worker count), guided (each loader's own tuner chooses its count, within a ceiling "
        "the sidecar sets from the node's worker and memory budgets), even (the worker budget "
        "split equally: a baseline) (default: the stored policy, else adaptive)",
    )
    p.add_argument(
        "--worker-budget",
        type=int,
        default=None,
        help="loader worker processes on the node, all jobs (default: stored, else from this "
        f"node's measured limits: {default_budget().describe().replace('%', '%%')})",
    )
    p.add_argument(
        "--cpu-budget",
        type=int,
        default=None,
        help=f"cores loader work may use, all jobs (default: stored, else {cpus})",
    )
    p.add_argument(
        "--period",
        type=finite,
        default=None,
        help="seconds between policy decisions (default: stored, else 2)",
    )
    p.add_argument(
        "--job-timeout",
        type=finite,
        default=60.0,
        help="seconds without a report after which a job is ended; its agent registers again "
        "if it comes back (0: never; default: %(default)s)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on 127.0.0.1:PORT (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics are served on (0.0.0.0 in a pod, for the scraper; "
        "default: %(default)s)",
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
        "--worker-nice",
        type=int,
        default=DEFAULT_WORKER_NICE,
        metavar="N",
        help="run every job's loader workers at nice N (1-19), so that each training process "
        "comes first for a core over all jobs' workers; 0: leave their priority alone "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--spare-workers",
        type=float,
        default=HEDGE_COST,
        metavar="X",
        help="adaptive: each I/O-bound job keeps the loader workers that would carry its "
        "throughput were its storage X times slower (they cost memory and thousandths of a "
        "core each; a slower storage then costs nothing before the model sees it); 1: none "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--allocator",
        metavar="TARGET",
        default=None,
        help="cluster allocator to join (unix:///path or host:port; default: "
        "$DLOADER_ALLOCATOR, else none)",
    )
    p.add_argument(
        "--allocator-token",
        default=None,
        help="bearer token for a TCP allocator (default: $DLOADER_ALLOCATOR_TOKEN)",
    )
    p.add_argument(
        "--node-id", default=None, help="this node's id for the allocator (default: host name)"
    )
    p.add_argument(
        "--memory-budget",
        type=memory_size,
        default=None,
        metavar="FRACTION|SIZE",
        help="memory the jobs' loader workers may hold together: a fraction of what the node "
        "could give them (available memory plus what they hold; default 0.5), or a size such "
        "as 16G. The policy never adds a worker past it.",
    )
    p.add_argument(
        "--node-host",
        default="",
        help="where other nodes reach this one (hostname or IP) for the rendezvous of jobs "
        "that span nodes (default: the node id)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs this node offers the allocator (default: the GPUs NVML sees)",
    )
    p.add_argument(
        "--cpu-pool",
        action="store_true",
        help="a CPU-only node: offer its --cpu-budget cores to the allocator's CPU pool, where "
        "jobs' remote loader workers run (through Ray; docs/remote.md), and no GPUs",
    )
    p.add_argument(
        "--lend-cores",
        action="store_true",
        help="a GPU node whose Ray node advertises dloader_node:<--node-id>: the allocator "
        "(goodput-dp-lend) may lend the --cpu-budget cores its own jobs do not need to other "
        "nodes' jobs, as their remote loader workers here (docs/remote.md)",
    )
    return p


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Runs the daemon until ``stop`` is set (or SIGTERM/SIGINT)."""
    stop = stop_on_signals(stop)
    store = SidecarStore(Path(args.state_dir) / "sidecar.db")
    try:
        config = SidecarDaemonConfig.resolve(args, store.get_setting(STORED_POLICY))
    except BaseException:
        store.close()
        raise
    settings = config.policy
    cgroup, cgroup_note = None, "off"
    if config.cgroup_weights:
        mount, cgroup_note = detect()
        if mount is None:
            log.warning("cgroup v2 CPU weights unavailable: %s", cgroup_note)
            cgroup_note = f"unavailable: {cgroup_note}"
        else:
            cgroup = CgroupWeights(mount)
    enforcement = (
        f"CPU sets: {'on' if config.pin_cpus else 'off'}; cgroup v2 cpu.weight: {cgroup_note}; "
        f"loader workers at nice {config.worker_nice}"
    )
    cpus = sorted(os.sched_getaffinity(0)) if config.pin_cpus else ()
    core = NodeCore(
        store,
        settings,
        pin_cpus=cpus,
        cgroup=cgroup,
        worker_nice=config.worker_nice,
        spare_workers=config.spare_workers,
        job_timeout_s=config.job_timeout_s,
    )
    node, gpus = NodeMonitor(), GpuMonitor()
    link = None
    if config.allocator is not None:
        link = AllocatorLink(
            core,
            config.allocator,
            node_id=config.node_id,
            gpus=0 if config.cpu_pool else config.gpus or len(gpus.read()),
            address=f"unix://{os.path.abspath(config.listen.socket or '')}",
            host=config.node_host,
            lends=config.lend_cores,
        )
    last = {"cpu": 0.0, "rd": 0.0, "wr": 0.0}

    def sum_normalized() -> float:
        total = 0.0
        for job in core.jobs.values():
            if job.model.observations and job.last_report:
                limit = job.model.accelerator_limit(job.record.batch_size)
                total += job.last_report.samples_per_second / limit if limit > 0 else 0.0
        return total

    if config.metrics_port:
        Metrics(core, lambda: last["cpu"], sum_normalized).serve(
            config.metrics_port, config.metrics_host
        )

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

    serving = await build_server(core, node_status, config.listen)
    log.info(
        "dloader-sidecar listening on %s; state in %s; policy %s",
        ", ".join(serving.addresses),
        config.state_dir,
        settings.name,
    )

    async def monitor() -> None:  # the node's CPU and disk rates, over _NODE_RATES_S
        while not stop.is_set():
            last["cpu"], last["rd"], last["wr"] = node.read()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=_NODE_RATES_S)

    tasks = [asyncio.create_task(core.run(stop)), asyncio.create_task(monitor())]
    if link is not None:
        tasks.append(asyncio.create_task(link.run(stop)))
    await stop.wait()
    log.info("shutting down")
    await shut_down(serving, tasks)
    for job in core.jobs.values():
        store.save_model(job.job_id, job.model.to_dict())
    store.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloader-sidecar``."""
    args = parser().parse_args(argv)
    return run_daemon("dloader-sidecar", serve, args, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
