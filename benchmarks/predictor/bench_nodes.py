"""The scaling model across nodes (#48 §2): its step-time error per application and node count,
the parametric model (Pollux's) against the one corrected per node count measured
(``ScalingModel.fit(..., node_factors=True)``, what ``goodput-dp`` decides on).

Held out: every placement of ``placements.csv`` (1-4 nodes) and every (nodes, GPUs) group of
``scalability.csv`` (6-16 nodes) is predicted by a model fitted to all the *other* points of
its application, so a correction is judged on placements it did not see (a 2-node placement
is corrected from the other 2-node ones). Per cell: the median signed error of predicted step
time (negative: the model predicts steps too short, i.e. throughput too high) and the median
absolute error, over the held-out points at that node count.

    python -m benchmarks.predictor.bench_nodes          # ~1 min

Prints the table, writes ``bench_nodes.json`` and ``bench_nodes.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.predictor import plots
from dloader.allocator.traces import PACKAGED_TRACES
from dloader.predictor import ScalingModel, ScalingPoint
from dloader.predictor.pollux import APPLICATIONS, read_placements, read_scalability

NODES = (1, 2, 4, 8)
"""The node counts in the table (every count measured is in the JSON and the plot)."""


def held_out(groups: dict[str, list[ScalingPoint]], node_factors: bool) -> dict[int, list[float]]:
    """Per node count: the signed relative step-time errors of each group predicted by a model
    fitted to the other groups."""
    errors: dict[int, list[float]] = defaultdict(list)
    for name, points in groups.items():
        rest = [p for other, ps in groups.items() if other != name for p in ps]
        model = ScalingModel.fit(rest, node_factors=node_factors)
        for p in points:
            errors[p.nodes].append(
                model.step_time(p.nodes, p.replicas, p.local_bsz) / p.step_time - 1
            )
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.predictor.bench_nodes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--apps",
        default=",".join(APPLICATIONS),
        help=f"applications, comma-separated (default: all: {','.join(APPLICATIONS)})",
    )
    add_out_dir(p)
    args = p.parse_args(argv)
    apps = [a for a in args.apps.split(",") if a]
    unknown = sorted(set(apps) - set(APPLICATIONS))
    if not apps or unknown:
        p.error(f"--apps={args.apps!r}: expected some of {','.join(APPLICATIONS)}")
    out = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    results: dict[str, Any] = {}
    rows = []
    for app in apps:
        groups: dict[str, list[ScalingPoint]] = defaultdict(list)
        for name, point in read_placements(PACKAGED_TRACES / app):
            groups[name].append(point)
        for point in read_scalability(PACKAGED_TRACES / app):
            groups[f"{point.nodes}x{point.replicas}"].append(point)
        results[app] = {}
        for label, corrected in (("parametric", False), ("per-node", True)):
            errors = held_out(groups, corrected)
            results[app][label] = {str(n): e for n, e in sorted(errors.items())}
            cells = [
                f"{100 * np.median(e):+.0f}% / {100 * np.median(np.abs(e)):.0f}%" if e else "-"
                for e in (errors.get(n) for n in NODES)
            ]
            rows.append([app, label, *cells])
        print(f"  {app}: {len(groups)} groups held out in turn", file=sys.stderr, flush=True)
    print(
        "\nHeld-out step-time error by node count: median signed / median absolute "
        "(negative: throughput over-predicted); 8 nodes from scalability.csv\n"
    )
    print(table(["application", "model", *(f"{n} node{'s' * (n > 1)}" for n in NODES)], rows))
    out("bench_nodes.json").write_text(json.dumps({"machine": machine(), "errors": results}))
    png = plots.node_errors(results, out("bench_nodes.png"))
    print(f"\nwrote {out('bench_nodes.json')} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
