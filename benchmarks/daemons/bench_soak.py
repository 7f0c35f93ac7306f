"""Soak: both daemons under a mixed load of honest and hostile clients for minutes.

A real ``dloader-sidecar`` and a real ``dloader-allocator`` (processes, Unix sockets, SQLite).
Honest clients: jobs that register with the sidecar, report and deregister, each cycle timed;
jobs submitted to the allocator, timed until the allocator gives them GPUs (decision latency),
then completed. Hostile clients, all the while: 16 KB ids, non-finite numbers, oversized and
over-long lists, wrong tokens, messages over the size cap, watch streams opened and dropped.
Every second the daemons' CPU, RSS, threads, file descriptors and state files are sampled,
and every 30 s each daemon writes its Python heap (``DLOADER_TRACEMALLOC``: bytes traced and
the largest allocation sites).

    python -m benchmarks.daemons.bench_soak                   # 3 minutes
    python -m benchmarks.daemons.bench_soak --seconds 3600    # the hour the docs report
    python -m benchmarks.daemons.bench_soak --seconds 30      # a quick look

For each daemon it reports the growth per hour of RSS, Python heap, threads, descriptors and
state file (a least-squares line through the samples after the first ``--window``), and the
allocation sites whose size grew the most between the first heap snapshot after warm-up and
the last: a leak grows steadily, a cache levels off.

An operator probe (the daemons' own user, on their sockets) calls each daemon twice a second
all the while: its p99 must stay under 1 s, whatever the hostile clients do. Prints a table per
window and a summary (the operator's p99; RSS, threads and descriptors at the end against the
first window after warm-up), and writes bench_soak.{json,png} into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.daemons import plots
from dloader.v1 import allocator_pb2 as apb
from dloader.v1 import allocator_pb2_grpc as apb_grpc
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

SCALING = apb.ScalingParams(
    alpha_c=0.05, beta_c=0.002, alpha_n=0.01, beta_n=1e-4, alpha_r=0.005, beta_r=5e-5, gamma=1.5
)


def start(module: str, folder: Path, *extra: str) -> tuple[subprocess.Popen[bytes], grpc.Channel]:
    sock = folder / "run" / "d.sock"
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            *("--socket", str(sock), "--state-dir", str(folder / "state")),
            *("--log-level", "WARNING", *extra),
        ],
        stderr=open(folder / "daemon.log", "w"),  # noqa: SIM115 - the daemon owns it
        env={**os.environ, "DLOADER_TRACEMALLOC": str(folder / "heap")},
    )
    channel = grpc.insecure_channel(f"unix://{sock}")
    grpc.channel_ready_future(channel).result(timeout=60)
    return proc, channel


class Recorder:
    """Timed events: (time since start, kind, seconds)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str, float]] = []
        self.lock = threading.Lock()
        self.hostile = 0
        self.codes: dict[str, int] = {}

    def timed(self, kind: str, fn: Callable[[], Any]) -> Any:
        began = time.monotonic()
        out = fn()
        with self.lock:
            self.events.append((began - self.t0, kind, time.monotonic() - began))
        return out


def operator(node: grpc.Channel, alloc: grpc.Channel, rec: Recorder, stop: threading.Event) -> None:
    """The operator's own calls, timed: they must be answered whatever the others do."""
    ns, al = pb_grpc.NodeServiceStub(node), apb_grpc.ClusterAllocatorStub(alloc)
    while not stop.wait(0.5):
        for kind, call in (
            ("operator sidecar", lambda: ns.GetNodeStatus(pb.GetNodeStatusRequest(), timeout=10)),
            (
                "operator allocator",
                lambda: al.GetAllocations(apb.GetAllocationsRequest(), timeout=10),
            ),
        ):
            try:
                rec.timed(kind, call)
            except grpc.RpcError as exc:  # counted as a miss: 10 s
                with rec.lock:
                    rec.events.append((time.monotonic() - rec.t0, kind, 10.0))
                    rec.codes[f"operator {exc.code().name}"] = (
                        rec.codes.get(f"operator {exc.code().name}", 0) + 1
                    )


