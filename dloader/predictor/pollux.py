"""Readers for the Pollux (OSDI 2021) job profiles, one folder per application
(``<traces>/<app>/``; the package ships them: ``dloader.allocator.traces.PACKAGED_TRACES``).

I/O lives here, apart from the models: each function returns plain values.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from dloader.errors import PredictorError
from dloader.predictor._scaling import ScalingPoint, placement_shape

T = TypeVar("T")

__all__ = [
    "APPLICATIONS",
    "EpochStats",
    "parse_csv",
    "read_placements",
    "read_scalability",
    "read_validation",
    "validated_batch_sizes",
]

#: The six applications of the Pollux traces.
APPLICATIONS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


@dataclass(frozen=True)
class EpochStats:
    """One row of ``validation-<B>.csv``: the state after an epoch of training at batch ``B``."""

    progress: float
    """Training progress in base steps (base-batch samples / base batch, at full efficiency)."""
    iteration: int
    """Steps taken at batch ``B`` so far."""
    metric: float
    grad_sqr: float
    grad_var: float


def _rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise PredictorError(f"{path}: missing column(s) {missing}; expected {columns}")
            return list(reader)
    except FileNotFoundError:
        raise PredictorError(f"{path} does not exist") from None


def parse_csv(path: Path, columns: tuple[str, ...], make: Callable[[dict[str, str]], T]) -> list[T]:
    """Every data row of the CSV at ``path`` through ``make``.

    A missing file or column, or a row ``make`` rejects (``ValueError``), raises
    :class:`PredictorError` naming the file and the data row."""
    out = []
    for i, row in enumerate(_rows(path, columns)):
        try:
            out.append(make(row))
        except (ValueError, PredictorError) as exc:
            raise PredictorError(f"{path}, data row {i + 1}: {exc}") from None
    return out


def _point(row: dict[str, str], nodes: int, replicas: int) -> ScalingPoint:
    return ScalingPoint(
        nodes, replicas, int(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"])
    )


def read_placements(app_dir: str | Path) -> list[tuple[str, ScalingPoint]]:
    """``placements.csv`` as (placement string, point) pairs."""
    return parse_csv(
        Path(app_dir) / "placements.csv",
        ("placement", "local_bsz", "step_time", "sync_time"),
        lambda r: (r["placement"], _point(r, *placement_shape(r["placement"]))),
    )


def read_scalability(app_dir: str | Path) -> list[ScalingPoint]:
    """``scalability.csv`` (larger scales) as points."""
    return parse_csv(
        Path(app_dir) / "scalability.csv",
        ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"),
        lambda r: _point(r, int(r["num_nodes"]), int(r["num_replicas"])),
    )


def validated_batch_sizes(app_dir: str | Path) -> list[int]:
    """Global batch sizes with a ``validation-<B>.csv``, ascending."""
    sizes = []
    for p in Path(app_dir).glob("validation-*.csv"):
        m = re.fullmatch(r"validation-(\d+)\.csv", p.name)
        if m:
            sizes.append(int(m.group(1)))
    if not sizes:
        raise PredictorError(f"{app_dir}: no validation-<B>.csv files")
    return sorted(sizes)


def read_validation(app_dir: str | Path, batch_size: int) -> list[EpochStats]:
    """``validation-<batch_size>.csv`` as per-epoch stats."""
    return parse_csv(
        Path(app_dir) / f"validation-{batch_size}.csv",
        ("progress", "iteration", "metric", "grad_sqr", "grad_var"),
        lambda r: EpochStats(
            float(r["progress"]),
            int(float(r["iteration"])),
            float(r["metric"]),
            float(r["grad_sqr"]),
            float(r["grad_var"]),
        ),
    )
