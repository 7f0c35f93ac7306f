"""Emulated-accelerator testbed: training jobs with realistic data-loading costs, no GPU needed.

A job is a per-sample I/O latency ``io_ms`` (a sleep: remote storage), a per-sample CPU cost
``cpu_ms`` (busy work measured on the thread's CPU clock, so that contention for cores slows it as
it slows real decoding) and an accelerator step per batch, a sleep of
``step(b) = base + per_sample * b`` milliseconds during which the CPU is free. The accelerator
limit of a job is ``b / step(b)`` samples/s. See ``docs/architecture.md``, "The
emulated-accelerator testbed".

Run one job from the command line::

    python -m dloader.apps.testbed --profile io_heavy --workers 8 --seconds 10
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.data import Dataset

from dloader._shared.cli import finite
from dloader._shared.node_messages import MAX_NICE
from dloader.apps import pipelines

__all__ = [
    "PROFILES",
    "REAL_MIX",
    "EmulatedDataset",
    "Profile",
    "RunResult",
    "burn_cpu",
    "cpu_per_sample_ms",
    "main",
    "make_dataset",
    "run_job",
    "warm",
]


@dataclass(frozen=True)
class Profile:
    """An emulated training job. Times in milliseconds."""

    name: str
    io_ms: float
    """Per-sample I/O latency (sleep)."""
    cpu_ms: float
    """Per-sample CPU work (thread CPU time)."""
    batch_size: int
    """Default batch size."""
    step_base_ms: float
    """Accelerator step: fixed part."""
    step_per_sample_ms: float
    """Accelerator step: part per sample in the batch."""
    main_cpu_ms: float = 0.0
    """Per-sample CPU work of the training process itself, each step (host-side work: a
    Python loop, a loss on the CPU, the copies; thread CPU time, before the accelerator step).
    It competes for the node's cores with every job's loader workers."""
    pipeline: str = "emulated"
    """The data: ``emulated`` (``io_ms`` and ``cpu_ms`` per sample), or a real pipeline of
    :mod:`dloader.apps.pipelines` (``jpeg``, ``text``, ``remote``: costs vary per sample; ``io_ms``
    and ``cpu_ms`` are then their measured means, for information)."""

    def step_s(self, batch_size: int) -> float:
        """Accelerator time for one batch, seconds: ``base + per_sample * b``."""
        return (self.step_base_ms + self.step_per_sample_ms * batch_size) / 1000.0

    def trainer_s(self, batch_size: int) -> float:
        """The training process's own CPU time for one batch, seconds."""
        return self.main_cpu_ms * batch_size / 1000.0

    def scaled(self, io: float = 1.0, cpu: float = 1.0, step: float = 1.0) -> Profile:
        """This profile with its per-sample I/O and CPU costs and its accelerator step times
        ``io``, ``cpu`` and ``step`` (a variation of it: ``--io-scale`` and the rest; ``step``
        scales the whole training step, the trainer's own CPU work with it)."""
        return replace(
            self,
            io_ms=self.io_ms * io,
            cpu_ms=self.cpu_ms * cpu,
            step_base_ms=self.step_base_ms * step,
            step_per_sample_ms=self.step_per_sample_ms * step,
            main_cpu_ms=self.main_cpu_ms * step,
        )

    def limit(self, batch_size: int | None = None) -> float:
        """Accelerator-bound throughput at ``batch_size`` (default: the profile's), samples/s:
        the step, the trainer's own CPU work included (on an idle core)."""
        b = self.batch_size if batch_size is None else batch_size
        return b / (self.step_s(b) + self.trainer_s(b))


