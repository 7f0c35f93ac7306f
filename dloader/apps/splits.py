"""Static splits of a node's loader workers, and the search for the best one.

A split gives each job of a node a fixed worker count. The best split within a budget is the
strongest static baseline a node policy can be held to ("jobs that know their best count in
advance, which nobody does"); the benchmarks find it by :func:`coordinate_search`, each split
scored by running the jobs. The search takes the scoring as a function, so it is tested on
synthetic scores (``tests/apps/test_splits.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["LADDER", "QUICK_LADDER", "Split", "coordinate_search", "parse_split"]

#: the worker counts the coordinate search tries for a job (those within the budget)
LADDER = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20)
#: quick searches: doublings (those within the budget, as above: 16 only at budget 24, where an
#: I/O-bound job's best count is 16-21 and a ladder that stopped at 8 made the "best" static
#: split one that the adaptive sidecar beat by 1.21x)
QUICK_LADDER = (1, 2, 4, 8, 16)

Split = dict[str, int]
"""Job name -> worker count."""


def coordinate_search(
    evaluate: Callable[[Split], float],
    start: Split,
    allowed: Callable[[Split], bool],
    ladder: Sequence[int] = LADDER,
    rounds: int = 3,
    seeds: Sequence[Split] = (),
    max_evaluations: int | None = None,
) -> tuple[float, Split]:
    """The best split found by local search, and its score. It starts from the best of
    ``start`` and the (allowed) ``seeds``, each evaluated first. Each round: each job in turn tries
    every count of ``ladder`` that keeps the split ``allowed``, the others held, and the best
    is kept; then every pair of jobs tries transfers (one job one worker down, or one step
    down the ladder, the workers it frees to the other: the moves a tight budget needs, where
    no job can grow alone).
    Rounds until one changes nothing (at most ``rounds``), or until ``max_evaluations``
    splits were evaluated (a split not evaluated then scores ``-inf``). Each split is evaluated
    once."""
    seen: dict[tuple[tuple[str, int], ...], float] = {}

    def value(split: Split) -> float:
        key = tuple(sorted(split.items()))
        if key not in seen:
            if max_evaluations is not None and len(seen) >= max_evaluations:
                return -math.inf
            seen[key] = evaluate(split)
        return seen[key]

    best, best_value = dict(start), value(start)
    for seed in seeds:
        if allowed(seed) and (v := value(seed)) > best_value:
            best, best_value = dict(seed), v
    for _ in range(rounds):
        changed = False
        for job in list(best):
            for k in ladder:
                trial = {**best, job: k}
                if k == best[job] or not allowed(trial):
                    continue
                v = value(trial)
                if v > best_value:
                    best, best_value, changed = trial, v, True
        base = dict(best)
        for src in base:
            below = [x for x in ladder if x < base[src]]
            downs = sorted({below[-1], base[src] - 1} if below else set(), reverse=True)
            for dst in base:
                for down in downs if src != dst else ():
                    trial = {**base, src: down, dst: base[dst] + base[src] - down}
                    if not allowed(trial):
                        continue
                    v = value(trial)
                    if v > best_value:
                        best, best_value, changed = trial, v, True
        if not changed:
            break
    return best_value, best


def parse_split(text: str, jobs: Sequence[str]) -> Split:
    """``"1/1/17"`` -> ``{jobs[0]: 1, jobs[1]: 1, jobs[2]: 17}``; ValueError naming the text
    and what was expected."""
    parts = text.split("/")
    if len(parts) != len(jobs) or not all(x.strip().isdigit() and int(x) >= 1 for x in parts):
        raise ValueError(
            f"--seed {text!r}: expected {len(jobs)} worker counts >= 1 separated by '/', "
            f"for {'/'.join(jobs)}"
        )
    return {j: int(x) for j, x in zip(jobs, parts, strict=True)}
