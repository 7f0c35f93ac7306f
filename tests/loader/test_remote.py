"""Remote loader workers (Ray actors on other nodes' CPUs), against a real local Ray cluster of
several nodes (``dloader.apps.raycluster``: its own process, so that this one holds no Ray or
gRPC threads when it forks local workers).

Exactly once and in order with remote workers beside local ones through resizes of both kinds,
batch-size changes and a save/restore; a killed Ray node loses nothing; a dataset a remote node
cannot load, or that cannot be sent there, is refused clearly; without Ray, asking for remote
workers says what to install."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import dloader
from dloader._engine.remote import REMOTE_SLOT_BASE, node_resource
from dloader.errors import RemoteWorkerError
from dloader.sidecar.config import DEFAULT_WORKER_NICE
from tests.loader.test_resize import expected_order

ray = pytest.importorskip("ray", reason="remote workers need Ray (dloader-elastic[ray])")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

N = 8000


class Slow(torch.utils.data.Dataset[int]):
    """Sample ``i`` is ``i``, after ``ms`` milliseconds of sleep (a remote worker's share shows)."""

    def __init__(self, n: int = N, ms: float = 1.0) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.ms / 1000)
        return i


class LocalOnlyFiles(Slow):
    """A dataset whose files only the trainer's node has: a remote worker cannot read them."""

    def __getitem__(self, i: int) -> int:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id >= REMOTE_SLOT_BASE:
            raise FileNotFoundError(f"/data/shard-{i // 100}.tar")
        return super().__getitem__(i)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from dloader.apps.raycluster import LocalRayCluster

    log = tmp_path_factory.mktemp("ray") / "cluster.log"
    with LocalRayCluster(log=log) as c:
        c.add_node("pool", 2, resources={"pool": 2})
        yield c


def step(began: float) -> None:
    """A training step: 20 ms, and 250 ms once 5 s have passed, so that an epoch of 1,000
    batches outlasts a Ray worker's start on a loaded machine (it took over 20 s under a load of
    6 on 2 cores) instead of ending before any remote worker is up."""
    time.sleep(0.02 if time.monotonic() - began < 5 else 0.25)


def train_until_remote(
    loader: dloader.DataLoader[Any],
    it: Iterator[Any],
    got: list[int],
    ready: int = 1,
    timeout: float = 180.0,
    or_epoch_end: bool = False,
) -> bool:
    """Trains (takes batches into ``got``, a :func:`step` each) until ``ready`` remote workers
    are up (or, with ``or_epoch_end``, the epoch ends: then it returns True): the iterator reads
    its workers' messages only while the trainer asks for batches."""
    began = time.monotonic()
    while time.monotonic() < began + timeout:
        up = [w for w in loader.stats().workers if w.remote and w.state == "ready"]
        if len(up) >= ready:
            return False
        batch = next(it, None)
        if batch is None:
            if or_epoch_end:
                return True
            raise AssertionError(f"the epoch ended before {ready} remote worker(s) were ready")
        got += batch.tolist()
        step(began)  # the remote workers start meanwhile
    raise AssertionError(f"no {ready} remote worker(s) ready in {timeout} s")


def test_remote_workers_keep_the_order_through_resizes_batch_changes_and_a_restore(
    cluster: Any,
) -> None:
    remote = dloader.RayWorkers(2, address=cluster.address, resources={"pool": 1})
    torch.manual_seed(3)
    loader = dloader.DataLoader(
        Slow(), batch_size=8, shuffle=True, num_workers=1, remote=remote,
        batch_size_range=(1, 64),
    )  # fmt: skip
    got: list[int] = []
    it = iter(loader)
    train_until_remote(loader, it, got, 2)
    for step, batch in enumerate(it):
        got += batch.tolist()
        if step == 10:
            loader.resize_remote(1)
            loader.set_batch_size(5)
        elif step == 30:
            loader.resize(2)
            loader.resize_remote(2)
        elif step == 60:
            break
    remote_batches = sum(w.batches for w in loader.stats().workers if w.remote)
    assert remote_batches > 0, loader.stats().workers
    state = loader.state_dict()
    it.close()
    # a new process's loader: another local and remote count, another batch size
    again = dloader.DataLoader(
        Slow(), batch_size=16, shuffle=True, num_workers=0,
        remote=dloader.RayWorkers(1, address=cluster.address, resources={"pool": 1}),
    )  # fmt: skip
    again.load_state_dict(state)
    for batch in again:
        got += batch.tolist()
    assert got == expected_order(N, 3, True)
    assert again.stats().remote_workers == 1