#: The three profiles of docs/architecture.md.
PROFILES: dict[str, Profile] = {
    "io_heavy": Profile(
        "io_heavy", io_ms=8.0, cpu_ms=0.3, batch_size=32, step_base_ms=4.0, step_per_sample_ms=0.5
    ),
    "cpu_heavy": Profile(
        "cpu_heavy", io_ms=0.0, cpu_ms=3.0, batch_size=32, step_base_ms=8.0, step_per_sample_ms=1.0
    ),
    "gpu_bound": Profile(
        "gpu_bound", io_ms=1.0, cpu_ms=0.5, batch_size=32, step_base_ms=40.0, step_per_sample_ms=5.0
    ),
    # a trainer that needs most of a core itself (host-side work each step): the loader workers
    # of its neighbours take that core from it
    "host_heavy": Profile(
        "host_heavy",
        io_ms=1.0,
        cpu_ms=0.6,
        batch_size=32,
        step_base_ms=2.0,
        step_per_sample_ms=0.2,
        main_cpu_ms=1.0,
    ),
    # real pipelines (dloader.apps.pipelines), costs measured on a 2-core EPYC
    "image_jpeg": Profile("image_jpeg", 0.0, 4.1, 32, 8.0, 0.6, pipeline="jpeg"),
    # the same decode and crop, sent as uint8 for the accelerator to normalise (a quarter of
    # the bytes: what a loader whose batches cross a network sends)
    "image_jpeg_u8": Profile("image_jpeg_u8", 0.0, 3.9, 32, 8.0, 0.6, pipeline="jpeg_u8"),
    "text_pack": Profile("text_pack", 0.0, 1.6, 32, 6.0, 0.3, pipeline="text"),
    "remote_read": Profile("remote_read", 10.4, 0.2, 32, 4.0, 0.4, pipeline="remote"),
}
#: The real-pipeline mix (the accelerator emulated, the data real).
REAL_MIX = ("image_jpeg", "text_pack", "remote_read")


def make_dataset(
    profile: Profile,
    length: int,
    jpegs: int = pipelines.JPEGS,
    slow_from: float = math.inf,
    slow_factor: float = 2.0,
) -> Dataset[Any]:
    """The dataset of ``profile`` with ``length`` samples (``jpegs``: files generated once into
    :func:`dloader.apps.pipelines.default_cache` for the image pipeline; ``slow_from``: an
    emulated profile's samples cost ``slow_factor`` times as much from this ``time.time()`` on)."""
    if profile.pipeline == "emulated":
        return EmulatedDataset(
            length, profile.io_ms, profile.cpu_ms, slow_from=slow_from, slow_factor=slow_factor
        )
    if slow_from != math.inf:
        raise ValueError(f"profile {profile.name}: only emulated profiles can slow down")
    if profile.pipeline in ("jpeg", "jpeg_u8"):
        return pipelines.JpegImages(
            pipelines.jpeg_files(jpegs), length, normalise=profile.pipeline == "jpeg"
        )
    if profile.pipeline == "text":
        return pipelines.PackedText(length)
    if profile.pipeline == "remote":
        return pipelines.RemoteReads(length)
    raise ValueError(
        f"profile {profile.name}: pipeline={profile.pipeline!r}, expected emulated, jpeg, "
        "jpeg_u8, text or remote"
    )


def warm(profile: Profile, jpegs: int = pipelines.JPEGS) -> int:
    """The files a job of ``profile`` reads (``jpegs``: how many, for the image pipeline),
    generated where missing and read once into the page cache; returns the bytes read (0: a
    profile that reads no files). Before each run of a comparison
    (:func:`dloader.apps.experiment.run_jobs`): otherwise the first run reads them from disk
    and the later ones from memory (on a machine where they had not been read, an image job's
    storage time was 60-120 ms a sample for its first 20 s, against none once cached)."""
    if profile.pipeline not in ("jpeg", "jpeg_u8"):
        return 0
    return pipelines.read_through(pipelines.jpeg_files(jpegs))


