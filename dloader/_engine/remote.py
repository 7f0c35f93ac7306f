"""Loader workers on other machines' CPUs: Ray actors, beside the local worker processes.

Where a node's cores cannot feed its GPUs, a loader may add workers that run elsewhere, on the
CPUs of a Ray cluster (``DataLoader(..., remote=RayWorkers(4, address="auto"))``). They take
index batches from the same sample stream as the local workers and return collated batches, so
everything the loader keeps holds with them: the order the trainer sees, exactly-once,
``state_dict()`` and resume, live resize (of either kind) and batch-size changes.

The trainer process holds no Ray client (Ray, like gRPC, runs threads that a fork would
inherit mid-lock: the trainer forks its local workers). One **helper process** per iterator is
the Ray driver: the trainer sends it tasks on a queue, tagged with the remote worker's slot; it
runs each on that slot's actor (:class:`RemoteFetcher`, one core of the cluster each) and writes
the results to the same result pipe the local workers write to, in the same message form. So
the iterator sees a remote worker as one more worker slot. Messages of its own, on that pipe:

* ``READY``, payload ``(pid, host, error)``: the actor is up and fetched its probe sample (or
  ``error`` says why it cannot load: a dataset must be picklable, and its files reachable from
  the remote nodes);
* :data:`GONE`, payload ``(why, task indices)``: the actor or its node died; its tasks not yet
  returned are listed, and the iterator gives them to other workers (their indices unchanged:
  nothing is lost or repeated, and the order holds);
* :data:`STOPPED`: a worker told to stop has finished its tasks and is gone;
* :data:`FAILED`, payload a message: the helper cannot reach the Ray cluster (the loader
  raises ``RemoteWorkerError`` with it).

A batch crosses the network once (Ray's object transfer) and is copied once more into shared
memory for the trainer, as a local worker's is.

**Where** a remote worker runs is its place (:data:`Placement`): ``""``, wherever
``RayWorkers.resources`` allow (a CPU pool's nodes); any other name, the node of that name
lending the job its spare cores: the Ray node there advertises ``dloader_node:<name>``, one
unit a core it may lend (:func:`node_resource`), and each worker placed there takes one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import IterableDataset, IterDataPipe
from torch.utils.data._utils import worker as _torch_worker

from dloader._engine.telemetry import RunDelayClock
from dloader._engine.timing import WORKER_POLL_INTERVAL_S
from dloader._engine.workers import READY, Fetcher, seed_worker
from dloader.errors import RemoteWorkerError

__all__ = [
    "FAILED",
    "GONE",
    "NODE_RESOURCE",
    "REMOTE_SLOT_BASE",
    "STOPPED",
    "Placement",
    "RayWorkers",
    "RemoteFetcher",
    "check_placement",
    "check_remote",
    "helper_loop",
    "node_resource",
]

GONE = -2
STOPPED = -3
FAILED = -4
#: Remote workers' slots start here and are never reused, so that a late message from a lost
#: worker cannot be taken for another's.
REMOTE_SLOT_BASE = 1 << 16

_POLL_S = 0.01  # the helper's wait for finished Ray calls while it has some outstanding

NODE_RESOURCE = "dloader_node:"
"""The prefix of the Ray resource a node lending its cores advertises (:func:`node_resource`)."""

_MAX_PLACE = 128  # the longest place name (a node id)

Placement = Mapping[str, int]
"""Remote workers by where they run: ``""`` wherever ``RayWorkers.resources`` allow, any other
key the id of a node that lends the job cores (its Ray node advertises :func:`node_resource`)."""


def node_resource(node: str) -> str:
    """The Ray resource a node named ``node`` advertises, one unit for each core it may lend
    to other nodes' loaders (``ray start --resources '{"dloader_node:<node>": <cores>}'``)."""
    return NODE_RESOURCE + node


