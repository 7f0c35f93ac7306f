"""The allocator's nodes: who registered, how many GPUs each offers now, who went silent, and
the TCP ports handed out for the rendezvous of jobs that span nodes.

Transport-free and store-free: the core persists what changes. Access checks are the core's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dloader._shared.allocator_messages import MAX_CORES, check_id
from dloader.allocator.optimizer import POOL_EFFICIENCY, Cluster
from dloader.errors import AllocatorError, InvalidArgument, NotFound, finite_within, shown

__all__ = ["DEFAULT_RENDEZVOUS_PORTS", "Node", "NodeRegistry"]

log = logging.getLogger(__name__)

#: a hostname, an IPv4 address, or an IPv6 address in brackets (what goes before ":port")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")
#: TCP ports handed out for multi-node rendezvous (dloader-allocator --rendezvous-ports)
DEFAULT_RENDEZVOUS_PORTS = (29400, 29999)
MAX_NODE_GPUS = 1024


@dataclass
class Node:
    """A registered node."""

    gpus: int
    free: int
    """GPUs the allocator may use on it (its last report)."""
    address: str
    """Its sidecar's address (informational)."""
    last_seen: float
    """Clock time of its last registration or report."""
    silent: bool = False
    """Silent past the timeout: its GPUs are out of the pool until it reports again."""
    host: str = ""
    """Where other nodes reach it ("": its node id)."""
    cpus: float = 0.0
    """Cores its jobs' input pipelines may use (0: not limited)."""
    lends: bool = False
    """Its Ray node hosts other nodes' jobs' remote loader workers: its spare cores may be
    lent (``goodput-dp-lend``)."""


class NodeRegistry:
    """The nodes of a cluster and the GPUs the policy may use on each."""

    def __init__(
        self,
        nodes: dict[str, Node],
        *,
        clock: Callable[[], float],
        timeout_s: float = 0.0,
        rendezvous_ports: tuple[int, int] = DEFAULT_RENDEZVOUS_PORTS,
    ) -> None:
        """Args:
        nodes: the nodes restored from the state file.
        clock: seconds (wall clock; a fake in tests).
        timeout_s: a node that neither registers nor reports for this long loses its GPUs
            from the pool until it reports again (0: never).
        rendezvous_ports: ``(first, last)`` TCP ports handed out, in turn, for the rendezvous
            of jobs that span nodes (each placement of such a job gets the next free one).
        """
        if not timeout_s >= 0:
            raise ValueError(f"node_timeout_s={timeout_s} must be >= 0 (0: never)")
        first, last = rendezvous_ports
        if not 1 <= first <= last <= 65535:
            raise ValueError(f"rendezvous_ports={rendezvous_ports} must be 1 <= first <= last")
        self.nodes = nodes
        self.timeout_s = timeout_s
        self._clock = clock
        self._ports = rendezvous_ports
        self._next_port = first

    def register(
        self,
        node_id: str,
        gpus: int,
        address: str = "",
        host: str = "",
        cpus: float = 0.0,
        lends: bool = False,
    ) -> Node:
        """Adds a node (or replaces its GPU count and cores), checked. A node with no GPUs and
        some cores is a node of the CPU pool (its cores run jobs' loader workers remotely); a
        GPU node that ``lends`` may host other nodes' jobs' remote workers on its spare cores."""
        check_id("node_id", node_id)
        finite_within("cpus", cpus, 0.0, MAX_CORES)
        if not (1 if cpus == 0 else 0) <= gpus <= MAX_NODE_GPUS:
            raise InvalidArgument(
                "gpus",
                f"{gpus} must be within [1, {MAX_NODE_GPUS}] (or 0 with cpus > 0: a node of "
                "the CPU pool)",
            )
        if host and not _HOST.fullmatch(host):
            raise InvalidArgument(
                "host", f"{shown(host)} must be a hostname, an IPv4 address or [IPv6 address]"
            )
        if lends and not (gpus and cpus):
            raise InvalidArgument(
                "lends", "only a GPU node that gives its cores (cpus > 0) lends spare ones"
            )
        node = self.nodes[node_id] = Node(
            gpus, gpus, address, self._clock(), host=host, cpus=cpus, lends=lends
        )
        return node

    def get(self, node_id: str) -> Node:
        """A registered node, or NOT_FOUND."""
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound("node_id", f"node {shown(node_id)} is not registered")
        return node

    def report(self, node_id: str, free: int) -> bool:
        """A node's report of its usable GPUs; True if the pool changed (a decision is due)."""
        node = self.get(node_id)
        if not 0 <= free <= node.gpus:
            raise InvalidArgument("free_gpus", f"{free} must be within [0, {node.gpus}]")
        node.last_seen = self._clock()
        changed = free != node.free or node.silent
        node.free = free
        return changed

    def usable(self, node_id: str) -> int:
        """GPUs of a node the policy may use: none once it has been silent for the timeout."""
        node = self.nodes[node_id]
        quiet = self._clock() - node.last_seen
        silent = self.timeout_s > 0 and quiet > self.timeout_s
        if silent != node.silent:
            node.silent = silent
            if silent:
                log.warning("node %s silent for %.0f s: its GPUs leave the pool", node_id, quiet)
            else:
                log.info("node %s reports again: its GPUs rejoin the pool", node_id)
        return 0 if silent else min(node.free, node.gpus)

    def cluster(self) -> tuple[list[str], Cluster | None]:
        """The ids of the nodes with usable GPUs (sorted) and the cluster they form (None: no
        GPU is usable). Its cores are limited only where every such node registered its cores
        (a node that did not says nothing of them)."""
        usable = {n: self.usable(n) for n in sorted(self.nodes)}
        ids = [n for n, g in usable.items() if g > 0]
        if not ids:
            return [], None
        cpus = tuple(self.nodes[n].cpus for n in ids)
        if not all(cpus):
            return ids, Cluster(tuple(usable[n] for n in ids))
        pool = sum(
            node.cpus for n, node in self.nodes.items() if node.gpus == 0 and not self.silent(n)
        )
        return ids, Cluster(
            tuple(usable[n] for n in ids),
            cpus,
            pool=pool,
            pool_efficiency=POOL_EFFICIENCY,
            lends=tuple(self.nodes[n].lends for n in ids),
        )

    def silent(self, node_id: str) -> bool:
        """Whether a node has been silent past the timeout (a pool node's cores leave the pool
        as a GPU node's GPUs do)."""
        quiet = self._clock() - self.nodes[node_id].last_seen
        return self.timeout_s > 0 and quiet > self.timeout_s

    def rendezvous(self, job_id: str, placement: dict[str, int], taken: Iterable[str]) -> str:
        """``host:port`` for a placement over several nodes (its first node hosts it), else "".

        Each new placement gets the next port of the range not in ``taken`` (other jobs'
        current rendezvous), so that a restart never meets the previous generation's store.
        """
        if len(placement) < 2:
            return ""
        first = min(placement)
        host = (self.nodes[first].host if first in self.nodes else "") or first
        busy = set(taken)
        lo, hi = self._ports
        for _ in range(hi - lo + 1):
            port, self._next_port = self._next_port, self._next_port + 1
            if self._next_port > hi:
                self._next_port = lo
            if f"{host}:{port}" not in busy:
                return f"{host}:{port}"
        raise AllocatorError(
            f"no free rendezvous port in {lo}-{hi} on {host} for job {job_id}: widen "
            "--rendezvous-ports"
        )
