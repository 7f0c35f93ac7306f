"""Application behaviour from the Pollux traces (the simulator's ground truth), and workloads.

An :class:`AppTrace` answers what the simulator needs to know about a running job, as the
Pollux study's own simulator did:

* **step time** of a placement (GPUs per node) at a local batch size: interpolated in the local
  batch within a measured placement, otherwise linearly over (nodes, replicas, local batch) from
  the placement and scalability measurements (nearest measurement outside their hull);
* **progress per step**: in base steps (steps at the initial batch ``M0``), the gain of a step at
  global batch ``M`` in epoch ``e`` is ``(var + sqr) / (var / (M / M0) + sqr)`` with the gradient
  statistics measured in that epoch, interpolated between the validated batch sizes;
* **when it is done**: after ``max_epochs`` epochs' worth of progress at the initial batch.

Each trace also carries the scaling model the policies use (the predictor's
:class:`~dloader.predictor.ScalingModel`, fitted to the same measurements), so decisions rest on
predictions while outcomes come from the measurements.
"""

from __future__ import annotations

import csv
import gzip
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from dloader.errors import AllocatorError
from dloader.predictor import GradientNoise, PredictorError, ScalingModel, ScalingPoint
from dloader.predictor.pollux import (
    APPLICATIONS,
    EpochStats,
    parse_csv,
    read_placements,
    read_scalability,
    read_validation,
    validated_batch_sizes,
)

__all__ = [
    "DURATIONS",
    "PACKAGED_PHILLY",
    "PACKAGED_TRACES",
    "POLLUX_CONSTANTS",
    "POLLUX_NUMBERS",
    "POLLUX_WORKLOADS",
    "AppTrace",
    "Durations",
    "WorkloadJob",
    "jitter_arrivals",
    "load_apps",
    "packaged_workload",
    "placement_key",
    "read_philly",
    "read_workload",
]

_DATA = Path(__file__).resolve().parent / "data"
#: The Pollux traces shipped with the package (Apache-2.0; see ``data/NOTICE.md``).
PACKAGED_TRACES = _DATA / "pollux" / "traces"
#: The Philly arrivals shipped with the package (CC-BY-4.0; see ``data/NOTICE.md``).
PACKAGED_PHILLY = _DATA / "philly" / "philly.csv.gz"


#: The Pollux workloads shipped with the package: 1-4 are those the Pollux paper reports on,
#: 5-8 the rest of its artifact's set (held out: no policy here was tuned on them).
POLLUX_WORKLOADS = range(1, 9)
#: Their numbers, as help and error texts name them.
POLLUX_NUMBERS = f"{POLLUX_WORKLOADS[0]}-{POLLUX_WORKLOADS[-1]}"


def packaged_workload(number: int) -> Path:
    """Pollux workload ``number`` (one of :data:`POLLUX_WORKLOADS`), shipped with the package."""
    if number not in POLLUX_WORKLOADS:
        raise AllocatorError(
            f"workload {number}: the package ships Pollux workloads {POLLUX_NUMBERS}"
        )
    return _DATA / "pollux" / "workloads" / f"workload-{number}.csv"


#: Per-application constants of the Pollux study: (max epochs, largest local batch or None).
POLLUX_CONSTANTS: dict[str, tuple[int, int | None]] = {
    "bert": (2, None),
    "cifar10": (100, None),
    "deepspeech2": (80, None),
    "imagenet": (90, None),
    "ncf": (10, None),
    "yolov3": (50, 8),
}

_MAX_NODES = 16  # the measurements go up to 16 nodes; more are treated as 16 (as Pollux did)


def placement_key(placement: Sequence[int] | str) -> tuple[int, ...]:
    """A placement as its non-empty nodes, largest first: (2, 0, 4) -> (4, 2)."""
    digits = [int(c) for c in placement] if isinstance(placement, str) else list(placement)
    return tuple(sorted((d for d in digits if d > 0), reverse=True))


