"""Property-based fuzzing of every RPC of both daemons, built from the proto descriptors.

Random messages (extreme and non-finite numbers, non-ASCII and long strings, long lists, nested
messages) go to a real sidecar and a real allocator on Unix sockets. Every reply must be a
status a well-behaved server gives a bad request (never INTERNAL or UNKNOWN), within its
deadline; the daemons' threads and file descriptors stay flat.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dloader.v1 import allocator_pb2, node_pb2
from tests.allocator.test_service import Allocator
from tests.allocator.test_service import job as job_request
from tests.sidecar.conftest import Sidecar

pytestmark = pytest.mark.integration

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # a bounded list is full (jobs on a node)
}
DEADLINE_S = 10.0
FUZZ_EXAMPLES = int(os.environ.get("DLOADER_FUZZ_EXAMPLES", "25"))

#: Ids and tokens that exist on the daemons under test (filled in before fuzzing), so that
#: requests reach past the lookups into the validation of everything else.
KNOWN: dict[str, list[str]] = {}

_INTS = st.one_of(
    st.sampled_from([0, 1, -1, 2, 7, 64, 1 << 20, 2**31 - 1, -(2**31), os.getpid()]),
    st.integers(-(2**31), 2**31 - 1),
)
_UINTS = st.one_of(st.sampled_from([0, 1, 2, 1 << 20, 2**32 - 1]), st.integers(0, 2**32 - 1))
_FLOATS = st.one_of(
    st.sampled_from(
        [0.0, -0.0, 1.0, -1.0, 5e-324, 1e-308, 1e308, -1e308, math.inf, -math.inf, math.nan]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
)
_TEXT = st.one_of(
    st.sampled_from(["", "a", "job", "x" * 16384, "t\u00f6ken\u2603", "a\nb", "../../etc"]),
    st.text(max_size=40),
)


def messages(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Random messages of type ``desc`` (nested up to depth 2)."""
    cls = GetMessageClass(desc)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 2:
                continue
            value: st.SearchStrategy[Any] = st.deferred(
                lambda f=f: messages(f.message_type, depth + 1)
            )
        elif f.type == FieldDescriptor.TYPE_ENUM:
            value = st.sampled_from([v.number for v in f.enum_type.values])
        elif f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            value = _FLOATS
        elif f.type == FieldDescriptor.TYPE_BOOL:
            value = st.booleans()
        elif f.type == FieldDescriptor.TYPE_STRING:
            value = st.one_of(st.sampled_from(KNOWN[f.name]), _TEXT) if KNOWN.get(f.name) else _TEXT
        elif f.type == FieldDescriptor.TYPE_BYTES:
            value = st.binary(max_size=64)
        elif f.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64):
            value = _UINTS
        else:
            value = _INTS
        if f.is_repeated:
            value = st.one_of(
                st.lists(value, max_size=4), st.lists(value, min_size=200, max_size=300)
            )
        fields[f.name] = st.one_of(st.none(), value)

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for name, v in values.items():
            if v is None:
                continue
            field = desc.fields_by_name[name]
            try:
                if field.is_repeated:
                    getattr(msg, name).extend(v)
                elif field.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, name).CopyFrom(v)
                else:
                    setattr(msg, name, v)
            except (ValueError, TypeError):  # e.g. a float for a float field out of range
                continue
        return msg

    return st.fixed_dictionaries({}, optional=fields).map(build)


def call(channel: grpc.Channel, service: str, m: MethodDescriptor, request: Any) -> grpc.StatusCode:
    """One call of any shape; the status it ends with (a stream is read for a moment)."""
    path = f"/{service}/{m.name}"
    ser = lambda x: x.SerializeToString()  # noqa: E731
    de = GetMessageClass(m.output_type).FromString
    try:
        if m.client_streaming and not m.server_streaming:
            channel.stream_unary(path, ser, de)(iter(request), timeout=DEADLINE_S)
        elif m.server_streaming:
            stream = channel.unary_stream(path, ser, de)(request, timeout=DEADLINE_S)
            timer = threading.Timer(0.3, stream.cancel)  # a watch stays open: read, then leave
            timer.start()
            try:
                for _ in stream:
                    pass
            finally:
                timer.cancel()
        else:
            channel.unary_unary(path, ser, de)(request, timeout=DEADLINE_S)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.CANCELLED:  # we left a healthy stream
            return grpc.StatusCode.OK
        return code  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _fuzz_method(
    channel: grpc.Channel, service: str, m: MethodDescriptor, examples: int
) -> dict[str, int]:
    strategy: st.SearchStrategy[Any] = messages(m.input_type)
    if m.client_streaming:
        strategy = st.lists(strategy, min_size=1, max_size=3)
    counts: dict[str, int] = {}

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(strategy)
    def one(request: Any) -> None:
        began = time.monotonic()
        code = call(channel, service, m, request)
        counts[code.name] = counts.get(code.name, 0) + 1
        assert code in ALLOWED, f"{m.name} answered {code.name} to {request!r:.300}"
        assert time.monotonic() - began < DEADLINE_S

    one()
    return counts


def fuzz(channel: grpc.Channel, service_desc: Any, examples: int) -> dict[str, dict[str, int]]:
    """Requests by status code, per method of the service."""
    return {
        m.name: _fuzz_method(channel, service_desc.full_name, m, examples)
        for m in service_desc.methods
    }


def _threads_and_fds() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


def run_both(tmp_path: Path, examples: int) -> dict[str, dict[str, int]]:
    sidecar = Sidecar(tmp_path / "sidecar")
    allocator = Allocator(tmp_path / "allocator")
    try:
        job = sidecar.stub.RegisterJob(
            node_pb2.RegisterJobRequest(
                name="fuzz", pids=[os.getpid()], num_workers=1, batch_size=8
            ),
            timeout=10,
        )
        allocator.stub.RegisterNode(allocator_pb2.RegisterNodeRequest(node_id="fuzz-node", gpus=4))
        allocator.stub.SubmitJob(job_request("fuzz-job"), timeout=10)
        KNOWN.update(job_id=[job.job_id, "fuzz-job"], token=[job.token], node_id=["fuzz-node"])
        results = {}
        for label, daemon, desc in (
            ("node", sidecar, node_pb2.DESCRIPTOR.services_by_name["NodeService"]),
            ("allocator", allocator, allocator_pb2.DESCRIPTOR.services_by_name["ClusterAllocator"]),
        ):
            fuzz(daemon.channel, desc, 3)  # warm up: the daemon's pools and caches
            threads, fds = _threads_and_fds()
            counts = fuzz(daemon.channel, desc, examples)
            after_threads, after_fds = _threads_and_fds()
            assert after_threads <= threads + 4, (label, threads, after_threads)
            assert after_fds <= fds + 16, (label, fds, after_fds)
            results.update({f"{label}.{k}": v for k, v in counts.items()})
        print("fuzz results (requests by status):", results)
        return results
    finally:
        KNOWN.clear()
        sidecar.stop()
        allocator.stop()


@pytest.mark.timeout(600)
def test_every_rpc_survives_random_requests(tmp_path: Path) -> None:
    results = run_both(tmp_path, FUZZ_EXAMPLES)
    assert len(results) == 9 + 8  # every method of both services was tried
    assert sum(sum(c.values()) for c in results.values()) >= 12 * FUZZ_EXAMPLES


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_rpc_survives_many_random_requests(tmp_path: Path) -> None:
    run_both(tmp_path, 200)