def honest_sidecar(channel: grpc.Channel, rec: Recorder, stop: threading.Event, i: int) -> None:
    stub = pb_grpc.NodeServiceStub(channel)
    while not stop.is_set():
        req = pb.RegisterJobRequest(name=f"honest-{i}", pids=[os.getpid()], batch_size=32)
        job = rec.timed("sidecar register", lambda r=req: stub.RegisterJob(r, timeout=10))
        reports = [
            pb.JobReport(
                job_id=job.job_id,
                token=job.token,
                num_workers=2,
                batch_size=32,
                samples_per_second=300.0,
                idle_share=0.2,
                step_seconds=0.1,
                window_seconds=2.0,
            )
        ] * 3
        rec.timed("sidecar report", lambda rs=reports: stub.Report(iter(rs), timeout=10))
        done = pb.DeregisterJobRequest(job_id=job.job_id, token=job.token)
        rec.timed("sidecar deregister", lambda d=done: stub.DeregisterJob(d, timeout=10))
        stop.wait(0.5)


def honest_allocator(channel: grpc.Channel, rec: Recorder, stop: threading.Event, i: int) -> None:
    stub = apb_grpc.ClusterAllocatorStub(channel)
    n = 0
    while not stop.is_set():
        n += 1
        job_id = f"honest-{i}-{n}"
        spec = apb.JobSpec(job_id=job_id, batch_size=32, max_gpus=2, scaling=SCALING)
        began = time.monotonic()
        r = stub.SubmitJob(apb.SubmitJobRequest(job=spec), timeout=10)
        while not stop.is_set():
            got = {
                a.job_id: a for a in stub.GetAllocations(apb.GetAllocationsRequest()).allocations
            }
            if got.get(job_id) and got[job_id].gpus:
                with rec.lock:
                    rec.events.append(
                        (began - rec.t0, "allocator decision", time.monotonic() - began)
                    )
                break
            time.sleep(0.01)
        stub.CompleteJob(apb.CompleteJobRequest(job_id=job_id, token=r.token), timeout=10)
        stop.wait(1.0)


