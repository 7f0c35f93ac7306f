"""How a node's cores are shared between CPU consumers, as the kernel's fair scheduler shares
them between runnable threads: water-filling by thread count (:func:`cpu_shares`), disjoint
CPU sets sized by share (:func:`cpu_sets`), and the weight of a training process against
loader workers the sidecar has niced (:func:`trainer_weight`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "NICE_WEIGHTS",
    "cpu_sets",
    "cpu_shares",
    "trainer_weight",
    "water_fill",
]

NICE_WEIGHTS: tuple[int, ...] = (
    *(1024, 820, 655, 526, 423, 335, 272, 215, 172, 137),
    *(110, 87, 70, 56, 45, 36, 29, 23, 18, 15),
)
"""The Linux fair scheduler's weight of a thread at nice 0, 1, ..., 19 (``sched_prio_to_weight``
in ``kernel/sched/core.c``: each step about 1.25x)."""


def trainer_weight(worker_nice: int) -> float:
    """How many loader workers' worth of a core a training process (at nice 0) is given when
    the workers run at ``worker_nice``: 1 at 0, 9.3 at 10, 68 at 19."""
    if not 0 <= worker_nice < len(NICE_WEIGHTS):
        raise ValueError(f"worker_nice={worker_nice}: expected 0..{len(NICE_WEIGHTS) - 1}")
    return NICE_WEIGHTS[0] / NICE_WEIGHTS[worker_nice]


def water_fill(demands: np.ndarray, weights: np.ndarray, cores: float) -> np.ndarray:
    """:func:`cpu_shares` for many rows of consumers at once (``(m, n)`` demands and weights)."""
    active = demands > 0
    w = np.where(active, weights, 0.0)
    # In order of demand per thread (the idle last): while a consumer needs no more than its
    # fair share of what is left, it gets its demand (which only raises the others' share);
    # from the first that needs more, everyone left shares the rest by thread count.
    order = np.argsort(
        np.where(active, demands / np.maximum(w, 1.0), np.inf), axis=1, kind="stable"
    )
    m, n = demands.shape
    rows = np.arange(m)[:, None]
    d, ws = demands[rows, order], w[rows, order]
    # what is left before each consumer, summed in the order the sequential pass takes it
    left = np.cumsum(np.concatenate([np.full((m, 1), float(cores)), -d[:, :-1]], axis=1), axis=1)
    weight = ws.sum(axis=1, keepdims=True) - np.cumsum(ws, axis=1) + ws
    short = d * weight > left * ws
    first = np.where(short.any(axis=1), short.argmax(axis=1), n)[:, None]
    at = np.minimum(first, n - 1)
    level = left[rows, at] / np.maximum(weight[rows, at], 1.0)
    out = np.empty_like(d)
    out[rows, order] = np.where(np.arange(n) < first, d, level * ws)
    return out


def cpu_shares(demands: Sequence[float], workers: Sequence[int], cores: float) -> list[float]:
    """Cores each job gets when jobs demand ``demands`` cores with ``workers`` workers each.

    Water-filling with per-worker fairness (as the kernel's fair scheduler shares cores between
    runnable threads): if the demands fit, everyone gets its demand; otherwise jobs whose demand
    is below their workers' fair share get it, and the cores left are divided among the others
    in proportion to their worker counts.
    """
    if not demands:
        return []
    d = np.array([demands], dtype=float)
    w = np.maximum(np.array([workers], dtype=float), 1.0)
    return [float(x) for x in water_fill(d, w, cores)[0]]


def cpu_sets(shares: dict[str, float], cpus: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Disjoint CPU sets, sized in proportion to each job's CPU share (at least one CPU each,
    largest remainders first), in the order of ``shares``; empty if there are fewer CPUs than
    jobs (then they cannot be kept apart)."""
    n = len(cpus)
    if not shares or n < len(shares):
        return {}
    total = sum(max(s, 0.0) for s in shares.values()) or 1.0
    exact = {j: max(s, 0.0) / total * n for j, s in shares.items()}
    count = {j: max(1, int(x)) for j, x in exact.items()}
    while sum(count.values()) > n:  # the floors of 1 overshot: take from the largest
        big = max(count, key=lambda j: (count[j] - exact[j], count[j]))
        count[big] -= 1
    for j in sorted(exact, key=lambda j: exact[j] - count[j], reverse=True):
        if sum(count.values()) >= n:
            break
        count[j] += 1
    out, at = {}, 0
    for j in shares:
        out[j] = tuple(cpus[at : at + count[j]])
        at += count[j]
    return out
