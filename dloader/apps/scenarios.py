"""Node mixes drawn from a seed: scenarios no policy was tuned on.

A :class:`NodeMix` is 2-5 jobs sharing one node for ``length`` seconds, drawn by
:func:`draw_mixes` from the testbed's emulated and real-pipeline profiles
(:data:`dloader.apps.testbed.PROFILES`): each job's per-sample costs (emulated profiles) and
accelerator step (all profiles) varied by up to 2x either way, its own worker count drawn from
what users pick (1-8), and, in some mixes, a job arriving a third of the way in, a job leaving
two thirds in, a pipeline's cost changing halfway. The same seed draws the same mixes.

Pure: it draws and describes; ``benchmarks/sidecar/bench_sidecar.py --generated N`` runs them
(:mod:`dloader.apps.experiment`). :func:`cost_split` is the static split the jobs' true costs
suggest (the benchmark's search starts from it, among others: a searched static baseline
that knows what no policy is told); :func:`division_room` is how much any division of the
node's cores could give over an even one (whether a mix leaves a node arbiter anything to win).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dloader.apps.experiment import Arrival
from dloader.apps.splits import Split
from dloader.apps.testbed import PROFILES, Profile
from dloader.sidecar.node_policy.sharing import cpu_shares

__all__ = [
    "MIX_PROFILES",
    "NodeMix",
    "ScenarioJob",
    "cost_split",
    "division_room",
    "draw_contention_mix",
    "draw_mix",
    "draw_mixes",
]

#: the profiles a mix draws its jobs from
MIX_PROFILES: tuple[str, ...] = (
    "io_heavy",
    "cpu_heavy",
    "gpu_bound",
    "image_jpeg",
    "text_pack",
    "remote_read",
)
#: contention mixes: the trainers that need a core of their own ...
TRAINER_PROFILES: tuple[str, ...] = ("host_heavy",)
#: ... and the jobs whose loaders would take it (CPU-bound pipelines)
HUNGRY_PROFILES: tuple[str, ...] = ("cpu_heavy", "image_jpeg", "text_pack")
#: the worker counts users pick (a job's own count, before any sidecar), and how often
OWN_COUNTS: tuple[tuple[int, float], ...] = ((1, 0.1), (2, 0.3), (4, 0.35), (8, 0.25))
#: how far a cost or a step is varied, either way (a factor)
SPREAD = 2.0


@dataclass(frozen=True)
class ScenarioJob:
    """One job of a mix."""

    label: str
    """Its name at the sidecar and in the results (``j1``, ``j2``, ... with the profile)."""
    profile: str
    workers: int
    """Its own worker count (what it runs without a sidecar)."""
    at: float
    """When it arrives, seconds into the scenario."""
    until: float
    """When it leaves."""
    io_scale: float = 1.0
    cpu_scale: float = 1.0
    step_scale: float = 1.0
    change_at: float | None = None
    """When its per-sample cost changes (None: never), seconds into the scenario."""
    change_factor: float = 1.0

    @property
    def costs(self) -> Profile:
        """Its profile with the variation applied (before any cost change)."""
        return PROFILES[self.profile].scaled(self.io_scale, self.cpu_scale, self.step_scale)

    def arrival(self, workers: int | str | None = None) -> Arrival:
        """The job for :func:`~dloader.apps.experiment.run_jobs`, at its own count or at
        ``workers`` (a count, or ``"auto"``: the loader tunes itself)."""
        extra = ["--job-name", self.label, "--step-scale", f"{self.step_scale:.4g}"]
        if PROFILES[self.profile].pipeline == "emulated":
            extra += ["--io-scale", f"{self.io_scale:.4g}", "--cpu-scale", f"{self.cpu_scale:.4g}"]
        if self.change_at is not None:
            extra += [
                "--slowdown-at",
                f"{self.change_at - self.at:g}",
                "--slowdown-factor",
                f"{self.change_factor:g}",
            ]
        return Arrival(
            self.profile,
            self.workers if workers is None else workers,
            self.at,
            seconds=self.until - self.at,
            label=self.label,
            extra=tuple(extra),
        )

    def describe(self, length: float = math.inf) -> str:
        c = self.costs
        what = f"io {c.io_ms:.1f} ms, cpu {c.cpu_ms:.1f} ms" if c.pipeline == "emulated" else "data"
        if c.main_cpu_ms > 0:
            what += f", trainer {c.main_cpu_ms:.1f} ms"
        out = f"{self.label} {self.profile} ({what}, limit {c.limit():.0f}/s, own {self.workers})"
        if self.at > 0:
            out += f" from {self.at:g} s"
        if self.until < length:
            out += f" until {self.until:g} s"
        if self.change_at is not None:
            out += f" cost x{self.change_factor:g} at {self.change_at:g} s"
        return out


@dataclass(frozen=True)
class NodeMix:
    """Jobs sharing one node for ``length`` seconds."""

    seed: int
    index: int
    length: float
    jobs: tuple[ScenarioJob, ...]
    contention: bool = False
    """Drawn by :func:`draw_contention_mix` (a trainer that needs its own core among CPU-bound
    neighbours), not :func:`draw_mix`."""

    @property
    def name(self) -> str:
        return f"{self.seed}/{self.index}"

    @property
    def labels(self) -> list[str]:
        return [j.label for j in self.jobs]

    @property
    def dynamic(self) -> bool:
        """Jobs arrive or leave during it."""
        return any(j.at > 0 or j.until < self.length for j in self.jobs)

    @property
    def changes(self) -> bool:
        """A job's cost changes during it."""
        return any(j.change_at is not None for j in self.jobs)

    def spans(self) -> list[tuple[float, tuple[str, ...]]]:
        """Between each two moments a job arrives or leaves: how long, and the jobs that run
        (in time order)."""
        marks = sorted({0.0, *(j.at for j in self.jobs), *(j.until for j in self.jobs)})
        return [
            (b - a, tuple(j.label for j in self.jobs if j.at <= (a + b) / 2 < j.until))
            for a, b in itertools.pairwise(marks)
        ]

    def phases(self) -> list[tuple[str, ...]]:
        """The sets of jobs that run together, in time order (a job arriving or leaving
        starts a new one)."""
        out: list[tuple[str, ...]] = []
        for _, running in self.spans():
            if running and (not out or out[-1] != running):
                out.append(running)
        return out

    def within(self, split: Split, budget: int) -> bool:
        """Whether ``split`` (a count for every job, held for its life) keeps every phase's
        jobs within ``budget`` workers."""
        return all(split[j] >= 1 for j in self.labels) and all(
            sum(split[j] for j in phase) <= budget for phase in self.phases()
        )

    def own(self) -> Split:
        """Each job at its own count (the naive split)."""
        return {j.label: j.workers for j in self.jobs}

    def arrivals(self, split: Mapping[str, int | str] | None = None) -> list[Arrival]:
        """The jobs to run: at their own counts, or at ``split``'s (a count or ``"auto"``
        per job)."""
        return [j.arrival(None if split is None else split[j.label]) for j in self.jobs]

    def events(self) -> list[float]:
        """The moments something changes on the node: the start, arrivals, departures and
        cost changes (seconds into the scenario, sorted)."""
        moments = {0.0, *(j.at for j in self.jobs), *(j.until for j in self.jobs)}
        moments |= {j.change_at for j in self.jobs if j.change_at is not None}
        return sorted(t for t in moments if t < self.length)

    def describe(self) -> str:
        kinds = [
            k
            for k, on in (
                ("contention", self.contention),
                ("dynamic", self.dynamic),
                ("cost change", self.changes),
            )
            if on
        ]
        return f"mix {self.name} ({', '.join(kinds) or 'static'}): " + "; ".join(
            j.describe(self.length) for j in self.jobs
        )