def hostile(node: grpc.Channel, alloc: grpc.Channel, rec: Recorder, stop: threading.Event) -> None:
    rng = random.Random(threading.get_ident())
    ns, al = pb_grpc.NodeServiceStub(node), apb_grpc.ClusterAllocatorStub(alloc)
    big = "x" * 16384
    attacks: list[Callable[[], Any]] = [
        lambda: ns.Explain(pb.ExplainRequest(job_id=big), timeout=5),
        lambda: ns.RegisterJob(
            pb.RegisterJobRequest(name="h", pids=list(range(2, 5000)), batch_size=8), timeout=5
        ),
        lambda: ns.RegisterJob(pb.RegisterJobRequest(name="a\nb", pids=[1], batch_size=8)),
        lambda: ns.Report(
            iter([pb.JobReport(job_id="nope", token="t\u00f6k", samples_per_second=float("nan"))]),
            timeout=5,
        ),
        lambda: ns.DeregisterJob(pb.DeregisterJobRequest(job_id=big, token=big), timeout=5),
        lambda: ns.ListJobs(pb.ListJobsRequest(), timeout=5),
        lambda: al.SubmitJob(
            apb.SubmitJobRequest(
                job=apb.JobSpec(
                    job_id=f"evil-{rng.random()}",
                    batch_size=32,
                    priority=1e308,
                    scaling=apb.ScalingParams(alpha_c=1e308, beta_c=1e308, gamma=1e308),
                )
            ),
            timeout=5,
        ),
        lambda: al.SubmitJob(
            apb.SubmitJobRequest(
                job=apb.JobSpec(
                    job_id="m",
                    batch_size=32,
                    measurements=[
                        apb.Measurement(nodes=1, replicas=1, local_batch_size=8, step_seconds=0.1)
                    ]
                    * 30_000,
                )
            ),
            timeout=5,
        ),
        lambda: al.CompleteJob(apb.CompleteJobRequest(job_id=big), timeout=5),
        lambda: al.RegisterNode(apb.RegisterNodeRequest(node_id=big, gpus=1 << 30), timeout=5),
        lambda: ns.Explain(pb.ExplainRequest(job_id="y" * (2 << 20)), timeout=5),  # > size cap
        lambda: list(
            __import__("itertools").islice(
                al.WatchAllocations(apb.WatchAllocationsRequest(), timeout=0.2), 1
            )
        ),
    ]
    while not stop.is_set():
        try:
            rng.choice(attacks)()
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        with rec.lock:
            rec.hostile += 1
            rec.codes[code] = rec.codes.get(code, 0) + 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=180.0, help="length of the soak")
    p.add_argument("--window", type=float, default=30.0, help="seconds per table row")
    p.add_argument("--honest", type=int, default=4, help="honest clients per daemon")
    p.add_argument("--hostile", type=int, default=4, help="hostile client threads")
    add_out_dir(p)
    args = p.parse_args(argv)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="dloader-soak-") as tmp:
        side, node = start("dloader.sidecar.cli", Path(tmp) / "s", "--period", "0.5")
        alloc_proc, alloc = start("dloader.allocator.cli", Path(tmp) / "a", "--interval", "5")
        apb_grpc.ClusterAllocatorStub(alloc).RegisterNode(
            apb.RegisterNodeRequest(node_id="soak-node", gpus=8)
        )
        rec, stop = Recorder(), threading.Event()

        def node_reports() -> None:  # as a sidecar's link does: a silent node leaves the pool
            stub = apb_grpc.ClusterAllocatorStub(alloc)
            while not stop.wait(5.0):
                with contextlib.suppress(grpc.RpcError):
                    stub.ReportNode(apb.ReportNodeRequest(node_id="soak-node", free_gpus=8))

        threads = [
            threading.Thread(target=honest_sidecar, args=(node, rec, stop, i), daemon=True)
            for i in range(args.honest)
        ] + [
            threading.Thread(target=honest_allocator, args=(alloc, rec, stop, i), daemon=True)
            for i in range(args.honest)
        ]
        threads += [
            threading.Thread(target=hostile, args=(node, alloc, rec, stop), daemon=True)
            for _ in range(args.hostile)
        ]
        threads.append(threading.Thread(target=node_reports, daemon=True))
        threads.append(
            threading.Thread(target=operator, args=(node, alloc, rec, stop), daemon=True)
        )
        for t in threads:
            t.start()
        procs = {"sidecar": psutil.Process(side.pid), "allocator": psutil.Process(alloc_proc.pid)}
        for pr in procs.values():
            pr.cpu_percent()
        samples: list[dict[str, float]] = []
        while time.monotonic() - rec.t0 < args.seconds:
            time.sleep(1.0)
            row: dict[str, float] = {"t": time.monotonic() - rec.t0}
            for name, pr in procs.items():
                with pr.oneshot():
                    row[f"{name} cpu %"] = pr.cpu_percent()
                    row[f"{name} rss MB"] = pr.memory_info().rss / 2**20
                    row[f"{name} threads"] = pr.num_threads()
                    row[f"{name} fds"] = pr.num_fds()
                state = Path(tmp) / name[0] / "state"
                row[f"{name} state MB"] = sum(f.stat().st_size for f in state.glob("*.db*")) / 2**20
            samples.append(row)
            print(
                f"\r{row['t']:5.0f} s  hostile requests {rec.hostile:,}  "
                f"sidecar {row['sidecar cpu %']:.0f}% {row['sidecar rss MB']:.0f} MB  "
                f"allocator {row['allocator cpu %']:.0f}% {row['allocator rss MB']:.0f} MB",
                end="",
                flush=True,
                file=sys.stderr,
            )
        stop.set()
        for t in threads:
            t.join(15)
        heaps = {name: _heap(Path(tmp) / name[0] / "heap") for name in procs}
        for proc in (side, alloc_proc):
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
        print(file=sys.stderr)

    windows = []
    kinds = ["sidecar register", "sidecar report", "allocator decision"]
    w = 0.0
    while w < args.seconds - 1e-9:
        row: list[Any] = [f"{w:.0f}-{min(w + args.window, args.seconds):.0f}"]
        for kind in kinds:
            xs = [d for t, k, d in rec.events if k == kind and w <= t < w + args.window]
            row += [np.percentile(xs, 50) * 1e3 if xs else float("nan")]
            row += [np.percentile(xs, 99) * 1e3 if xs else float("nan")]
        ss = [s for s in samples if w <= s["t"] < w + args.window]
        for name in ("sidecar", "allocator"):
            row += [
                float(np.mean([s[f"{name} cpu %"] for s in ss])) if ss else float("nan"),
                max((s[f"{name} rss MB"] for s in ss), default=float("nan")),
                int(max((s[f"{name} fds"] for s in ss), default=0)),
            ]
        windows.append(row)
        w += args.window
    headers = [
        "window s",
        "register p50 ms",
        "register p99 ms",
        "report p50 ms",
        "report p99 ms",
        "decision p50 ms",
        "decision p99 ms",
        "sidecar CPU %",
        "sidecar RSS MB",
        "sidecar fds",
        "allocator CPU %",
        "allocator RSS MB",
        "allocator fds",
    ]
    print(table(headers, windows))
    print(f"hostile requests: {rec.hostile:,}; status codes: {dict(sorted(rec.codes.items()))}")
    honest = {k: sum(1 for e in rec.events if e[1] == k) for k in kinds}
    print(f"honest operations: {honest}")
    summary = _summary(rec, samples, args.window)
    print(table(["measure", *summary["columns"]], summary["rows"]))
    growth = _growth(samples, heaps, args.window)
    print(table(["growth per hour", "sidecar", "allocator"], growth["rows"]))
    for name in procs:
        print(f"\n{name}: the allocation sites that grew most (first heap after warm-up -> last)")
        print(table(["site", "KiB then", "KiB at the end", "growth KiB"], growth[name]["sites"]))
    outs = outputs(args.out_dir)
    outs("bench_soak.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "headers": headers,
                "windows": windows,
                "hostile": rec.hostile,
                "codes": rec.codes,
                "honest": honest,
                "summary": summary,
                "growth": growth,
                "samples": samples,
            },
            indent=1,
        )
    )
    plots.soak(rec.events, samples, outs("bench_soak.png"))
    return 0