def check_placement(workers: int | Placement, most: int, what: str) -> dict[str, int]:
    """``workers`` (a count: all at ``""``; or counts by place) as a placement, checked:
    ``ValueError`` naming ``what`` and the value unless every count is an int >= 0, every place
    a printable name of at most 128 characters, and the total at most ``most``."""
    if isinstance(workers, int) and not isinstance(workers, bool):
        placement = {"": workers}
    elif isinstance(workers, Mapping):
        placement = dict(workers)
    else:
        raise TypeError(f"{what}={workers!r}: expected a count, or counts by node (a dict)")
    for place, count in placement.items():
        if not (isinstance(place, str) and len(place) <= _MAX_PLACE and place.isprintable()):
            raise ValueError(
                f"{what}: place {place!r}: expected a node id (printable, at most "
                f"{_MAX_PLACE} characters) or '' (the pool)"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{what}[{place!r}]={count!r}: expected an int >= 0")
    total = sum(placement.values())
    if total > most:
        raise ValueError(f"{what}: {total} workers in all, above RayWorkers.max_workers={most}")
    return {place: count for place, count in placement.items() if count or place == ""}


@dataclass(frozen=True)
class RayWorkers:
    """Loader workers on a Ray cluster's CPUs (``DataLoader(..., remote=RayWorkers(...))``).

    Args:
        workers: remote workers to start with (``loader.resize_remote(n)`` changes it live).
        address: the Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); None:
            ``$RAY_ADDRESS``, else a local Ray instance started for this loader.
        num_cpus: CPUs each remote worker reserves on its node (Ray's ``num_cpus``).
        resources: custom Ray resources each worker needs, e.g. ``{"dloader_pool": 1}`` to run
            only on the nodes of a CPU pool.
        runtime_env: Ray's ``runtime_env`` for the workers (the remote nodes need dloader, torch
            and what the dataset imports).
        max_workers: the most remote workers :meth:`DataLoader.resize_remote` accepts.
        connect_timeout_s: how long the loader's helper may take to join the cluster (Ray
            itself retries an unreachable address for minutes); then the loader raises
            ``RemoteWorkerError`` naming the address.
    """

    workers: int = 0
    address: str | None = None
    num_cpus: float = 1.0
    resources: Mapping[str, float] = field(default_factory=dict)
    runtime_env: Mapping[str, Any] | None = None
    max_workers: int = 256
    connect_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int):
            raise TypeError(f"RayWorkers(workers={self.workers!r}): expected an int >= 0")
        if not 0 <= self.workers <= self.max_workers:
            raise ValueError(
                f"RayWorkers(workers={self.workers}): expected 0 <= workers <= "
                f"max_workers={self.max_workers}"
            )
        if not (isinstance(self.num_cpus, (int, float)) and 0 < self.num_cpus <= 1024):
            raise ValueError(
                f"RayWorkers(num_cpus={self.num_cpus!r}): expected 0 < num_cpus <= 1024"
            )
        if not (isinstance(self.connect_timeout_s, (int, float)) and self.connect_timeout_s > 0):
            raise ValueError(
                f"RayWorkers(connect_timeout_s={self.connect_timeout_s!r}): expected seconds > 0"
            )
        for name, amount in dict(self.resources).items():
            if not (isinstance(name, str) and isinstance(amount, (int, float)) and amount > 0):
                raise ValueError(
                    f"RayWorkers(resources={dict(self.resources)!r}): expected names and "
                    "amounts > 0"
                )


def check_remote(dataset: Any, collate_fn: Any, worker_init_fn: Any) -> None:
    """Up front, what a dataset needs to run on remote workers (``RemoteWorkerError`` saying
    what is missing): Ray installed, a map-style dataset, and the dataset, ``collate_fn`` and
    ``worker_init_fn`` picklable (by cloudpickle, as Ray sends them). That its files are
    reachable from the remote nodes is checked by each remote worker at start (it loads one
    sample before it takes a task)."""
    try:
        from ray import cloudpickle  # only where remote workers are asked for
    except ImportError:
        raise RemoteWorkerError(
            "remote workers need Ray: pip install 'dloader-elastic[ray]' (ray[default])"
        ) from None
    if isinstance(dataset, (IterableDataset, IterDataPipe)):
        raise RemoteWorkerError(
            f"remote workers need a map-style dataset; {type(dataset).__name__} is iterable "
            "(each worker would hold a shard of the stream, which a remote worker that dies "
            "would lose)"
        )
    for what, value in (
        ("dataset", dataset),
        ("collate_fn", collate_fn),
        ("worker_init_fn", worker_init_fn),
    ):
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise RemoteWorkerError(
                f"the {what} ({type(value).__name__}) cannot be sent to remote workers: "
                f"{type(exc).__name__}: {exc}. A remote worker gets a pickled copy (Ray's "
                "cloudpickle): open files, locks and sockets must be opened in the worker "
                "(lazily, or in worker_init_fn), not held by the object"
            ) from None