@dataclass
class AppTrace:
    """One application's measured behaviour (build with :meth:`from_measurements`)."""

    name: str
    max_epochs: int
    init_batch: int
    max_batch: int
    local_bsz_range: tuple[int, int]
    model: ScalingModel = field(repr=False)
    _by_placement: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        repr=False
    )
    _linear: LinearNDInterpolator = field(repr=False)
    _nearest: NearestNDInterpolator = field(repr=False)
    _batches: np.ndarray = field(repr=False)
    _sqr: np.ndarray = field(repr=False)  # (batches, epochs)
    _var: np.ndarray = field(repr=False)
    marks: np.ndarray = field(repr=False)
    """Progress (base steps) at the end of each epoch at the initial batch."""
    _cache: dict[tuple[tuple[int, ...], float], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def from_measurements(
        cls,
        name: str,
        placements: Sequence[tuple[str, ScalingPoint]],
        scalability: Sequence[ScalingPoint],
        validation: dict[int, list[EpochStats]],
        *,
        max_epochs: int,
        max_local_bsz: int | None = None,
    ) -> AppTrace:
        """Builds the trace from parsed measurements (see :mod:`dloader.predictor.pollux`)."""
        if not placements or not validation:
            raise AllocatorError(f"application {name!r}: no placement or validation data")
        groups: dict[tuple[int, ...], dict[int, list[tuple[float, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for placement, p in placements:
            groups[placement_key(placement)][p.local_bsz].append((p.step_time, p.sync_time or 0.0))
        by_placement = {}
        for key, rows in groups.items():
            bsz = np.array(sorted(rows), dtype=float)
            means = np.array([np.mean(rows[int(b)], axis=0) for b in bsz])
            by_placement[key] = (bsz, means[:, 0], means[:, 1])
        xs, ys = [], []
        for key, (bsz, step, sync) in by_placement.items():
            for b, s, y in zip(bsz, step, sync, strict=True):
                xs.append((min(len(key), _MAX_NODES), sum(key), b))
                ys.append((s, y))
        for p in scalability:
            xs.append((min(p.nodes, _MAX_NODES), p.replicas, p.local_bsz))
            ys.append((p.step_time, p.sync_time or 0.0))
        x, y = np.array(xs, dtype=float), np.array(ys, dtype=float)
        local = [p.local_bsz for _, p in placements]
        lo, hi = min(local), max(local)
        if max_local_bsz is not None:
            hi = min(hi, max_local_bsz)
        batches = np.array(sorted(validation), dtype=float)
        epochs = min(len(v) for v in validation.values())
        if epochs < 1:
            raise AllocatorError(f"application {name!r}: a validation file has no rows")
        sqr = np.array([[e.grad_sqr for e in validation[int(b)][:epochs]] for b in batches])
        var = np.array([[e.grad_var for e in validation[int(b)][:epochs]] for b in batches])
        init = int(batches[0])
        marks = np.array([e.progress for e in validation[init]], dtype=float)
        points = [p for _, p in placements] + list(scalability)
        return cls(
            name=name,
            max_epochs=min(max_epochs, len(marks)),
            init_batch=init,
            max_batch=int(batches[-1]),
            local_bsz_range=(lo, hi),
            model=ScalingModel.fit(points, node_factors=True),
            _by_placement=by_placement,
            _linear=LinearNDInterpolator(x, y),
            _nearest=NearestNDInterpolator(x, y),
            _batches=batches,
            _sqr=sqr,
            _var=var,
            marks=marks,
        )

    @property
    def validated_batches(self) -> tuple[int, ...]:
        """Global batch sizes with measured gradient statistics."""
        return tuple(int(b) for b in self._batches)

    def step_sync(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        """Measured (step, sync) seconds of one micro-batch step; see the module docstring."""
        key, local = placement_key(placement), round(float(local_bsz), 3)
        hit = self._cache.get((key, local))
        if hit is None:
            hit = self._cache[key, local] = self._lookup(key, local)
        return hit

    def _lookup(self, key: tuple[int, ...], local: float) -> tuple[float, float]:
        if not key:
            raise AllocatorError(f"{self.name}: a step needs at least one GPU")
        row = self._by_placement.get(key)
        if row is not None:
            bsz, step, sync = row
            return float(np.interp(local, bsz, step)), float(np.interp(local, bsz, sync))
        q = np.array([[min(len(key), _MAX_NODES), sum(key), local]], dtype=float)
        out = self._linear(q)[0]
        if not np.all(np.isfinite(out)):
            out = self._nearest(q)[0]
        return float(out[0]), float(out[1])

    def _micro(self, placement: Sequence[int], batch: int) -> tuple[int, float]:
        """(micro-batches per step, local micro-batch size) at global ``batch``."""
        lo, hi = self.local_bsz_range
        local = batch / sum(placement)
        accum = max(math.ceil(local / hi - 1e-9), 1)
        return accum, max(local / accum, lo)

    def iteration_time(self, placement: Sequence[int], batch: int) -> float:
        """Seconds per optimizer step at global ``batch``, accumulating gradients if needed."""
        accum, micro = self._micro(placement, batch)
        step, sync = self.step_sync(placement, micro)
        return step + (accum - 1) * (step - sync)

    def measure(self, placement: Sequence[int], batch: int) -> ScalingPoint:
        """What a job running ``placement`` at global ``batch`` measures: one micro-batch step
        (its local size rounded as a loader would), with its synchronisation time."""
        _, micro = self._micro(placement, batch)
        key = placement_key(placement)
        local = max(round(micro), 1)
        step, sync = self.step_sync(placement, local)
        return ScalingPoint(len(key), sum(key), local, step, sync)

    def _stats(self, batch: float, epoch: int) -> tuple[float, float]:
        e = min(max(epoch, 0), self._sqr.shape[1] - 1)
        sqr = float(np.interp(batch, self._batches, self._sqr[:, e]))
        var = float(np.interp(batch, self._batches, self._var[:, e]))
        return max(sqr, 1e-30), max(var, 0.0)

    def gain(self, batch: float, epoch: int) -> float:
        """Progress (base steps) of one step at global ``batch`` in ``epoch``."""
        sqr, var = self._stats(batch, epoch)
        scale = batch / self.init_batch
        return (var + sqr) / (var / scale + sqr)

    def noise(self, batch: float, epoch: int) -> GradientNoise:
        """The gradient statistics a job measures at ``batch`` in ``epoch``."""
        sqr, var = self._stats(batch, epoch)
        return GradientNoise(self.init_batch, sqr, var)


def load_apps(traces_dir: str | Path, names: Sequence[str] = APPLICATIONS) -> dict[str, AppTrace]:
    """Reads the named applications from a Pollux ``traces/`` directory."""
    root = Path(traces_dir)
    if not root.is_dir():
        raise AllocatorError(f"--traces {root}: not a directory (expected the Pollux traces/)")
    apps = {}
    for name in names:
        if name not in POLLUX_CONSTANTS:
            raise AllocatorError(
                f"application {name!r}: unknown; expected one of {sorted(POLLUX_CONSTANTS)}"
            )
        d = root / name
        epochs, max_local = POLLUX_CONSTANTS[name]
        try:
            validation = {b: read_validation(d, b) for b in validated_batch_sizes(d)}
            apps[name] = AppTrace.from_measurements(
                name,
                read_placements(d),
                read_scalability(d),
                validation,
                max_epochs=epochs,
                max_local_bsz=max_local,
            )
        except PredictorError as exc:
            raise AllocatorError(str(exc)) from None
    return apps


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload: when it arrives and what its user asked for."""

    name: str
    time: float
    """Submission second."""
    application: str
    num_replicas: int
    batch_size: int
    duration_s: float | None = None
    """Its length at its request (None: its application's, ``max_epochs`` epochs): its work is
    scaled so that on its requested GPUs, packed, at its requested batch and with the cores of
    its GPUs' share of the cluster it runs this many seconds (Synergy's jobs: their Philly
    durations at the GPU-proportional share)."""
    cpu_profile: str | None = None
    """The CPU profile its input pipeline follows (a model of ``read_cpu_profiles``; None: its
    application's, ``APP_PROFILES``)."""


def _workload_job(row: dict[str, str]) -> WorkloadJob:
    job = WorkloadJob(
        row["name"],
        float(row["time"]),
        row["application"],
        int(row["num_replicas"]),
        int(row["batch_size"]),
    )
    if job.application not in POLLUX_CONSTANTS:
        raise ValueError(
            f"application={job.application!r}; expected one of {sorted(POLLUX_CONSTANTS)}"
        )
    if job.num_replicas < 1 or job.batch_size < 1 or job.time < 0:
        raise ValueError(f"need num_replicas >= 1, batch_size >= 1 and time >= 0, got {row}")
    return job


def read_workload(path: str | Path) -> list[WorkloadJob]:
    """A Pollux workload CSV (``name,time,application,num_replicas,batch_size``), by time."""
    p = Path(path)
    columns = ("name", "time", "application", "num_replicas", "batch_size")
    try:
        jobs = parse_csv(p, columns, _workload_job)
    except PredictorError as exc:
        raise AllocatorError(f"--workload {exc}") from None
    if not jobs:
        raise AllocatorError(f"{p}: no jobs")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise AllocatorError(f"{p}: job names are not unique")
    return sorted(jobs, key=lambda j: (j.time, j.name))


# Philly jobs are mapped to applications by GPU time, in the Pollux study's size classes.
_PHILLY_CLASSES = (
    (3600.0, ("cifar10", "ncf")),  # small: < 1 GPU-hour
    (36000.0, ("deepspeech2", "bert")),  # medium: 1-10 GPU-hours
    (360000.0, ("yolov3",)),  # large: 10-100 GPU-hours
    (math.inf, ("imagenet",)),  # extra large
)

#: The models Synergy's artifact draws for an image, language and speech job.
_SYNERGY_ZOO = (
    ("alexnet", "res18", "res50", "mobilenet", "shufflenet"),
    ("gnmt", "transformer", "lstm"),
    ("m5", "deepspeech"),
)

#: How long a Philly draw's jobs run (:func:`read_philly`).
Durations = Literal["app", "philly", "synergy"]
DURATIONS: tuple[Durations, ...] = ("app", "philly", "synergy")

#: The Philly jobs Synergy's artifact keeps (``helpers/parse_philly_trace_full.py``): those
#: that ran 10**1.5 to 10**4 minutes; with their own durations, 1, 2, 4, 8 or 16 GPUs.
_SYNERGY_DURATION_S = (10**1.5 * 60, 10**4 * 60)
_SYNERGY_GPUS = frozenset({1, 2, 4, 8, 16})

#: With a class split (Synergy's experiments: image, language, speech): each class's
#: application in each of the size classes above.
_SPLIT_CLASSES = (
    ("cifar10", "yolov3", "yolov3", "imagenet"),  # image
    ("ncf", "bert", "bert", "bert"),  # language (ncf: CPU-light as the language profiles)
    ("deepspeech2",) * 4,  # speech
)


def jitter_arrivals(jobs: Sequence[WorkloadJob], seed: int, seconds: float) -> list[WorkloadJob]:
    """``jobs`` with each arrival moved by up to ``seconds`` either way (uniform, no earlier
    than 0), the same for a seed: one workload run several times tells a policy's effect from
    the luck of its arrival times."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise AllocatorError(f"jitter seconds={seconds}: expected a finite number >= 0")
    if seconds == 0:
        return list(jobs)
    rng = np.random.default_rng(seed)
    shifts = rng.uniform(-seconds, seconds, len(jobs))
    return [replace(j, time=max(j.time + float(d), 0.0)) for j, d in zip(jobs, shifts, strict=True)]


def read_philly(
    path: str | Path,
    apps: dict[str, AppTrace],
    *,
    num_jobs: int,
    seed: int = 0,
    time_scale: float = 1.0,
    max_gpus: int | None = None,
    jobs_per_hour: float | None = None,
    class_split: tuple[float, float, float] | None = None,
    durations: Durations = "app",
    synergy_models: bool = False,
) -> list[WorkloadJob]:
    """``num_jobs`` consecutive Philly arrivals from a random start, mapped to applications.

    Each job keeps its GPU count (capped at ``max_gpus``) and its arrival time relative to the
    first, divided by ``time_scale`` (> 1 compresses time, raising the load). Its application is
    drawn among those of its GPU-time class; its batch size is the validated batch closest to
    GPU count x the geometric middle of the application's local batch range. Rows with missing
    fields are skipped.

    ``jobs_per_hour``: steady load instead of the trace's own arrivals. The same jobs, in the
    same order, arrive as a Poisson process at that rate (exponential gaps, drawn from
    ``seed``): the load of Synergy's experiments (jobs arriving at a set rate for hours), where
    a 160-job window of the trace is a burst or a lull.

    ``class_split``: weights of image, language and speech jobs (Synergy's experiments:
    20, 70, 10). Each job's class is drawn by these weights, then its application within the
    class by its GPU time (image: cifar10 under 1 GPU-hour, yolov3 to 100, imagenet above;
    language: ncf under 1 GPU-hour, bert above; speech: deepspeech2).

    ``durations``: how long each job runs (``WorkloadJob.duration_s``). ``app``: its
    application's length. The others are the two of Synergy's artifact
    (``helpers/parse_philly_trace_full.py``), which keeps the jobs that ran 10**1.5 to 10**4
    minutes on at most 16 GPUs: ``philly``, as long as the job ran in the trace (its Fig. 6;
    only 1, 2, 4, 8 or 16 GPUs kept); ``synergy``, a length drawn as the artifact's default
    (Figs. 7-8: 10**U minutes, U uniform on 1.5-3 for 80% of jobs and 3-4 for the rest; a GPU
    count that is not a power of two becomes 1).

    ``synergy_models`` (with ``class_split``): each job's input pipeline is one of the models
    Synergy's artifact draws for its class (``jobs/model_zoo.py``: image alexnet, res18, res50,
    mobilenet, shufflenet; language gnmt, transformer, lstm; speech m5, deepspeech), uniformly
    (``WorkloadJob.cpu_profile``); its GPUs still run its application.
    """
    p = Path(path)
    if num_jobs < 1 or not time_scale > 0:
        raise AllocatorError(f"{num_jobs=} must be >= 1 and {time_scale=} > 0")
    if jobs_per_hour is not None and not (math.isfinite(jobs_per_hour) and jobs_per_hour > 0):
        raise AllocatorError(f"jobs per hour {jobs_per_hour}: expected a finite number > 0")
    if durations not in DURATIONS:
        raise AllocatorError(f"durations={durations!r}: expected one of {', '.join(DURATIONS)}")
    if class_split is not None and not (
        len(class_split) == 3
        and all(math.isfinite(w) and w >= 0 for w in class_split)
        and sum(class_split) > 0
    ):
        raise AllocatorError(
            f"class split {class_split}: expected three weights >= 0 (image, language, "
            "speech), not all 0"
        )
    if synergy_models and class_split is None:
        raise AllocatorError("synergy_models: expected with a class split")
    rows = []
    try:
        with gzip.open(p, "rt", newline="") if p.suffix == ".gz" else p.open(newline="") as f:
            for row in csv.DictReader(f):
                try:
                    t = datetime.fromisoformat(row["timestamp"]).timestamp()
                    gpus, gpu_time = int(row["num_gpus"]), float(row["gpu_time"])
                    duration = float(row["duration"]) if durations != "app" else None
                except (KeyError, TypeError, ValueError):
                    continue
                if duration is not None:
                    lo, hi = _SYNERGY_DURATION_S
                    if not (lo < duration < hi and gpus <= 16):
                        continue
                    if gpus not in _SYNERGY_GPUS:
                        if durations == "philly":
                            continue
                        gpus = 1
                rows.append((t, gpus, gpu_time, duration))
    except FileNotFoundError:
        raise AllocatorError(f"--philly {p} does not exist") from None
    if len(rows) < num_jobs:
        raise AllocatorError(f"{p}: {len(rows)} usable jobs, fewer than {num_jobs=}")
    rows.sort()
    rng = random.Random(seed)
    start = rng.randrange(len(rows) - num_jobs + 1)
    window = rows[start : start + num_jobs]
    t0 = window[0][0]
    jobs = []
    for i, (t, gpus, gpu_time, duration) in enumerate(window):
        size = next(n for n, (limit, _) in enumerate(_PHILLY_CLASSES) if gpu_time < limit)
        profile = None
        if class_split is None:
            app = apps[rng.choice(_PHILLY_CLASSES[size][1])]
        else:
            kind = rng.choices(range(3), weights=class_split)[0]
            app = apps[_SPLIT_CLASSES[kind][size]]
            profile = rng.choice(_SYNERGY_ZOO[kind]) if synergy_models else None
        if durations == "synergy":
            duration = 60 * 10 ** (
                rng.uniform(3, 4) if rng.random() >= 0.8 else rng.uniform(1.5, 3)
            )
        k = max(1, min(gpus, max_gpus or gpus))
        lo, hi = app.local_bsz_range
        want = k * math.sqrt(lo * hi)
        batch = int(min(app.validated_batches, key=lambda b: abs(math.log(b / want))))
        jobs.append(
            WorkloadJob(
                f"{app.name}-{i}", (t - t0) / time_scale, app.name, k, batch, duration, profile
            )
        )
    if jobs_per_hour is not None:
        gaps = np.random.default_rng(seed).exponential(3600.0 / jobs_per_hour, len(jobs))
        gaps[0] = 0.0  # the first job opens the run, as in a window of the trace
        jobs = [replace(j, time=float(t)) for j, t in zip(jobs, np.cumsum(gaps), strict=True)]
    return jobs
