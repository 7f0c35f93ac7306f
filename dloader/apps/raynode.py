"""A GPU node's Ray node for the cores it lends to other nodes' jobs (``goodput-dp-lend``, the
allocator's default).

A node whose sidecar runs with ``--lend-cores`` may be told to lend its spare cores; the jobs
that borrow them start remote loader workers placed on it through the Ray resource
``dloader_node:<node id>`` (:func:`dloader._engine.remote.node_resource`), one unit a core. This
starts that Ray node, joined to the cluster's head, advertising the resource under the id the
node's sidecar registers with (its ``--node-id``, by default the host name, as here)::

    dloader-ray-node --address ray-head:6379 --cpus 16
    # runs: ray start --block --address ray-head:6379 --num-cpus 16 --num-gpus 0
    #           --resources '{"dloader_node:gpu-7": 16}'

Run it from the **training environment** (its ``ray``, found beside this Python first): the
lent workers run the borrowing jobs' datasets, so that environment must import what they
import. Ray starts its workers at ``RAY_worker_niceness`` (15 unless set here), below the node's
training processes and its own loader workers (the sidecar's at 10). ``--dry-run`` prints the
command. ``deploy/systemd/dloader-ray-node.service`` and ``deploy/kubernetes/overlays/lend``
run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from dloader._engine.remote import node_resource
from dloader._shared.allocator_messages import check_id
from dloader._shared.cli import number
from dloader._shared.node_messages import MAX_NICE
from dloader.errors import InvalidArgument
from dloader.sidecar.config import DEFAULT_WORKER_NICE

__all__ = ["command", "main"]

MIN_NICENESS = DEFAULT_WORKER_NICE
"""Lent workers below this nice value would compete with the node's own loader workers (the
sidecar's ``--worker-nice``) and come closer to its training processes (0)."""


def command(
    ray: str, address: str, cpus: int, node_id: str, extra: Sequence[str] = ()
) -> list[str]:
    """The ``ray start`` command line of a node lending ``cpus`` cores as ``node_id``."""
    return [
        ray,
        "start",
        "--block",
        "--address",
        address,
        "--num-cpus",
        str(cpus),
        "--num-gpus",
        "0",
        "--resources",
        json.dumps({node_resource(node_id): cpus}),
        *extra,
    ]


#: ``--cpus``: whole cores, at least one.
_CPUS = number(1, 65536, integer=True)
_NICE = number(MIN_NICENESS, MAX_NICE, integer=True)


def _niceness(text: str) -> int:
    try:
        return int(_NICE(text))
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"(or $RAY_worker_niceness) {e} (below {MIN_NICENESS} lent workers would compete "
            "with this node's own loader workers)"
        ) from None


def _ray() -> str | None:
    """``ray`` beside this Python (its environment's), else on ``PATH``."""
    return shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dloader-ray-node",
        description="Start this GPU node's Ray node for the cores it lends to other nodes' "
        "jobs' loaders (the node's sidecar runs with --lend-cores). Run it from the training "
        "environment: the lent workers run the borrowing jobs' datasets.",
        epilog="Arguments after -- go to `ray start` as they are.",
    )
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", ""),
        help="the Ray cluster's head, host:port (default: $RAY_ADDRESS)",
    )
    p.add_argument(
        "--cpus",
        type=_CPUS,
        required=True,
        help="cores this node may lend at most (its sidecar's --cpu-budget is the usual value)",
    )
    p.add_argument(
        "--node-id",
        default=None,
        help="this node's id, as its sidecar registers it (default: the host name, as the "
        "sidecar's --node-id)",
    )
    p.add_argument(
        "--niceness",
        type=_niceness,
        default=os.environ.get("RAY_worker_niceness") or "15",  # noqa: SIM112 (Ray's name)
        help="nice value of the lent workers (default: $RAY_worker_niceness, else 15; 10-19)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args_in:
        at = args_in.index("--")
        args_in, extra = args_in[:at], args_in[at + 1 :]
    p = parser()
    args = p.parse_args(args_in)
    if not args.address:
        p.error("--address: the Ray head's host:port is needed (or set RAY_ADDRESS)")
    node_id = args.node_id if args.node_id is not None else socket.gethostname()
    try:
        check_id("--node-id", node_id)
    except InvalidArgument as e:
        p.error(str(e))
    ray = _ray()
    if ray is None:
        print(
            "dloader-ray-node: Ray is not installed in this environment (pip install "
            "'dloader-elastic[ray]', into the training environment)",
            file=sys.stderr,
        )
        return 2
    cmd = command(ray, args.address, args.cpus, node_id, extra)
    env = {**os.environ, "RAY_worker_niceness": str(args.niceness)}
    shown = f"RAY_worker_niceness={args.niceness} {shlex.join(cmd)}"
    if args.dry_run:
        print(shown)
        return 0
    print(f"dloader-ray-node: {shown}", file=sys.stderr, flush=True)
    os.execve(ray, cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
