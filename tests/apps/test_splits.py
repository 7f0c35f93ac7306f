"""The static-split search (dloader.apps.splits) on synthetic scores: it finds the best split
within a budget, each split evaluated once, keeps a better seed, and parses splits by name."""

from __future__ import annotations

import pytest

from dloader.apps.splits import coordinate_search, parse_split


@pytest.mark.parametrize("budget", [11, 10])
def test_coordinate_search_finds_the_best_allowed_split(budget: int) -> None:
    """On a separable score peaking at io=8, cpu=2, gpu=1, the search from the even split finds
    a best split within the budget (at 10 workers: io 7 or cpu 1, off the ladder or below the
    peak, which only a transfer of workers between jobs reaches), evaluating each split once."""
    peak = {"io": 8, "cpu": 2, "gpu": 1}
    calls: list[tuple[tuple[str, int], ...]] = []

    def evaluate(split: dict[str, int]) -> float:
        calls.append(tuple(sorted(split.items())))
        return -float(sum((split[j] - peak[j]) ** 2 for j in peak))

    best, split = coordinate_search(
        evaluate, {"io": 3, "cpu": 3, "gpu": 3}, lambda s: sum(s.values()) <= budget
    )
    optimum = -float(max(sum(peak.values()) - budget, 0))  # one worker short costs 1
    assert best == optimum == evaluate(split) and sum(split.values()) <= budget
    assert len(calls[:-1]) == len(set(calls[:-1]))  # each split once


def test_coordinate_search_starts_from_a_better_seed() -> None:
    """Two peaks: a local search from one worker on a ladder that stops at 3 climbs the near
    one (io 2, score -1); seeded with the far one (io 9, score 0, off its ladder), it keeps
    that."""

    def evaluate(split: dict[str, int]) -> float:
        io = split["io"]
        return -float(min(abs(io - 9), 1 + abs(io - 2)))

    ladder = (1, 2, 3)
    near, _ = coordinate_search(evaluate, {"io": 1}, lambda s: True, ladder, 3)
    far, split = coordinate_search(
        evaluate, {"io": 1}, lambda s: True, ladder, 3, seeds=[{"io": 9}]
    )
    assert near == -1.0 and far == 0.0 and split == {"io": 9}


def test_seed_splits_are_parsed_or_refused_by_name() -> None:
    jobs = ("image_jpeg", "text_pack", "remote_read")
    assert parse_split("1/1/17", jobs) == dict(zip(jobs, (1, 1, 17), strict=True))
    for bad in ("1/1", "1/x/17", "0/1/17", ""):
        with pytest.raises(ValueError, match="image_jpeg/text_pack/remote_read"):
            parse_split(bad, jobs)
