"""How fast each simulated job's input pipeline is on the CPU cores it gets: Synergy's profiles.

The simulator's GPU behaviour comes from the Pollux traces (:mod:`.traces`), measured with
enough CPU to feed every GPU. With ``--cpus-per-node`` it also has CPUs, and a job's input
pipeline delivers at most ``R(c)`` samples/s on ``c`` cores; a job computes at the lesser of
what its GPUs do and what its pipeline feeds. ``R`` comes from Synergy's measured profiles
(Mohan et al., OSDI 2022; ``data/synergy/profiles.csv``, MIT, see ``data/NOTICE.md``): the speed
of twelve models at 1-24 cores per V100 GPU, relative to the GPU-proportional share.

**From a profile to an input curve.** At the largest host memory profiled (250 GB per GPU, so
that memory never binds; host memory is not modelled), a model's speed at ``u`` cores per GPU
over its speed at its ideal point is the share of its GPU-bound rate its pipeline feeds:
``f(u) = speed(u) / speedup_at_ideal``, for the rows up to the first that reaches the ideal. The
pipeline's samples/s on ``c`` cores is then ``X_ref * f(c / s)``, linear beyond the last row at
that row's rate per core (a loader with more cores runs more workers, each as fast), where:

* ``X_ref`` is the most samples/s one GPU computes for the application at any local batch it
  fits (the Pollux traces): Synergy profiled each model at a large batch per GPU (512 for the
  image models), where a GPU is at its fastest, so one GPU at its fastest needs the profile's
  ``u`` cores for the share ``f(u)``, whatever the application's absolute rate;
* ``s`` (``--gpu-speed``, default 1) is how many times faster than the profiled V100 the
  simulated GPUs are: a GPU ``s`` times faster eats samples ``s`` times as fast and needs ``s``
  times the cores for the same share (an H100 is about 3x a V100 on ResNet-50 training; the
  project's own H100 run needed 14 loader workers for ResNet-18 on JPEGs, ~1.5x the profile's 9).

The curve is one GPU's pipeline: each GPU of a job has its own loader (one per rank), so ``k``
GPUs on ``c`` cores of a node are fed ``k * R(c / k)`` there
(:func:`dloader.allocator.policies.cores.feed_rate`). Synergy's 2- and 4-GPU tables
(``simulator/models/<model>_2.py``, ``_4.py`` in its repository) give the same speed at the same
cores per GPU as its 1-GPU ones wherever the pipeline binds (checked in the tests). Because the
curve is in samples/s, a job at a larger batch (a GPU computes more samples/s at a larger local
batch) needs proportionally more cores.

**Which profile for which application** (:data:`APP_PROFILES`): the same network where Synergy
profiled it, else the closest in what its input costs:

* ``imagenet`` (ResNet-50 on ImageNet) -> ``res50``: the same network and data;
* ``cifar10`` (ResNet-18 on CIFAR-10) -> ``res18``: the same network; Synergy profiled it on
  ImageNet JPEGs, so this overstates what CIFAR-10's 32x32 arrays cost to load: read cifar10
  here as "ResNet-18 on an image dataset that must be decoded";
* ``yolov3`` (YOLOv3 on PASCAL VOC, 416x416 images, heavy augmentation) -> ``res50``: a
  convolutional net heavy on the GPU per image, whose pipeline decodes full-size JPEGs;
* ``deepspeech2`` -> ``deepspeech``: the same model;
* ``bert`` -> ``bert``: the same model, CPU-insensitive (one core per GPU feeds it);
* ``ncf`` (recommendation on MovieLens: integer ids) -> ``lstm``: no profile of a
  recommender; its input is a table lookup, as CPU-light as the flat language profiles.

Reading the file is the only I/O here; the curves are plain values.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dloader.allocator.traces import AppTrace
from dloader.errors import AllocatorError
from dloader.predictor import InputModel

__all__ = [
    "APP_PROFILES",
    "MEMORY_GB_PER_GPU",
    "PACKAGED_CPU_PROFILES",
    "SAMPLE_MB",
    "CpuProfile",
    "input_truth",
    "read_cpu_profiles",
]

#: Synergy's profiles, shipped with the package (MIT; see ``data/NOTICE.md``).
PACKAGED_CPU_PROFILES = Path(__file__).resolve().parent / "data" / "synergy" / "profiles.csv"
#: The host memory per GPU whose rows are read (the largest profiled: memory never binds).
MEMORY_GB_PER_GPU = 250.0
#: The profile each Pollux application is simulated with (see the module docstring for why).
APP_PROFILES = {
    "imagenet": "res50",
    "cifar10": "res18",
    "yolov3": "res50",
    "deepspeech2": "deepspeech",
    "bert": "bert",
    "ncf": "lstm",
}
#: MB a sample of each Pollux application weighs as its loader hands it over (what a remote
#: loader worker moves): estimates from the models' input shapes, not measured: ImageNet and
#: YOLOv3 crops as uint8 (224 x 224 x 3; 416 x 416 x 3), CIFAR-10 (32 x 32 x 3 uint8), a
#: DeepSpeech2 spectrogram (161 bins x ~300 frames, float32), a BERT sequence (384 tokens x 3
#: int64 tensors), an NCF (user, item, label) triple.
SAMPLE_MB = {
    "imagenet": 0.15,
    "cifar10": 0.003,
    "yolov3": 0.52,
    "deepspeech2": 0.19,
    "bert": 0.009,
    "ncf": 0.0001,
}
_COLUMNS = ("model", "cpus_per_gpu", "mem_gb_per_gpu", "speed", "speedup_at_ideal")


@dataclass(frozen=True)
class CpuProfile:
    """One model's profile: the share of its GPU-bound speed that ``u`` cores per GPU feed."""

    model: str
    points: tuple[tuple[float, float], ...]
    """``(cores per GPU, share fed)``, increasing, the last share 1 where the profile
    reaches its ideal."""

    def __post_init__(self) -> None:
        if not self.points:
            raise AllocatorError(f"CPU profile of {self.model!r} has no rows")

    def share(self, cores_per_gpu: float) -> float:
        """Share of one GPU's speed fed by ``cores_per_gpu`` cores (at most 1)."""
        return min(InputModel(self.points).rate(cores_per_gpu), 1.0)