class RemoteFetcher:
    """One remote worker: a Ray actor that loads batches as a local worker does (seeded as
    worker ``slot``, ``get_worker_info()`` set, ``worker_init_fn`` run)."""

    def __init__(self, payload: tuple[Any, ...], slot: int, num_workers: int) -> None:
        dataset, auto_collation, collate_fn, drop_last, base_seed, init_fn = payload
        torch.set_num_threads(1)
        self.slot = slot
        self.host = socket.gethostname()
        seed = seed_worker(base_seed, slot)
        _torch_worker._worker_info = _torch_worker.WorkerInfo(
            id=slot, num_workers=num_workers, seed=seed, dataset=dataset
        )
        self.error: str | None = None
        self.auto_collation = auto_collation
        try:
            if init_fn is not None:
                init_fn(slot)
            self.fetcher: Fetcher | None = Fetcher(dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            self.fetcher = None
            self.error = "worker_init_fn failed:\n" + traceback.format_exc(limit=8)

    def ready(self) -> tuple[int, str, str | None]:
        """``(pid, host, error)``: the actor's process, its node, and why it cannot load (None:
        it loaded its probe sample, index 0)."""
        if self.error is None and self.fetcher is not None:
            try:
                if len(self.fetcher.dataset) > 0:
                    self.fetcher.fetch([0] if self.auto_collation else 0)
            except Exception:
                self.error = "loading sample 0 failed:\n" + traceback.format_exc(limit=8)
        return os.getpid(), self.host, self.error

    def fetch(self, index: Any) -> tuple[Any, int, float, float, float | None]:
        """``(batch, samples, fetch seconds, CPU seconds, run-queue seconds or None)``; a
        failure is the batch's error.
        The batch's CPU tensors travel as numpy arrays (:func:`to_numpy`): Ray moves those
        without pickling their bytes, and the helper reads them in place."""
        delays = RunDelayClock()  # this call's thread (an actor's calls may move between them)
        t0, c0, d0 = time.perf_counter(), time.process_time(), delays.read()
        try:
            assert self.fetcher is not None, self.error
            data, num = self.fetcher.fetch(index)
            data = to_numpy(data)
        except Exception:
            where = f"in remote DataLoader worker {self.slot} on {self.host}"
            data, num = ExceptionWrapper(where=where), 0
        fetch_s, cpu_s, d1 = time.perf_counter() - t0, time.process_time() - c0, delays.read()
        delays.close()
        delay_s = d1 - d0 if d0 is not None and d1 is not None else None
        return data, num, fetch_s, cpu_s, delay_s


class _Array:
    """A CPU tensor of a remote batch, as a numpy array (and the dtype to give it back)."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: Any, dtype: torch.dtype) -> None:
        self.array, self.dtype = array, dtype


def _walk(data: Any, leaf: Any) -> Any:
    """``data`` with ``leaf`` applied to each element inside its lists, tuples (named ones
    too) and dicts."""
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(_walk(x, leaf) for x in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_walk(x, leaf) for x in data)
    if isinstance(data, dict):
        return type(data)((k, _walk(v, leaf)) for k, v in data.items())
    return leaf(data)


def _tensor_to_array(data: Any) -> Any:
    dense = isinstance(data, torch.Tensor) and data.device.type == "cpu"
    if dense and data.layout == torch.strided and not data.requires_grad:
        try:
            return _Array(data.numpy(), data.dtype)
        except (TypeError, RuntimeError):
            return data
    return data


def _array_to_tensor(data: Any) -> Any:
    if isinstance(data, _Array):
        with warnings.catch_warnings():  # Ray's arrays are read-only views: nothing writes
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(data.array).view(data.dtype)
    return data


def to_numpy(data: Any) -> Any:
    """``data`` with each dense CPU tensor (in lists, tuples, dicts) an :class:`_Array`: Ray
    sends numpy arrays out of band (no copy into a pickle), and a receiver maps them in place.
    Tensors numpy cannot hold (bfloat16, sparse, ...) stay tensors."""
    return _walk(data, _tensor_to_array)


def from_numpy(data: Any) -> Any:
    """Inverse of :func:`to_numpy`: tensors over the received arrays (read in place, no copy;
    the result pipe then copies them once, into the trainer's shared memory)."""
    return _walk(data, _array_to_tensor)


@dataclass
class _Slot:
    """The helper's view of one remote worker."""

    actor: Any
    ready_ref: Any
    ready: bool = False
    waiting: list[tuple[int, int, Any]] = field(default_factory=list)
    """Tasks ``(generation, task index, index)`` received before the actor was up."""
    outstanding: dict[Any, tuple[int, int]] = field(default_factory=dict)
    """Ray call -> ``(generation, task index)``."""
    stopping: bool = False


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(WORKER_POLL_INTERVAL_S)
        if os.getppid() != parent:
            os._exit(0)


def helper_loop(
    spec: RayWorkers,
    payload: tuple[Any, ...],
    tasks: Any,
    results: Any,
    done_event: Any,
) -> None:
    """Body of the helper process: the Ray driver for one iterator's remote workers.

    ``tasks`` carries ``("add", slot, num_workers, place)``, ``("task", slot, gen, task_idx, index,
    seed)``, ``("stop", slot)`` and finally ``None``; ``results`` is the iterator's result
    pipe (see the module docstring)."""
    results.in_worker()
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    where = spec.address or "$RAY_ADDRESS or a new local instance"

    def fail(why: str) -> None:
        results.send(
            (REMOTE_SLOT_BASE, 0, FAILED, f"Ray at {where}: {why[:500]}", 0, 0.0, 0.0, None)
        )

    def too_slow() -> None:  # Ray retries an unreachable address for minutes
        fail(f"not joined within {spec.connect_timeout_s:g} s (RayWorkers.connect_timeout_s)")
        os._exit(1)

    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        watchdog = threading.Timer(spec.connect_timeout_s, too_slow)
        watchdog.daemon = True
        watchdog.start()
        try:
            helper = _Helper(spec, payload, results, done_event)
        except Exception as exc:  # no cluster there, or Ray cannot start
            watchdog.cancel()
            fail(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc) else ''}")
            return
        watchdog.cancel()
        helper.serve(tasks)


class _Helper:
    def __init__(self, spec: RayWorkers, payload: tuple[Any, ...], results: Any, done: Any) -> None:
        import ray

        self.ray = ray
        self.results = results
        self.done = done
        self.spec = spec
        if not ray.is_initialized():
            ray.init(
                address=spec.address,
                log_to_driver=False,
                include_dashboard=False,
                configure_logging=False,
                runtime_env=dict(spec.runtime_env) if spec.runtime_env else None,
            )
        self.payload = ray.put(payload)
        self.actor_class = ray.remote(
            num_cpus=spec.num_cpus,
            resources=dict(spec.resources),
            max_restarts=0,
            max_task_retries=0,
        )(RemoteFetcher)
        self.slots: dict[int, _Slot] = {}

    def send(self, msg: tuple[Any, ...]) -> None:
        try:
            self.results.send(msg)
        except (BrokenPipeError, ConnectionError):
            raise
        except Exception as exc:  # a batch that came through Ray but cannot be re-pickled
            slot, gen, task_idx = msg[:3]
            try:
                raise TypeError(f"a remote batch cannot be sent to the trainer: {exc}") from exc
            except TypeError:
                error = ExceptionWrapper(where=f"in remote DataLoader worker {slot}")
            self.results.send((slot, gen, task_idx, error, 0, 0.0, 0.0, None))

    def serve(self, tasks: Any) -> None:
        while True:
            busy = any(s.outstanding or not s.ready for s in self.slots.values())
            try:
                msg = tasks.get(timeout=_POLL_S if busy else WORKER_POLL_INTERVAL_S)
            except queue.Empty:
                msg = ()
            while msg != ():
                if msg is None:
                    self.shutdown()
                    return
                self.handle(msg)
                try:
                    msg = tasks.get_nowait()
                except queue.Empty:
                    msg = ()
            self.collect()

    def handle(self, msg: tuple[Any, ...]) -> None:
        kind, slot = msg[0], msg[1]
        if kind == "add":
            place = msg[3]
            actors = (
                self.actor_class.options(resources={node_resource(place): 1.0})
                if place
                else self.actor_class
            )
            actor: Any = actors.remote(self.payload, slot, msg[2])
            self.slots[slot] = _Slot(actor, actor.ready.remote())
        elif kind == "task":
            s = self.slots.get(slot)
            if s is None or self.done.is_set():
                return  # lost already (its tasks were handed back), or shutting down
            _, _, gen, task_idx, index, _seed = msg
            if s.ready:
                s.outstanding[s.actor.fetch.remote(index)] = (gen, task_idx)
            else:
                s.waiting.append((gen, task_idx, index))
        elif kind == "stop":
            s = self.slots.get(slot)
            if s is not None:
                s.stopping = True
                self.finish_stopping(slot, s)

    def finish_stopping(self, slot: int, s: _Slot) -> None:
        if s.stopping and not s.outstanding and not s.waiting:
            with contextlib.suppress(Exception):
                self.ray.kill(s.actor, no_restart=True)
            del self.slots[slot]
            self.send((slot, 0, STOPPED, None, 0, 0.0, 0.0, None))

    def collect(self) -> None:
        """Sends what the actors have finished; a failed call means its worker is lost."""
        refs: dict[Any, tuple[int, bool]] = {}
        for slot, s in self.slots.items():
            if not s.ready:
                refs[s.ready_ref] = (slot, True)
            for ref in s.outstanding:
                refs[ref] = (slot, False)
        if not refs:
            return
        done, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in done:
            slot, is_ready = refs[ref]
            found = self.slots.get(slot)
            if found is None:
                continue  # lost with an earlier call of this batch
            s = found
            try:
                value = self.ray.get(ref)
            except Exception as exc:  # RayActorError, ObjectLostError, OwnerDiedError, ...
                self.lose(slot, s, exc)
                continue
            if is_ready:
                self.on_ready(slot, s, value)
            else:
                gen, task_idx = s.outstanding.pop(ref)
                data, num, fetch_s, cpu_s, delay_s = value
                self.send((slot, gen, task_idx, from_numpy(data), num, fetch_s, cpu_s, delay_s))
                self.finish_stopping(slot, s)

    def on_ready(self, slot: int, s: _Slot, value: tuple[int, str, str | None]) -> None:
        s.ready = True
        self.send((slot, 0, READY, value, 0, 0.0, 0.0, None))
        for gen, task_idx, index in s.waiting:
            s.outstanding[s.actor.fetch.remote(index)] = (gen, task_idx)
        s.waiting.clear()
        self.finish_stopping(slot, s)

    def lose(self, slot: int, s: _Slot, exc: BaseException) -> None:
        held = sorted({t for _, t in s.outstanding.values()} | {t for _, t, _ in s.waiting})
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        with contextlib.suppress(Exception):
            self.ray.kill(s.actor, no_restart=True)
        del self.slots[slot]
        self.send((slot, 0, GONE, (why[:300], held), 0, 0.0, 0.0, None))

    def shutdown(self) -> None:
        for s in self.slots.values():
            with contextlib.suppress(Exception):
                self.ray.kill(s.actor, no_restart=True)
        self.slots.clear()
        with contextlib.suppress(Exception):
            self.ray.shutdown()


class RemoteSlotProcess:
    """What the iterator holds as a remote worker's ``process``: the helper's liveness, and the
    worker's own end once the helper said it stopped."""

    def __init__(self, helper: Any) -> None:
        self.helper = helper
        self.stopped = False
        self.pid: int | None = None
        self.host = ""

    @property
    def exitcode(self) -> int | None:
        if self.stopped:
            return 0
        return self.helper.exitcode

    def is_alive(self) -> bool:
        return not self.stopped and self.helper.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        """The helper process is joined by the iterator, once for all its workers."""

    def terminate(self) -> None:
        """As :meth:`join`: the helper ends its actors."""


class RemoteSlotQueue:
    """What the iterator holds as a remote worker's ``index_queue``: its tasks go to the helper,
    tagged with its slot."""

    def __init__(self, tasks: Any, slot: int) -> None:
        self.tasks = tasks
        self.slot = slot

    def put(self, task: tuple[Any, ...] | None) -> None:
        if task is None:
            self.tasks.put(("stop", self.slot))
        else:
            self.tasks.put(("task", self.slot, *task))

    def close(self) -> None:
        """The helper's queue is closed by the iterator."""


def remote_payload(
    dataset: Any,
    auto_collation: bool,
    collate_fn: Callable[[Any], Any],
    drop_last: bool,
    base_seed: int,
    init_fn: Callable[[int], None] | None,
) -> tuple[Any, ...]:
    """What every remote worker of an iterator is built from (sent once, by Ray)."""
    return (dataset, auto_collation, collate_fn, drop_last, base_seed, init_fn)