def _spread(rng: random.Random) -> float:
    return math.exp(rng.uniform(-math.log(SPREAD), math.log(SPREAD)))


def _drawn_job(rng: random.Random, i: int, profile: str, at: float, until: float) -> ScenarioJob:
    """The ``i``-th job of a mix, of ``profile``: its own count and its variation drawn."""
    counts, weights = zip(*OWN_COUNTS, strict=True)
    emulated = PROFILES[profile].pipeline == "emulated"
    return ScenarioJob(
        label=f"j{i + 1}-{profile}",
        profile=profile,
        workers=rng.choices(counts, weights)[0],
        at=at,
        until=until,
        io_scale=round(_spread(rng), 3) if emulated else 1.0,
        cpu_scale=round(_spread(rng), 3) if emulated else 1.0,
        step_scale=round(_spread(rng), 3),
    )


def draw_mix(seed: int, index: int, length: float) -> NodeMix:
    """The ``index``-th mix of ``seed`` (each mix has its own stream: mix 3 of a seed is the
    same whatever ``n`` is asked for)."""
    rng = random.Random(f"{seed}/{index}")
    starting = rng.randint(2, 4)
    coming = rng.random()  # a quarter: one arrives; a fifth: one leaves; a tenth: both
    arrives, leaves = coming < 0.25 or 0.45 <= coming < 0.55, 0.25 <= coming < 0.55
    changes = rng.random() < 0.3
    n = starting + arrives
    leaver = rng.randrange(starting) if leaves else None
    jobs = []
    for i in range(n):
        at = round(length / 3, 1) if i >= starting else 0.0
        until = round(2 * length / 3, 1) if i == leaver else length
        jobs.append(_drawn_job(rng, i, rng.choice(MIX_PROFILES), at, until))
    if changes:
        varied = [i for i, j in enumerate(jobs) if PROFILES[j.profile].pipeline == "emulated"]
        if varied:
            i = rng.choice(varied)
            j = jobs[i]
            at = round(max(length / 2, j.at + length / 6), 1)
            if at < j.until - 2:
                jobs[i] = replace(j, change_at=at, change_factor=rng.choice((0.5, 2.0)))
    return NodeMix(seed, index, length, tuple(jobs))