def read_cpu_profiles(path: str | Path = PACKAGED_CPU_PROFILES) -> dict[str, CpuProfile]:
    """The profiles in a Synergy-format CSV (see the module docstring), by model name."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = set(_COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise AllocatorError(
                    f"CPU profiles {path}: missing column(s) {sorted(missing)}; expected "
                    f"{', '.join(_COLUMNS)} (the format of data/synergy/profiles.csv)"
                )
            rows: dict[str, list[tuple[float, float, float]]] = {}
            for n, row in enumerate(reader, start=2):
                try:
                    mem = float(row["mem_gb_per_gpu"])
                    cores, speed = float(row["cpus_per_gpu"]), float(row["speed"])
                    ideal = float(row["speedup_at_ideal"])
                except (TypeError, ValueError):
                    raise AllocatorError(
                        f"CPU profiles {path}, line {n}: expected numbers in "
                        f"cpus_per_gpu, mem_gb_per_gpu, speed, speedup_at_ideal, got {row}"
                    ) from None
                if not all(math.isfinite(v) and v > 0 for v in (cores, speed, ideal)):
                    raise AllocatorError(
                        f"CPU profiles {path}, line {n}: cores, speed and speedup_at_ideal must "
                        f"be finite and > 0, got {cores}, {speed}, {ideal}"
                    )
                if mem == MEMORY_GB_PER_GPU:
                    rows.setdefault(row["model"], []).append((cores, speed, ideal))
    except OSError as exc:
        raise AllocatorError(f"CPU profiles {path}: {exc.strerror or exc}") from None
    if not rows:
        raise AllocatorError(
            f"CPU profiles {path}: no rows at mem_gb_per_gpu={MEMORY_GB_PER_GPU:g} (the column "
            "read: memory never binds)"
        )
    out = {}
    for model, entries in rows.items():
        points: list[tuple[float, float]] = []
        for cores, speed, ideal in sorted(entries):
            share = min(speed / ideal, 1.0)
            points.append((cores, max(share, points[-1][1] if points else 0.0)))
            if share >= 1.0:
                break
        out[model] = CpuProfile(model, tuple(points))
    return out


def input_truth(
    app: AppTrace, profile: CpuProfile, gpu_speed: float = 1.0, x_ref: float | None = None
) -> InputModel:
    """The samples/s one GPU's input pipeline of ``app`` delivers on ``c`` cores (the
    simulator's ground truth): ``X_ref * share(c / gpu_speed)`` (see the module docstring;
    ``x_ref``: another ``X_ref``, e.g. one GPU's rate at a job's own batch)."""
    if not (math.isfinite(gpu_speed) and gpu_speed > 0):
        raise AllocatorError(f"gpu_speed={gpu_speed!r}: expected a finite number > 0")
    if x_ref is None:
        lo, hi = app.local_bsz_range
        bs = np.unique(np.geomspace(lo, hi, 16))
        x_ref = max(b / app.iteration_time((1,), int(b)) for b in bs)
    return InputModel(tuple((gpu_speed * u, x_ref * f) for u, f in profile.points))