def _heap(folder: Path) -> list[dict[str, Any]]:
    """A daemon's heap snapshots (``DLOADER_TRACEMALLOC``), oldest first."""
    lines = []
    for path in folder.glob("*.jsonl"):
        lines += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return sorted(lines, key=lambda h: h["t"])


def _per_hour(ts: list[float], ys: list[float]) -> float:
    """The slope of the least-squares line through the points, per hour (0 for < 2 points)."""
    if len(ts) < 2 or max(ts) == min(ts):
        return 0.0
    return float(np.polyfit(ts, ys, 1)[0]) * 3600


def _growth(
    samples: list[dict[str, float]], heaps: dict[str, list[dict[str, Any]]], warmup: float
) -> dict[str, Any]:
    """Per daemon: growth per hour of RSS, Python heap, threads, descriptors and state file
    after warm-up, with the values at its start and end; and the allocation sites that grew
    most between the first heap snapshot after warm-up and the last."""
    steady = [s for s in samples if s["t"] >= warmup] or samples
    out: dict[str, Any] = {"rows": []}
    measures = (("RSS MB", "rss MB"), ("threads", "threads"), ("fds", "fds"))
    measures += (("state file MB", "state MB"),)
    values: dict[str, dict[str, str]] = {}
    for name in ("sidecar", "allocator"):
        mine: dict[str, Any] = {}
        for label, key in measures:
            ys = [s[f"{name} {key}"] for s in steady]
            rate = _per_hour([s["t"] for s in steady], ys)
            mine[label] = {
                "per_hour": rate,
                "start": ys[0] if ys else 0,
                "end": ys[-1] if ys else 0,
            }
        heap = [h for h in heaps.get(name, []) if h["t"] >= warmup] or heaps.get(name, [])
        traced = [h["traced"] / 2**20 for h in heap]
        mine["Python heap MB"] = {
            "per_hour": _per_hour([h["t"] for h in heap], traced),
            "start": traced[0] if traced else float("nan"),
            "end": traced[-1] if traced else float("nan"),
        }
        sites: list[list[Any]] = []
        if len(heap) >= 2:
            first = {s[0]: s[1] for s in heap[0]["top"]}
            last = {s[0]: s[1] for s in heap[-1]["top"]}
            grown = sorted(last, key=lambda k: last[k] - first.get(k, 0), reverse=True)[:5]
            sites = [
                [k, first.get(k, 0) / 1024, last[k] / 1024, (last[k] - first.get(k, 0)) / 1024]
                for k in grown
            ]
        mine["sites"] = sites
        out[name] = mine
        values[name] = {
            label: f"{m['per_hour']:+,.1f} ({m['start']:,.1f} -> {m['end']:,.1f})"
            for label, m in mine.items()
            if label != "sites"
        }
    for label in (*(m[0] for m in measures), "Python heap MB"):
        out["rows"].append([label, values["sidecar"][label], values["allocator"][label]])
    return out