def draw_contention_mix(seed: int, index: int, length: float) -> NodeMix:
    """The ``index``-th contention mix of ``seed``: where jobs tuning themselves hurt each other
    and a node arbiter has something to win. One or two trainers that need most of a core
    themselves (:data:`TRAINER_PROFILES`: host-side work each step) share the node with one or
    two CPU-bound jobs (:data:`HUNGRY_PROFILES`) whose loaders, each tuning for its own
    throughput, take the cores the trainers need; in a third of them a CPU-bound job arrives a
    third of the way in. Costs and steps varied as in :func:`draw_mix` (a stream of its own:
    contention mix 3 of a seed is not mix 3)."""
    rng = random.Random(f"{seed}/contention/{index}")
    trainers = 1 + (rng.random() < 0.4)
    hungry = 1 + (rng.random() < 0.5)
    arrives = rng.random() < 1 / 3
    profiles = [rng.choice(TRAINER_PROFILES) for _ in range(trainers)]
    profiles += [rng.choice(HUNGRY_PROFILES) for _ in range(hungry + arrives)]
    jobs = []
    for i, profile in enumerate(profiles):
        at = round(length / 3, 1) if arrives and i == len(profiles) - 1 else 0.0
        jobs.append(_drawn_job(rng, i, profile, at, length))
    return NodeMix(seed, index, length, tuple(jobs), contention=True)


def draw_mixes(
    seed: int, n: int, length: float = 30.0, *, contention: bool = False
) -> list[NodeMix]:
    """``n`` node mixes drawn from ``seed``, each ``length`` seconds (``contention``: drawn
    by :func:`draw_contention_mix`).

    Raises:
        ValueError: ``n`` below 1, or a length under 12 s (a job arriving at a third must run
            long enough to be measured).
    """
    if n < 1:
        raise ValueError(f"n={n}: expected at least 1 mix")
    if not (math.isfinite(length) and length >= 12):
        raise ValueError(f"length={length}: expected at least 12 seconds")
    draw = draw_contention_mix if contention else draw_mix
    return [draw(seed, i, length) for i in range(n)]


def _measured(profile: Profile, cpu_ms: Mapping[str, float] | None) -> Profile:
    """``profile`` with a real pipeline's CPU per sample as measured here (``cpu_ms``, by
    profile name; emulated profiles cost what they say)."""
    ms = (cpu_ms or {}).get(profile.name)
    if ms is None or profile.pipeline == "emulated":
        return profile
    if not (math.isfinite(ms) and ms >= 0):
        raise ValueError(f"cpu_ms[{profile.name!r}]={ms}: expected milliseconds >= 0")
    return replace(profile, cpu_ms=ms)