def cpu_per_sample_ms(
    profile: Profile, seconds: float = 3.0, jpegs: int = pipelines.JPEGS
) -> float:
    """What a sample of ``profile`` costs the node's CPU here, in milliseconds: the loader
    workers' and the training process's CPU time (decode, collate, the hand-over between
    them) over a torch ``DataLoader`` (one worker; up to 8 for an I/O-bound profile, whose
    samples cost little CPU each), from each worker's first batch on (their start left out),
    for about ``seconds`` by the profile's nominal costs. The figures in
    :data:`PROFILES` for real pipelines are from another machine (on this project's 2-core
    runners a JPEG sample cost 2.2 ms, not 4.1). Emulated profiles cost what they say (a spin
    on thread CPU time), plus the hand-over."""
    import psutil
    from torch.utils.data import DataLoader

    if not (math.isfinite(seconds) and 0 < seconds <= 600):
        raise ValueError(f"seconds={seconds}: expected a duration within (0, 600]")
    # I/O-bound: enough workers that the CPU time spent is many clock ticks (10 ms) long
    workers = 1 if profile.io_ms <= profile.cpu_ms else min(8, math.ceil(profile.io_ms / 2))
    per_batch_s = profile.batch_size * max(profile.io_ms + profile.cpu_ms, 0.01) / 1000 / workers
    batches = min(max(round(seconds / per_batch_s), 4), 1000)
    warm(profile, jpegs)
    # more batches than are read: the workers are still there to be read at the end
    data = make_dataset(profile, (batches + 3 * workers) * profile.batch_size, jpegs=jpegs)
    me = psutil.Process()

    def used() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in (me, *me.children()))

    with warnings.catch_warnings():  # more workers than cores, on purpose
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        it = iter(DataLoader(data, profile.batch_size, num_workers=workers))
    for _ in range(workers):  # a batch from each: every worker has started
        next(it)
    before, samples = used(), 0
    for _ in range(batches):
        samples += _batch_len(next(it))
    spent = used() - before
    del it
    return spent / samples * 1000


