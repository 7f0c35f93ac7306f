"""``dloaderctl``: look at and steer a node's sidecar."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dloader._shared import env
from dloader._shared.cli import finite
from dloader._shared.client import Endpoint, serving_status
from dloader.sidecar.config import memory_size
from dloader.sidecar.node_policy import POLICIES
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

__all__ = ["main"]


def _stub(args: argparse.Namespace) -> tuple[pb_grpc.NodeServiceStub, tuple[tuple[str, str], ...]]:
    endpoint = Endpoint.of(
        args.target or f"unix://{args.socket}", args.token or env.sidecar_token(), args.tls_ca
    )
    return pb_grpc.NodeServiceStub(endpoint.channel()), endpoint.metadata


def jobs_table(jobs: list[pb.JobStatus], title: str = "jobs") -> Table:
    """The jobs as a rich table."""
    t = Table(title=title)
    for col in (
        "job",
        "name",
        "workers",
        "batch",
        "samples/s",
        "limit",
        "of limit",
        "idle",
        "CPU %",
        "RSS MB",
        "done",
        "last report",
        "why",
    ):
        t.add_column(
            col, justify="left" if col in ("job", "name", "why") else "right", no_wrap=col != "why"
        )
    for j in jobs:
        share = f"{j.samples_per_second / j.accelerator_limit:.0%}" if j.accelerator_limit else "?"
        t.add_row(
            j.job_id,
            j.name,
            str(j.num_workers),
            str(j.batch_size),
            f"{j.samples_per_second:,.0f}",
            f"{j.accelerator_limit:,.0f}" if j.accelerator_limit else "?",
            share,
            f"{j.idle_share:.0%}",
            f"{j.cpu_percent:.0f}",
            f"{j.rss_bytes / 2**20:,.0f}",
            f"{j.done:.0%}" if j.done else "-",
            f"{j.last_report_age_seconds:.0f}s ago",
            j.directive.reason,
        )
    return t


def cmd_jobs(args: argparse.Namespace, console: Console) -> int:
    stub, md = _stub(args)
    resp = stub.ListJobs(pb.ListJobsRequest(), timeout=args.timeout, metadata=md)
    if args.json:
        print(
            json.dumps(
                [MessageToDict(j, preserving_proto_field_name=True) for j in resp.jobs], indent=2
            )
        )
    elif not resp.jobs:
        console.print("no jobs registered")
    else:
        console.print(jobs_table(list(resp.jobs)))
    return 0


def cmd_top(args: argparse.Namespace, console: Console) -> int:
    stub, md = _stub(args)

    def render() -> Table:
        status = stub.GetNodeStatus(pb.GetNodeStatusRequest(), timeout=args.timeout, metadata=md)
        jobs = stub.ListJobs(pb.ListJobsRequest(), timeout=args.timeout, metadata=md).jobs
        title = (
            f"{status.hostname}: {status.jobs} jobs, policy {status.policy}, node CPU "
            f"{status.cpu_percent:.0f}% of {status.cpu_count * 100}, sum of throughput/limit "
            f"{status.sum_normalized_throughput:.2f}"
            + ("" if status.nvml_available else " (no NVML)")
        )
        return jobs_table(list(jobs), title)

    end = time.monotonic() + args.duration if args.duration else None
    with Live(render(), console=console, refresh_per_second=4, screen=False) as live:
        try:
            while end is None or time.monotonic() < end:
                time.sleep(args.interval)
                live.update(render())
        except KeyboardInterrupt:
            pass
    return 0


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    stub, md = _stub(args)
    s = stub.GetNodeStatus(pb.GetNodeStatusRequest(), timeout=args.timeout, metadata=md)
    print(json.dumps(MessageToDict(s, preserving_proto_field_name=True), indent=2))
    return 0


def cmd_health(args: argparse.Namespace, console: Console) -> int:
    """gRPC health of the daemon at the socket or target (the sidecar's or the allocator's):
    exit 0 when it is SERVING; for container health checks and Kubernetes exec probes."""
    endpoint = Endpoint.of(
        args.target or f"unix://{args.socket}", args.token or env.sidecar_token(), args.tls_ca
    )
    name = serving_status(endpoint, args.timeout)
    print(name)
    return 0 if name == "SERVING" else 1


def cmd_end(args: argparse.Namespace, console: Console) -> int:
    """Ends jobs by id or name prefix (operators; e.g. a Slurm Epilog after a job)."""
    stub, md = _stub(args)
    jobs = stub.ListJobs(pb.ListJobsRequest(), timeout=args.timeout, metadata=md).jobs
    chosen = [
        j
        for j in jobs
        if j.job_id in args.job or (args.name_prefix and j.name.startswith(args.name_prefix))
    ]
    for j in chosen:
        stub.DeregisterJob(
            pb.DeregisterJobRequest(job_id=j.job_id), timeout=args.timeout, metadata=md
        )
        print(f"ended {j.job_id} ({j.name})")
    return 0


def cmd_policy(args: argparse.Namespace, console: Console) -> int:
    stub, md = _stub(args)
    if args.action == "get":
        p = stub.GetPolicy(pb.GetPolicyRequest(), timeout=args.timeout, metadata=md)
    else:
        if args.name is None:
            print("dloaderctl policy set: give a policy name (adaptive or even)", file=sys.stderr)
            return 2
        p = stub.SetPolicy(
            pb.SetPolicyRequest(
                config=pb.PolicyConfig(
                    name=args.name,
                    worker_budget=args.worker_budget or 0,
                    cpu_budget=args.cpu_budget or 0,
                    period_seconds=args.period or 0.0,
                    memory_budget=args.memory_budget or 0.0,
                )
            ),
            timeout=args.timeout,
            metadata=md,
        )
    print(json.dumps(MessageToDict(p, preserving_proto_field_name=True), indent=2))
    return 0


def cmd_explain(args: argparse.Namespace, console: Console) -> int:
    stub, md = _stub(args)
    e = stub.Explain(pb.ExplainRequest(job_id=args.job), timeout=args.timeout, metadata=md)
    console.print(f"[bold]{e.job_id}[/] under policy [bold]{e.policy}[/]: {e.reason}")
    if e.memory_budget_bytes:
        mib = 2**20
        console.print(
            f"memory: {e.worker_memory_bytes / mib:,.0f} MiB per worker; all jobs' workers hold "
            f"{e.memory_used_bytes / mib:,.0f} of a {e.memory_budget_bytes / mib:,.0f} MiB budget"
            + (" - [bold]memory, not CPU, limits this job[/]" if e.memory_limited else "")
        )
    if e.candidates:
        t = Table(
            title=f"predictions per candidate (accelerator limit "
            f"{e.accelerator_limit:,.0f} samples/s)"
        )
        for col in ("workers", "predicted samples/s", "± (rel.)", "of limit", "chosen"):
            t.add_column(col, justify="right")
        for c in e.candidates:
            t.add_row(
                str(c.num_workers),
                f"{c.predicted_samples_per_second:,.0f}",
                f"{c.relative_std:.0%}",
                f"{c.normalized:.0%}",
                "<-" if c.chosen else "",
            )
        console.print(t)
    return 0


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    """A table of what works on this node and what to fix; exit 1 if a check failed."""
    from dloader.sidecar import doctor

    if not args.json:
        console.print(
            f"checking this node (a real loader runs for {args.seconds:g} s)..."
            if args.seconds
            else "checking this node..."
        )
    rows = doctor.checks(args.socket, args.seconds, args.workers)
    if args.json:
        print(doctor.as_json(rows))
    else:
        table = Table(title="dloader doctor")
        for column in ("check", "status", "found", "what to do"):
            table.add_column(column, overflow="fold")
        style = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
        for r in rows:
            table.add_row(r.name, f"[{style[r.status]}]{r.status}[/]", r.found, r.fix)
        console.print(table)
    return 1 if any(r.status == "fail" for r in rows) else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dloaderctl", description="Look at and steer the node's dloader sidecar."
    )
    p.add_argument(
        "--socket",
        default=env.default_socket(),
        help="the sidecar's Unix socket (default: %(default)s)",
    )
    p.add_argument("--target", default=None, help="host:port instead of the socket (TCP)")
    p.add_argument(
        "--token", default=None, help="bearer token for TCP (default: $DLOADER_SIDECAR_TOKEN)"
    )
    p.add_argument(
        "--tls-ca",
        default=None,
        help="CA certificate (PEM) for TLS on TCP (default: $DLOADER_TLS_CA)",
    )
    p.add_argument("--timeout", type=finite, default=5.0, help="RPC timeout, seconds")
    sub = p.add_subparsers(dest="command", required=True)
    j = sub.add_parser("jobs", help="the registered jobs")
    j.add_argument("--json", action="store_true", help="machine-readable output")
    t = sub.add_parser("top", help="a live view of the jobs")
    t.add_argument("--interval", type=finite, default=1.0, help="refresh every N seconds")
    t.add_argument("--duration", type=finite, default=0.0, help="stop after N seconds (0: never)")
    sub.add_parser("status", help="the node: CPU, disk, GPUs, policy")
    sub.add_parser(
        "health",
        help="gRPC health of the daemon on --socket/--target (sidecar or allocator): exit 0 "
        "when SERVING (for container health checks and probes)",
    )
    pol = sub.add_parser("policy", help="get or set the node policy")
    pol.add_argument("action", choices=["get", "set"])
    pol.add_argument("name", nargs="?", choices=POLICIES)
    pol.add_argument("--worker-budget", type=int, default=None)
    pol.add_argument("--cpu-budget", type=int, default=None)
    pol.add_argument("--period", type=finite, default=None)
    pol.add_argument(
        "--memory-budget",
        type=memory_size,
        default=None,
        help="a fraction of available memory (0.5) or a size (16G)",
    )
    end = sub.add_parser("end", help="end jobs now, by id or name prefix (operators)")
    end.add_argument("job", nargs="*", help="job ids")
    end.add_argument("--name-prefix", default="", help="end every job whose name starts so")
    e = sub.add_parser("explain", help="why a job's last allocation was chosen")
    e.add_argument("job", help="job id (see `dloaderctl jobs`)")
    d = sub.add_parser(
        "doctor",
        help="check this node before trusting dloader on it: NVML, cgroups, the sidecar's "
        "socket, a real loader against the GPU; exit 1 if something failed",
    )
    d.add_argument(
        "--seconds",
        type=finite,
        default=20.0,
        help="how long the real loader trains (0: skip it; default %(default)s)",
    )
    d.add_argument("--workers", type=int, default=4, help="its loader workers (default 4)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloaderctl``."""
    args = parser().parse_args(argv)
    if args.command == "doctor" and not (0 <= args.seconds <= 600 and 0 <= args.workers <= 64):
        print(
            f"dloaderctl doctor: --seconds {args.seconds} and --workers {args.workers}: expected "
            "0-600 seconds and 0-64 workers",
            file=sys.stderr,
        )
        return 2
    console = Console()
    commands: dict[str, Any] = {
        "jobs": cmd_jobs,
        "top": cmd_top,
        "status": cmd_status,
        "health": cmd_health,
        "end": cmd_end,
        "policy": cmd_policy,
        "explain": cmd_explain,
        "doctor": cmd_doctor,
    }
    try:
        return int(commands[args.command](args, console))
    except ValueError as exc:  # a bad --target, --tls-ca, ...
        print(f"dloaderctl: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(
            f"dloaderctl: {exc.code().name}: {exc.details()} (sidecar at "
            f"{args.target or args.socket})",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