def cost_split(
    mix: NodeMix, cores: float, budget: int, cpu_ms: Mapping[str, float] | None = None
) -> Split:
    """The static split the jobs' true costs suggest within ``budget``: one worker each, then
    each further worker to the job whose throughput / limit (summed over the phases, each
    weighted by its length) it raises most, the node's cores shared in proportion to demand
    (a job's samples cost its workers' ``cpu_ms`` and its trainer's ``main_cpu_ms``; a worker
    delivers at most ``1000 / (io_ms + cpu_ms)`` samples/s), until no worker adds 0.5% or none
    fits the budget in every phase. A starting point for the benchmark's search, not a policy:
    it knows costs no policy is told (real pipelines: ``cpu_ms``, their CPU per sample measured
    where the mix runs, as for :func:`division_room`; else their profiles' figures)."""
    costs = {j.label: _measured(j.costs, cpu_ms) for j in mix.jobs}
    spans = mix.spans()

    def value(counts: Split) -> float:
        total = 0.0
        for span, running in spans:
            rate = {
                j: min(counts[j] * 1000 / max(costs[j].io_ms + costs[j].cpu_ms, 1e-3), limit)
                for j in running
                for limit in (costs[j].limit(),)
            }
            demand = sum(rate[j] * (costs[j].cpu_ms + costs[j].main_cpu_ms) / 1000 for j in running)
            scale = min(1.0, cores / demand) if demand > 0 else 1.0
            total += span * sum(rate[j] * scale / costs[j].limit() for j in running)
        return total / mix.length

    k = dict.fromkeys(mix.labels, 1)
    while True:
        now = value(k)
        trials = [{**k, j: k[j] + 1} for j in mix.labels]
        scored = [(value(t) - now, i) for i, t in enumerate(trials) if mix.within(t, budget)]
        if not scored or max(scored)[0] < 0.005:
            return k
        k = trials[max(scored)[1]]


def division_room(mix: NodeMix, cores: float, cpu_ms: Mapping[str, float] | None = None) -> float:
    """How much a node arbiter could give ``mix`` by dividing the node's ``cores``, by the
    jobs' true costs and with workers free: the score (the sum over jobs of throughput / limit,
    weighted by time) when the cores go to the jobs that turn a core-second into the largest
    share of their limit first (the best division), over the score when each job gets an
    equal share (capped at what it needs, the rest shared again: no arbiter). 1.0: nothing to
    divide (the jobs' needs fit the cores, or their worth per core is the same).

    A job needs ``limit x (cpu_ms + main_cpu_ms)`` cores for its limit (an emulated job's
    ``cpu_ms`` times its cost change from ``change_at``); ``cpu_ms`` maps a real pipeline's
    profile to its CPU per sample measured where the mix runs
    (:func:`dloader.apps.testbed.cpu_per_sample_ms`; the profile's own figure is from another
    machine). Fluid: no worker counts, no switching costs, I/O free; not a bound on a real
    sidecar's gain over jobs tuning themselves, which need not reach the even share."""
    if not (math.isfinite(cores) and cores > 0):
        raise ValueError(f"cores={cores}: expected a number > 0")

    def need(j: ScenarioJob, t: float) -> float:
        """Cores ``j`` needs for its limit at ``t``."""
        c = _measured(j.costs, cpu_ms)
        ms = c.cpu_ms * (j.change_factor if j.change_at is not None and t >= j.change_at else 1)
        return c.limit() * (ms + c.main_cpu_ms) / 1000

    marks = sorted(
        {0.0, mix.length, *(j.at for j in mix.jobs), *(j.until for j in mix.jobs)}
        | {j.change_at for j in mix.jobs if j.change_at is not None}
    )
    best = even = 0.0
    for a, b in itertools.pairwise(marks):
        running = [j for j in mix.jobs if j.at <= (a + b) / 2 < j.until]
        if not running:
            continue
        needs = [need(j, (a + b) / 2) for j in running]
        left = cores
        for d in sorted(needs):  # a core-second is worth 1 / need of a limit: least need first
            got = min(d, left)
            best += (b - a) * (got / d if d > 0 else 1.0)
            left -= got
        shares = cpu_shares(needs, [1] * len(needs), cores)
        even += (b - a) * sum(s / d if d > 0 else 1.0 for s, d in zip(shares, needs, strict=True))
    return best / even if even > 0 else 1.0