def burn_cpu(seconds: float) -> None:
    """Spins until this thread has used ``seconds`` of CPU time (not wall time)."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i * i


class EmulatedDataset(Dataset[Any]):
    """A map-style dataset whose samples cost ``io_ms`` of waiting and ``cpu_ms`` of CPU.

    Each sample is ``torch.tensor(index)``, plus a ``payload_bytes`` uint8 tensor when asked for
    (to include inter-process transfer costs). From ``slow_from`` (a ``time.time()``) on, each
    sample costs ``slow_factor`` times as much (a pipeline whose cost changes mid-run).
    """

    def __init__(
        self,
        length: int,
        io_ms: float = 0.0,
        cpu_ms: float = 0.0,
        payload_bytes: int = 0,
        slow_from: float = math.inf,
        slow_factor: float = 2.0,
    ) -> None:
        if length < 0:
            raise ValueError(f"length={length} must be >= 0")
        if io_ms < 0 or cpu_ms < 0 or payload_bytes < 0:
            raise ValueError(f"{io_ms=}, {cpu_ms=} and {payload_bytes=} must be >= 0")
        if not (math.isfinite(slow_factor) and slow_factor > 0):
            raise ValueError(f"slow_factor={slow_factor}: expected a finite number > 0")
        self.length = length
        self.io_ms = io_ms
        self.cpu_ms = cpu_ms
        self.payload_bytes = payload_bytes
        self.slow_from = slow_from
        self.slow_factor = slow_factor

    @classmethod
    def from_profile(cls, profile: Profile, length: int, payload_bytes: int = 0) -> EmulatedDataset:
        """The dataset of ``profile`` with ``length`` samples."""
        return cls(length, profile.io_ms, profile.cpu_ms, payload_bytes)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for EmulatedDataset of {self.length}")
        scale = self.slow_factor if time.time() >= self.slow_from else 1.0
        if self.io_ms:
            time.sleep(scale * self.io_ms / 1000.0)
        burn_cpu(scale * self.cpu_ms / 1000.0)
        if self.payload_bytes:
            return torch.tensor(index), torch.zeros(self.payload_bytes, dtype=torch.uint8)
        return torch.tensor(index)


@dataclass
class RunResult:
    """What a run of :func:`run_job` measured."""

    samples: int
    steps: int
    elapsed_seconds: float
    wait_seconds: float
    #: per step: (seconds since start at the end of the step, samples in the batch, wait seconds)
    timeline: list[tuple[float, int, float]] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        """Mean delivered throughput."""
        return self.samples / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    @property
    def idle_share(self) -> float:
        """Share of the run the emulated accelerator waited for data."""
        return self.wait_seconds / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0

    def window(self, start_s: float, end_s: float) -> tuple[float, float]:
        """(samples/s, idle share) over steps ending within ``[start_s, end_s)``."""
        rows = [r for r in self.timeline if start_s <= r[0] < end_s]
        span = end_s - start_s
        if not rows or span <= 0:
            return 0.0, 0.0
        return sum(r[1] for r in rows) / span, sum(r[2] for r in rows) / span


def _batch_len(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1


def run_job(
    loader: Iterable[Any],
    profile: Profile,
    *,
    seconds: float | None = None,
    max_steps: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
    batch_size: Callable[[], int] | None = None,
    step: Callable[[Any], None] | None = None,
) -> RunResult:
    """Trains the emulated job: iterate ``loader``; for each batch, the trainer's own CPU work
    (``main_cpu_ms``, if any), then a sleep for the accelerator step.

    Args:
        loader: any iterable of batches (a dloader or torch DataLoader).
        profile: the job's accelerator step model.
        seconds: stop after this much wall time (epochs restart as needed).
        max_steps: stop after this many steps.
        on_step: called after each step with (step index, seconds since start).
        batch_size: current batch size, for the step time (default: the batch's length).
        step: a real training step, run on each batch instead of the sleep
            (:func:`dloader.apps.gpu_step.train_step`).
    """
    if seconds is None and max_steps is None:
        raise ValueError("run_job needs seconds= or max_steps=")
    start = time.perf_counter()
    result = RunResult(0, 0, 0.0, 0.0)
    while True:
        it: Iterator[Any] = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            n = _batch_len(batch)
            if step is not None:
                step(batch)
            else:
                b = batch_size() if batch_size else n
                burn_cpu(profile.trainer_s(b))
                time.sleep(profile.step_s(b))
            now = time.perf_counter() - start
            result.samples += n
            result.steps += 1
            result.wait_seconds += t1 - t0
            result.timeline.append((now, n, t1 - t0))
            if on_step is not None:
                on_step(result.steps, now)
            if (seconds is not None and now >= seconds) or (
                max_steps is not None and result.steps >= max_steps
            ):
                result.elapsed_seconds = now
                close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
                if close is not None:
                    close()
                return result
        if result.steps == 0:
            raise ValueError("the loader yielded no batch")


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a count nor 'auto'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _nice_worker(nice: int, worker_id: int) -> None:
    from dloader._agent.agent import raise_nice

    raise_nice(os.getpid(), nice)


def exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """Ends this process (SIGTERM to itself: its loader's workers follow) once ``parent`` is no
    longer its parent: the harness that started it exited, or was killed."""
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="dloader-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Command line: run one emulated job and print its throughput and idle share."""
    parser = argparse.ArgumentParser(
        prog="python -m dloader.apps.testbed",
        description="Run one emulated training job (no GPU needed) and report its throughput "
        "and accelerator-idle share. Profiles: "
        + "; ".join(
            f"{p.name} (io {p.io_ms} ms, cpu {p.cpu_ms} ms per sample, limit "
            f"{p.limit():.0f} samples/s)"
            for p in PROFILES.values()
        ),
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="io_heavy",
        help="job profile (default: %(default)s)",
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=2,
        help="loader workers, or 'auto' (dloader only: it tunes the count; default: 2)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="batch size (default: the profile's)"
    )
    parser.add_argument(
        "--prefetch-factor",
        type=int,
        default=None,
        help="batches each worker may hold undelivered (default: the loader's, 2)",
    )
    parser.add_argument(
        "--seconds",
        type=finite,
        default=None,
        help="how long to train (default: 10, unless --samples is given)",
    )
    parser.add_argument(
        "--samples", type=int, default=None, help="train this many samples instead of a fixed time"
    )
    parser.add_argument(
        "--loader",
        choices=["dloader", "torch"],
        default="dloader",
        help="which DataLoader to use (default: %(default)s)",
    )
    parser.add_argument(
        "--sidecar", default=None, help="join the node sidecar at unix:///path.sock (dloader only)"
    )
    parser.add_argument(
        "--job-name",
        default=None,
        help="the job's name at the sidecar (its id at the cluster allocator; default: the "
        "profile's name)",
    )
    parser.add_argument(
        "--stats-window",
        type=finite,
        default=2.0,
        help="the loader's telemetry window, seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--device",
        choices=["emulated", "cuda"],
        default="emulated",
        help="the accelerator: emulated (a sleep per step), or cuda: a real model trained on "
        "this node's GPU (image_jpeg: ResNet-18; text_pack: a transformer; default: %(default)s)",
    )
    parser.add_argument(
        "--out", default=None, help="write a JSON timeline (time, samples, wait, workers per step)"
    )
    parser.add_argument(
        "--jpegs",
        type=int,
        default=pipelines.JPEGS,
        help="image_jpeg: JPEG files to generate once into the cache and read (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--slowdown-at",
        type=finite,
        default=None,
        metavar="SECONDS",
        help="emulated profiles: each sample costs --slowdown-factor times as much from this "
        "second of the run on",
    )
    parser.add_argument(
        "--slowdown-factor",
        type=finite,
        default=2.0,
        metavar="X",
        help="with --slowdown-at: how many times a sample's cost it becomes (0.5: half; "
        "default: %(default)s)",
    )
    for part, what in (
        ("io", "emulated profiles: per-sample I/O latency"),
        ("cpu", "emulated profiles: per-sample CPU work"),
        ("step", "the emulated accelerator's step (its limit divides by this)"),
    ):
        parser.add_argument(
            f"--{part}-scale",
            type=finite,
            default=1.0,
            metavar="X",
            help=f"{what}, times X (a variation of the profile; default: 1)",
        )
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=0,
        metavar="N",
        help="run the loader workers at nice N (0-19), set in each worker as it starts "
        "(worker_init_fn): what a user can do by hand for every job without a sidecar "
        "(default: 0, left alone)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="remote loader workers on this Ray cluster (dloader only; docs/remote.md)",
    )
    parser.add_argument(
        "--remote-workers",
        type=int,
        default=0,
        help="with --ray-address: remote workers to start with (default 0; the sidecar may "
        "direct more, up to --remote-max)",
    )
    parser.add_argument(
        "--remote-max", type=int, default=8, help="with --ray-address: the most (default 8)"
    )
    parser.add_argument(
        "--remote-resource",
        default="",
        help="with --ray-address: a custom Ray resource each remote worker needs (the pool's)",
    )
    parser.add_argument(
        "--parent",
        type=int,
        default=None,
        help="exit when this process is no longer this job's parent (the experiment harness "
        "passes its PID: a stopped harness leaves no job behind)",
    )
    args = parser.parse_args(argv)
    if args.parent is not None:
        exit_with_parent(args.parent)
    if args.slowdown_at is not None and not (
        args.slowdown_at >= 0 and PROFILES[args.profile].pipeline == "emulated"
    ):
        parser.error(
            f"--slowdown-at={args.slowdown_at}: expected seconds >= 0, for an emulated profile "
            f"(io_heavy, cpu_heavy, gpu_bound, host_heavy), not {args.profile}"
        )
    for name in ("slowdown_factor", "io_scale", "cpu_scale", "step_scale"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected > 0")
    if (args.io_scale, args.cpu_scale) != (1.0, 1.0) and (
        PROFILES[args.profile].pipeline != "emulated"
    ):
        parser.error(
            "--io-scale/--cpu-scale: only emulated profiles (io_heavy, cpu_heavy, gpu_bound, "
            f"host_heavy) have costs to scale, not {args.profile} (its data sets them)"
        )
    if not 0 <= args.worker_nice <= MAX_NICE:
        parser.error(f"--worker-nice={args.worker_nice}: expected 0..{MAX_NICE}")
    if args.seconds is not None and args.samples is not None:
        parser.error("give --seconds or --samples, not both")
    if args.seconds is None and args.samples is None:
        args.seconds = 10.0
    if args.workers == "auto" and args.loader == "torch":
        parser.error("--workers auto needs --loader dloader")
    if args.seconds is not None and args.seconds <= 0:
        parser.error(f"--seconds={args.seconds} must be > 0")
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples={args.samples} must be >= 1")
    if args.prefetch_factor is not None and not (args.prefetch_factor >= 1 and args.workers != 0):
        parser.error(
            f"--prefetch-factor={args.prefetch_factor}: expected >= 1, with --workers above 0"
        )
    if args.sidecar and args.loader == "torch":
        parser.error("--sidecar needs --loader dloader")
    if args.ray_address and args.loader == "torch":
        parser.error("--ray-address needs --loader dloader")
    if not 0 <= args.remote_workers <= args.remote_max:
        parser.error(
            f"--remote-workers={args.remote_workers}: expected 0..--remote-max={args.remote_max}"
        )
    profile = PROFILES[args.profile].scaled(args.io_scale, args.cpu_scale, args.step_scale)
    if args.device == "cuda":
        from dloader.apps.gpu_step import PIPELINES

        if profile.pipeline not in PIPELINES:
            parser.error(
                f"--device cuda: a real model exists for image_jpeg and text_pack, not "
                f"{profile.name}"
            )
        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device on this node")
    bs = args.batch_size or profile.batch_size
    if bs < 1:
        parser.error(f"--batch-size={bs} must be >= 1")
    started = time.time()
    slow_from = math.inf if args.slowdown_at is None else started + args.slowdown_at
    dataset = make_dataset(profile, 1_000_000, args.jpegs, slow_from, args.slowdown_factor)
    init = functools.partial(_nice_worker, args.worker_nice) if args.worker_nice else None
    if args.loader == "torch":
        loader: Any = torch.utils.data.DataLoader(
            dataset,
            batch_size=bs,
            shuffle=True,
            num_workers=args.workers,
            prefetch_factor=args.prefetch_factor,
            pin_memory=args.device == "cuda",
            worker_init_fn=init,
        )
    else:
        from dloader import DataLoader, RayWorkers

        remote = None
        if args.ray_address:
            remote = RayWorkers(
                args.remote_workers,
                address=args.ray_address,
                max_workers=args.remote_max,
                resources={args.remote_resource: 1.0} if args.remote_resource else {},
            )
        loader = DataLoader(
            dataset,
            batch_size=bs,
            shuffle=True,
            num_workers=args.workers,
            prefetch_factor=args.prefetch_factor,
            pin_memory=args.device == "cuda",
            sidecar=args.sidecar,
            job_name=args.job_name or profile.name,
            stats_window_s=args.stats_window,
            remote=remote,
            worker_init_fn=init,
        )
    what = f"{args.seconds:g} s" if args.seconds is not None else f"{args.samples:,} samples"
    print(
        f"{args.loader}: {profile.name}, {args.workers} workers, batch {bs}, {what} ...",
        file=sys.stderr,
    )
    workers: list[int] = []
    remote_workers: list[int] = []

    def on_step(step: int, now: float) -> None:
        workers.append(loader.num_workers)
        remote_workers.append(getattr(loader, "remote_workers", 0))

    steps = None if args.samples is None else -(-args.samples // bs)
    step = None
    if args.device == "cuda":
        from dloader.apps.gpu_step import train_step

        step = train_step(profile.pipeline)
    r = run_job(loader, profile, seconds=args.seconds, max_steps=steps, on_step=on_step, step=step)
    agent = getattr(loader, "sidecar_agent", None)
    if agent is not None:
        agent.stop()
    if step is None:
        print(
            f"{profile.name}: samples/s {r.samples_per_second:.0f} (limit "
            f"{profile.limit(bs):.0f}, {r.samples_per_second / profile.limit(bs):.0%}), "
            f"accelerator idle {r.idle_share:.0%}"
        )
    else:
        print(f"{profile.name}: samples/s {r.samples_per_second:.0f}, GPU idle {r.idle_share:.0%}")
    tuner = loader.stats().tuner if args.loader == "dloader" else ""
    if tuner:
        print(tuner)
    if args.out:
        timeline = [(t, n, w, k) for (t, n, w), k in zip(r.timeline, workers, strict=True)]
        with open(args.out, "w") as f:
            json.dump(
                {
                    "profile": profile.name,
                    "limit": profile.limit(bs),
                    "timeline": timeline,
                    "remote_workers": remote_workers,
                    "started": started,
                    "tuner": tuner,
                    "search_s": getattr(getattr(loader, "autotuner", None), "search_s", None),
                    "ended": time.time(),
                },
                f,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