class Where(Slow):
    """Sample ``i`` is ``i`` plus where it was loaded: ``PLACE`` times 1 for a node lending
    its cores (the Ray resource ``dloader_node:lender``), 2 for the pool, 0 here. A remote
    worker that would come before a lending node's trainers fails: Ray starts its workers at
    nice 15 (``RAY_worker_niceness``), behind the sidecar's loader workers (10) too."""

    PLACE = 1_000_000

    def __getitem__(self, i: int) -> int:
        info = torch.utils.data.get_worker_info()
        if info is None or info.id < REMOTE_SLOT_BASE:
            return super().__getitem__(i)
        nice = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's
        if nice < DEFAULT_WORKER_NICE:
            raise RuntimeError(f"a remote worker at nice {nice}: ahead of the node's trainers")
        assigned = ray.get_runtime_context().get_assigned_resources()
        code = 1 if node_resource("lender") in assigned else 2 if "pool" in assigned else 3
        return super().__getitem__(i) + code * self.PLACE


def test_remote_workers_run_on_the_nodes_that_lend_them_cores(cluster: Any) -> None:
    """Remote workers placed on a lending node run there (each takes a unit of the node's
    ``dloader_node:<id>`` resource), beside the pool's; taken back, the lending node's worker
    retires and the pool's goes on: every sample once, in order."""
    cluster.add_node("lender", 1, resources={node_resource("lender"): 1})
    n = 4000
    loader = dloader.DataLoader(
        Where(n), batch_size=4, num_workers=1,
        remote=dloader.RayWorkers(0, address=cluster.address, resources={"pool": 1}),
    )  # fmt: skip
    loader.resize_remote({"": 1, "lender": 1})
    assert (loader.remote_workers, loader.remote_placement) == (2, {"": 1, "lender": 1})
    got: list[int] = []
    it = iter(loader)
    train_until_remote(loader, it, got, 2)
    places = sorted(w.place for w in loader.stats().workers if w.remote)
    assert places == ["", "lender"]
    after: list[str] = []  # the remote workers' places, last seen after the lender's retired
    for batch in it:
        got += batch.tolist()
        if len(got) >= n // 2 and loader.remote_placement != {"": 1}:
            loader.resize_remote(1)
        elif loader.remote_placement == {"": 1}:
            after = [w.place for w in loader.stats().workers if w.remote] or after
    assert [i % Where.PLACE for i in got] == list(range(n))
    assert {i // Where.PLACE for i in got} >= {1, 2}  # both remote places delivered
    assert after == [""]


def test_a_placement_is_checked_before_it_is_taken() -> None:
    loader = dloader.DataLoader(Slow(), remote=dloader.RayWorkers(1, max_workers=4))
    for placement, error, why in [
        ({"a": -1}, ValueError, "resize_remote(workers)['a']=-1: expected an int >= 0"),
        ({"": 2, "a": 3}, ValueError, "5 workers in all, above RayWorkers.max_workers=4"),
        ({"\n": 1}, ValueError, "place '\\n': expected a node id"),
        ([1], TypeError, "resize_remote(workers)=[1]: expected a count, or counts by node"),
    ]:
        with pytest.raises(error, match=re.escape(why)):
            loader.resize_remote(placement)  # type: ignore[arg-type]
    assert loader.remote_placement == {"": 1}


def test_a_killed_ray_node_loses_nothing(cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The node a remote worker runs on dies mid-epoch (SIGKILL of its raylet and workers): the
    batches it held go to the other workers; nothing is lost or repeated, and the loader goes
    on with the workers it has."""
    cluster.add_node("victim", 1, resources={"victim": 1})
    loader = dloader.DataLoader(
        Slow(4000), batch_size=4, num_workers=1,
        remote=dloader.RayWorkers(1, address=cluster.address, resources={"victim": 1}),
    )  # fmt: skip
    got: list[int] = []
    it = iter(loader)
    train_until_remote(loader, it, got)
    killed = False
    with caplog.at_level(logging.WARNING, logger="dloader"):
        for batch in it:
            got += batch.tolist()
            held = [w for w in loader.stats().workers if w.remote and w.in_flight]
            if not killed and held:
                cluster.kill_node("victim")
                killed = True
    assert killed
    assert got == list(range(4000))
    assert "lost" in caplog.text and "given to other workers" in caplog.text


def test_a_dataset_a_remote_node_cannot_load_is_refused_clearly(cluster: Any) -> None:
    loader = dloader.DataLoader(
        LocalOnlyFiles(), batch_size=8, num_workers=1,
        remote=dloader.RayWorkers(1, address=cluster.address, resources={"pool": 1}),
    )  # fmt: skip
    began = time.monotonic()
    with pytest.raises(RemoteWorkerError) as err:
        for _ in loader:
            step(began)  # the remote worker starts meanwhile
    text = str(err.value)
    assert "cannot load the dataset" in text and "FileNotFoundError" in text
    assert "reach its files from its own node" in text


class HoldsALock(Slow):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_what_cannot_run_remotely_is_refused_up_front() -> None:
    with pytest.raises(RemoteWorkerError, match=r"dataset.*cannot be sent to remote workers"):
        dloader.DataLoader(HoldsALock(), remote=dloader.RayWorkers(1))

    class Stream(torch.utils.data.IterableDataset[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

    with pytest.raises(RemoteWorkerError, match="map-style dataset"):
        dloader.DataLoader(Stream(), remote=dloader.RayWorkers(1))
    with pytest.raises(ValueError, match="no remote workers"):
        dloader.DataLoader(Slow()).resize_remote(2)
    with pytest.raises(ValueError, match="workers=-1"):
        dloader.RayWorkers(-1)
    with pytest.raises(ValueError, match="num_cpus"):
        dloader.RayWorkers(1, num_cpus=0)
    with pytest.raises(TypeError, match="RayWorkers"):
        dloader.DataLoader(Slow(), remote=4)  # type: ignore[arg-type]


def test_without_ray_asking_for_remote_workers_says_what_to_install(tmp_path: Path) -> None:
    """``import dloader`` and everything else work without Ray; asking for remote workers names
    the extra to install (run in a fresh interpreter in which ``ray`` cannot be imported)."""
    import subprocess

    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import dloader, torch\n"
        "ds = list(range(10))\n"
        "assert [b.tolist() for b in dloader.DataLoader(ds, batch_size=5)] == "
        "[[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]\n"
        "try:\n"
        "    dloader.DataLoader(ds, remote=dloader.RayWorkers(1))\n"
        "except dloader.errors.RemoteWorkerError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        cwd=str(Path(__file__).resolve().parents[2]), env={**os.environ},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "pip install 'dloader-elastic[ray]'" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_exactly_once_in_order_with_remote_workers(cluster: Any) -> None:
    """The loader's property test (``tests/loader/test_properties.py``) with remote workers
    beside the local ones: random sequences of batches, local and remote resizes, batch-size
    changes and save/restore into a loader of other counts deliver the epoch exactly once, in
    the sampler's order. Each iterator trains until a remote worker serves, so that they do."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    n = 2000
    op = st.one_of(
        st.tuples(st.just("next"), st.integers(1, 12)),
        st.tuples(st.just("resize"), st.integers(0, 2)),
        st.tuples(st.just("remote"), st.integers(0, 2)),
        st.tuples(st.just("batch"), st.integers(1, 9)),
        st.tuples(st.just("restore"), st.tuples(st.integers(0, 1), st.integers(1, 2))),
    )

    def make(local: int, remote: int, batch: int, shuffle: bool) -> dloader.DataLoader[Any]:
        return dloader.DataLoader(
            Slow(n), batch_size=batch, shuffle=shuffle, num_workers=local,
            remote=dloader.RayWorkers(remote, address=cluster.address, resources={"pool": 1}),
        )  # fmt: skip

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        ops=st.lists(op, max_size=8),
        start=st.tuples(st.integers(0, 2), st.integers(1, 2), st.integers(1, 9)),
        shuffle=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def check(
        ops: list[tuple[str, Any]], start: tuple[int, int, int], shuffle: bool, seed: int
    ) -> None:
        torch.manual_seed(seed)
        loader = make(*start, shuffle)
        it = iter(loader)
        got: list[int] = []
        # a state saved after the epoch ended resumes into the next epoch (as in
        # test_properties.py): the epoch ends early where a remote worker is slow to start
        ended = train_until_remote(loader, it, got, or_epoch_end=True)
        for name, arg in ops:
            if name == "next":
                for _ in range(arg):
                    batch = None if ended else next(it, None)
                    if batch is None:
                        ended = True
                        break
                    got += batch.tolist()
            elif name == "resize":
                loader.resize(arg)
            elif name == "remote":
                loader.resize_remote(arg)
            elif name == "batch":
                loader.set_batch_size(arg)
            else:
                state = loader.state_dict()
                it.close()  # type: ignore[attr-defined]
                torch.manual_seed(seed + 1)  # a restarted process: other RNG state
                loader = make(arg[0], arg[1], 3, shuffle)
                loader.load_state_dict(state)
                it = iter(loader)
                if not ended:
                    ended = train_until_remote(loader, it, got, or_epoch_end=True)
        if not ended:
            got += [i for b in it for i in b.tolist()]
        it.close()  # type: ignore[attr-defined]  # its remote workers go back to the pool
        assert got == expected_order(n, seed, shuffle)

    check()


@pytest.mark.slow
def test_a_ray_cluster_that_is_not_there_is_named_in_the_error() -> None:
    """The helper cannot reach the cluster (Ray itself retries for minutes): after
    ``connect_timeout_s`` the loader says so, naming the address, having trained on with its
    local workers meanwhile."""
    loader = dloader.DataLoader(
        Slow(10**6), batch_size=8, num_workers=1,
        remote=dloader.RayWorkers(1, address="127.0.0.1:1", connect_timeout_s=10),
    )  # fmt: skip
    batches = 0
    with pytest.raises(RemoteWorkerError, match=r"cannot start: Ray at 127\.0\.0\.1:1: not joined"):
        for _ in loader:
            batches += 1
            time.sleep(0.01)
    assert batches > 0


def test_a_batch_crosses_as_numpy_and_comes_back_as_it_was() -> None:
    """What a remote worker sends (``to_numpy``) and the helper rebuilds (``from_numpy``): the
    same structure, dtypes and values; what numpy cannot hold (bfloat16) or is not a tensor
    passes unchanged."""
    from collections import namedtuple

    from dloader._engine.remote import _Array, from_numpy, to_numpy

    Pair = namedtuple("Pair", "x y")
    batch = {
        "img": torch.arange(12, dtype=torch.uint8).reshape(3, 4),
        "pair": Pair(torch.ones(2), [torch.tensor([1, 2]), "label"]),
        "half": torch.ones(2, dtype=torch.bfloat16),
        "n": 3,
    }
    sent = to_numpy(batch)
    assert isinstance(sent["img"], _Array) and isinstance(sent["pair"].y[0], _Array)
    assert isinstance(sent["half"], torch.Tensor)
    back = from_numpy(sent)
    assert type(back["pair"]) is Pair and back["pair"].y[1] == "label" and back["n"] == 3
    for got, want in [
        (back["img"], batch["img"]),
        (back["pair"].x, batch["pair"].x),
        (back["pair"].y[0], batch["pair"].y[0]),
        (back["half"], batch["half"]),
    ]:
        assert got.dtype == want.dtype and torch.equal(got, want)