def _summary(rec: Recorder, samples: list[dict[str, float]], warmup: float) -> dict[str, Any]:
    """Per daemon: the operator's p99 and most-missed call; RSS, threads and fds, the most in
    the first window after warm-up against the most in the last 30 s (flat: a leak grows)."""
    early = [s for s in samples if warmup <= s["t"] < 2 * warmup] or samples[:30]
    late = [s for s in samples if s["t"] >= samples[-1]["t"] - 30] if samples else []
    rows = []
    out: dict[str, Any] = {"columns": ["sidecar", "allocator"], "rows": rows}
    for name in ("sidecar", "allocator"):
        xs = [d for _, k, d in rec.events if k == f"operator {name}"]
        out[name] = {
            "operator_calls": len(xs),
            "operator_p99_ms": float(np.percentile(xs, 99) * 1e3) if xs else float("nan"),
            "operator_max_ms": max(xs, default=float("nan")) * 1e3,
        }
        for what in ("rss MB", "threads", "fds"):
            key = f"{name} {what}"
            out[name][f"{what} early"] = max((s[key] for s in early), default=float("nan"))
            out[name][f"{what} late"] = max((s[key] for s in late), default=float("nan"))
    for label, key in (
        ("operator calls", "operator_calls"),
        ("operator p99 ms", "operator_p99_ms"),
        ("operator max ms", "operator_max_ms"),
        ("RSS MB first window -> last 30 s", "rss MB"),
        ("threads first window -> last 30 s", "threads"),
        ("fds first window -> last 30 s", "fds"),
    ):
        if key in ("rss MB", "threads", "fds"):
            rows.append(
                [
                    label,
                    *(
                        f"{out[n][key + ' early']:.0f} -> {out[n][key + ' late']:.0f}"
                        for n in ("sidecar", "allocator")
                    ),
                ]
            )
        else:
            rows.append([label, *(f"{out[n][key]:,.0f}" for n in ("sidecar", "allocator"))])
    return out


if __name__ == "__main__":
    sys.exit(main())
