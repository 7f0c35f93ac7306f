"""A local Ray cluster of several nodes on this one machine, each node pinned to a CPU set of its
own: the "other machines" of the remote-worker tests, benchmark and demo.

    python -m dloader.apps.raycluster --node pool:1:1     # a head, and a node "pool" of 1 CPU
                                                          # pinned to core 1; prints its address

The cluster runs in a process of its own (:class:`LocalRayCluster` starts it and talks to it
over its standard input and output, one JSON line each way), so that the caller holds no Ray or
gRPC threads: a training process that forks its loader workers must not. The head has no CPUs
for tasks; each node gets ``cpus`` CPUs for Ray and the custom resources given, and its raylet
and every process it starts are pinned to the node's CPU set. ``kill`` ends a node's processes
with SIGKILL, as a machine that dies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["LocalRayCluster", "main"]


class LocalRayCluster:
    """A local multi-node Ray cluster in a child process (see the module docstring)."""

    def __init__(self, head_cpus: Sequence[int] = (), log: Path | None = None) -> None:
        """``head_cpus``: the CPU set of the head's processes (empty: all); ``log``: where Ray's
        own output goes (None: this process's standard error)."""
        cmd = [sys.executable, "-m", "dloader.apps.raycluster", "--serve"]
        if head_cpus:
            cmd += ["--head-cpus", ",".join(map(str, head_cpus))]
        # kept open while the cluster runs (closed by close())
        self._log = open(log, "ab") if log is not None else None  # noqa: SIM115
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self.address = str(self._call(None)["address"])

    def _call(self, request: Mapping[str, Any] | None) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        if request is not None:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the local Ray cluster exited (code {self._proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"local Ray cluster: {reply['error']}")
        return dict(reply)

    def add_node(
        self,
        name: str,
        cpus: int,
        cpu_set: Sequence[int] = (),
        resources: Mapping[str, float] | None = None,
    ) -> None:
        """Adds node ``name`` with ``cpus`` CPUs for Ray and ``resources``, its processes
        pinned to ``cpu_set`` (empty: not pinned); returns once it has joined."""
        self._call(
            {
                "op": "add",
                "name": name,
                "cpus": cpus,
                "cpu_set": list(cpu_set),
                "resources": dict(resources or {}),
            }
        )

    def kill_node(self, name: str) -> None:
        """Ends node ``name``'s processes at once (SIGKILL), as a machine that dies."""
        self._call({"op": "kill", "name": name})

    def close(self) -> None:
        """Stops the cluster and every process of it."""
        if self._proc.poll() is None:
            try:
                self._call({"op": "quit"})
                self._proc.wait(timeout=60)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _pin_tree(pid: int, cpus: set[int]) -> int:
    """Pins ``pid`` and its descendants to ``cpus``; how many were pinned."""
    import psutil

    pinned = 0
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                os.sched_setaffinity(p.pid, cpus)
                pinned += 1
            except (ProcessLookupError, PermissionError, psutil.Error):
                pass
    except psutil.Error:
        pass
    return pinned


def _serve(head_cpus: set[int]) -> int:
    """The cluster's process: a head, then nodes as asked on standard input."""
    if head_cpus:
        os.sched_setaffinity(0, head_cpus)
    from ray.cluster_utils import Cluster

    temp = Path(os.environ.get("TMPDIR", "/tmp"))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "temp_dir": str(temp / "ray"),
        },
    )
    nodes: dict[str, Any] = {}
    pins: dict[str, set[int]] = {}
    print(json.dumps({"address": cluster.address}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            op = req["op"]
            if op == "quit":
                break
            if op == "add":
                node = cluster.add_node(
                    num_cpus=int(req["cpus"]), resources=req.get("resources") or None
                )
                nodes[req["name"]] = node
                cpus = set(req.get("cpu_set") or ())
                if cpus:
                    pins[req["name"]] = cpus
                    for infos in node.all_processes.values():
                        for info in infos:
                            _pin_tree(info.process.pid, cpus)
                cluster.wait_for_nodes()
                print(json.dumps({"ok": req["name"]}), flush=True)
            elif op == "kill":
                node = nodes.pop(req["name"])
                cluster.remove_node(node, allow_graceful=False)
                print(json.dumps({"ok": req["name"]}), flush=True)
            else:
                print(json.dumps({"error": f"unknown op {op!r}"}), flush=True)
        except Exception as exc:  # a bad request is answered, not fatal
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    cluster.shutdown()
    return 0


def _node(text: str) -> tuple[str, int, list[int]]:
    try:
        name, cpus, cpu_set = text.split(":")
        return name, int(cpus), [int(c) for c in cpu_set.split(",") if c]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--node {text!r}: expected NAME:CPUS:CPU_SET, e.g. pool:1:1"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``--serve`` (the cluster's own process), or a cluster kept up until
    Ctrl-C."""
    p = argparse.ArgumentParser(
        prog="python -m dloader.apps.raycluster",
        description="A local Ray cluster of several nodes on this machine, each pinned to its "
        "own CPU set (the remote loader workers' test bed). Prints the address to give "
        "RayWorkers(address=...), then runs until Ctrl-C.",
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--head-cpus", default="", help="CPU set of the head (e.g. 0)")
    p.add_argument(
        "--node",
        type=_node,
        action="append",
        default=[],
        help="NAME:CPUS:CPU_SET, e.g. pool:1:1 (a node with 1 CPU for Ray, pinned to core 1; "
        "its workers need the resource NAME)",
    )
    args = p.parse_args(argv)
    head = {int(c) for c in args.head_cpus.split(",") if c}
    if args.serve:
        return _serve(head)
    with LocalRayCluster(sorted(head)) as cluster:
        for name, cpus, cpu_set in args.node:
            cluster.add_node(name, cpus, cpu_set, {name: float(cpus)})
        print(f"Ray cluster at {cluster.address}; Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
