"""The tuner's thread logic (:meth:`AutoTuner.poll`) on a simulated loader with a clock of its own:
it measures windows by the loader's stats, converges and holds, ignores a paused trainer, and
stops when the user resizes. No processes and no wall clock: the same on any machine."""

from __future__ import annotations

import threading

from dloader._autotune.controller import POLL_S, AutoTuner
from dloader._autotune.peers import PeerBoard
from dloader._engine.control import ControlLimits
from dloader._engine.telemetry import LoaderStats, WorkerStats

BATCH = 8
FETCH_S = 0.032  # a worker fetches a batch in 32 ms (I/O-bound)
STEP_S = 0.004  # the trainer steps in 4 ms: it needs 8 workers


class SimulatedLoader:
    """A loader's controls over a throughput model: ``min(k * 250, 2000)`` samples/s at ``k``
    workers; the trainer waits for the rest of the time."""

    def __init__(self, workers: int) -> None:
        self.now, self.k = 1000.0, workers
        self.samples = self.wait = 0.0
        self.resizes: list[tuple[float, int]] = []
        self.paused = False

    def rate(self) -> float:
        return min(self.k * BATCH / FETCH_S, BATCH / STEP_S)

    def advance(self, dt: float) -> None:
        if not self.paused:
            self.samples += self.rate() * dt
            self.wait += dt * (1 - self.rate() * STEP_S / BATCH)
        self.now += dt

    def stats(self) -> LoaderStats:
        batches = int(self.samples // BATCH)
        workers = tuple(
            WorkerStats(i, None, "ready", max(batches // self.k, 1), 2, FETCH_S, 0.0003, 0.0)
            for i in range(self.k)
        )
        return LoaderStats(
            timestamp=self.now,
            num_workers=self.k,
            batch_size=BATCH,
            samples=batches * BATCH,
            batches=batches,
            epoch=1,
            wait_total_seconds=self.wait,
            window_seconds=5.0,
            samples_per_second=self.rate(),
            wait_seconds=0.0,
            step_seconds=STEP_S,
            idle_share=0.0,
            queue_depth=0,
            in_flight=2 * self.k,
            workers=workers,
        )

    def limits(self) -> ControlLimits:
        return ControlLimits(1, 0, 32, None, 2)

    def resize(self, num_workers: int, *, unless: threading.Event | None = None) -> bool:
        if unless is not None and unless.is_set():
            return False
        self.k = num_workers
        self.resizes.append((self.now, num_workers))
        return True

    def set_batch_size(self, batch_size: int) -> bool:
        return False


def run(tuner: AutoTuner, sim: SimulatedLoader, seconds: float) -> None:
    board = PeerBoard(enabled=False)
    for _ in range(round(seconds / POLL_S)):
        sim.advance(POLL_S)
        assert tuner.poll(board)


def test_it_converges_to_the_knee_and_holds() -> None:
    sim = SimulatedLoader(2)
    tuner = AutoTuner(sim, start=2, minimum=1, maximum=32, peers=False)
    run(tuner, sim, 60.0)
    assert tuner.tuner.phase == "hold", tuner.tuner.history
    assert sim.k == 8, tuner.tuner.history  # the fewest workers that feed the trainer
    assert tuner.search_s is not None and tuner.search_s < 30.0
    counts = [k for k, _ in tuner.tuner.history]
    assert counts[0] == 2 and max(counts) >= 8
    assert tuner.summary.startswith("auto: holding 8 workers")


def test_a_paused_trainer_discards_the_window_under_way() -> None:
    sim = SimulatedLoader(2)
    tuner = AutoTuner(sim, start=2, minimum=1, maximum=32, peers=False)
    run(tuner, sim, 0.2)  # settling: the window begins during the pause
    sim.paused = True
    run(tuner, sim, 10.0)  # no batch for longer than PAUSE_S: the window is dropped
    assert tuner.tuner.history == [] and sim.resizes == []
    sim.paused = False
    run(tuner, sim, 5.0)
    assert len(tuner.tuner.history) >= 1


def test_the_users_resize_stops_it() -> None:
    sim = SimulatedLoader(2)
    tuner = AutoTuner(sim, start=2, minimum=1, maximum=32, peers=False)
    tuner.stop("resize(3) called")
    board = PeerBoard(enabled=False)
    sim.advance(10.0)
    alive = True
    for _ in range(200):
        sim.advance(POLL_S)
        alive = tuner.poll(board)
        if not alive:
            break
    assert not alive and sim.resizes == []  # its first decision is refused: it ends
    assert tuner.summary == "auto: stopped (resize(3) called)"


def test_a_ceiling_from_the_sidecar_moves_it_down_at_once_and_bounds_its_search() -> None:
    sim = SimulatedLoader(2)
    tuner = AutoTuner(sim, start=2, minimum=1, maximum=32, peers=False)
    run(tuner, sim, 60.0)
    assert sim.k == 8
    tuner.limit(5)  # the sidecar's guided policy: at most 5
    run(tuner, sim, POLL_S)
    assert sim.k == 5 and tuner.tuner.phase == "search"
    assert "ceiling of 5 workers" in tuner.summary
    since = len(sim.resizes)
    run(tuner, sim, 60.0)
    assert all(k <= 5 for _, k in sim.resizes[since:]) and sim.k == 5
    tuner.limit(64)  # raised: never above what it was built with
    run(tuner, sim, POLL_S)
    assert tuner.tuner.maximum == 32 and sim.k == 5  # a raise moves nothing by itself
