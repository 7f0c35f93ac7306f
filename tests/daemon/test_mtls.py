"""Mutual TLS on TCP: each client is one caller, named by its certificate (``--tls-client-ca``),
with the caps and ownership that uids give on the Unix socket. A second user's certificate
cannot act on the first user's job, even with its token; a certificate from another CA, or
none, cannot connect at all. Certificates are made here with the openssl command."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dloader._daemon.streams import MAX_STREAMS_PER_CALLER
from dloader._shared.client import Endpoint
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc
from tests._daemon import free_port
from tests.allocator.test_service import Allocator, job

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def issue(
    folder: Path, ca: tuple[Path, Path], name: str, *ext: str, subject: str = ""
) -> tuple[str, str]:
    """A certificate for ``name`` (its subject ``/CN=name`` unless ``subject``) signed by
    ``ca``; (certificate, key) paths."""
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", subject or f"/CN={name}", *ext, "-keyout", str(key), "-out", str(csr),
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-days", "1", "-copy_extensions", "copy", "-out", str(cert),
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, object]:
    ca = make_ca(tmp_path, "test-ca")
    other = make_ca(tmp_path, "other-ca")
    san = ("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    return {
        "ca": str(ca[0]),
        "server": issue(tmp_path, ca, "localhost", *san),
        "alice": issue(tmp_path, ca, "alice"),
        "bob": issue(tmp_path, ca, "bob"),
        "mallory": issue(tmp_path, other, "mallory"),
        # signed by the right CA, but naming no one, or not one
        "nameless": issue(tmp_path, ca, "nameless", subject="/O=nobody"),
        "san-only": issue(
            tmp_path, ca, "san-only", "-addext", "subjectAltName=DNS:alice", subject="/O=x"
        ),
        "two-names": issue(tmp_path, ca, "two-names", subject="/CN=alice/CN=bob"),
    }


@pytest.fixture
def target(tmp_path: Path, pki: dict[str, object]) -> Iterator[str]:
    port = free_port()
    cert, key = pki["server"]  # type: ignore[misc]
    alloc = Allocator(
        tmp_path,
        *("--listen", f"127.0.0.1:{port}", "--token", "op"),
        *("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(pki["ca"])),
    )
    yield f"127.0.0.1:{port}"
    alloc.stop()


def stub(target: str, pki: dict[str, object], who: str | None) -> pb_grpc.ClusterAllocatorStub:
    client = pki[who] if who else None
    endpoint = Endpoint.of(target, tls_ca=str(pki["ca"]), tls_client=client)  # type: ignore[arg-type]
    return pb_grpc.ClusterAllocatorStub(endpoint.channel())


def test_a_second_users_certificate_cannot_act_on_the_first_users_job(
    target: str, pki: dict[str, object]
) -> None:
    alice, bob = stub(target, pki, "alice"), stub(target, pki, "bob")
    token = alice.SubmitJob(job("a1"), timeout=10).token  # a certificate alone is a client
    with pytest.raises(grpc.RpcError) as err:
        bob.CompleteJob(pb.CompleteJobRequest(job_id="a1", token=token), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "submitted by cert alice, not by certificate 'bob'" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError) as err:
        bob.UpdateJob(pb.UpdateJobRequest(job_id="a1", token=token, priority=2), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    alice.CompleteJob(pb.CompleteJobRequest(job_id="a1", token=token), timeout=10)


def test_a_certificate_from_another_ca_or_none_cannot_connect(
    target: str, pki: dict[str, object]
) -> None:
    for who in ("mallory", None):
        with pytest.raises(grpc.RpcError) as err:
            stub(target, pki, who).GetAllocations(pb.GetAllocationsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, who


def test_each_certificate_has_its_own_share(target: str, pki: dict[str, object]) -> None:
    """A user's streams are capped by its certificate, as by uid on the socket: alice filling
    hers leaves bob his."""
    alice, bob = stub(target, pki, "alice"), stub(target, pki, "bob")
    mine = [
        alice.WatchAllocations(pb.WatchAllocationsRequest(), timeout=30)
        for _ in range(MAX_STREAMS_PER_CALLER)
    ]
    for s in mine:
        next(s)  # each stream's first message: the stream is open
    with pytest.raises(grpc.RpcError) as err:
        next(alice.WatchAllocations(pb.WatchAllocationsRequest(), timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cert alice holds" in (err.value.details() or "")
    assert next(bob.WatchAllocations(pb.WatchAllocationsRequest(), timeout=10)) is not None
    for s in mine:
        s.cancel()


@pytest.mark.parametrize("who", ["nameless", "san-only", "two-names"])
def test_a_certificate_that_names_no_one_is_refused_whatever_its_token(
    target: str, pki: dict[str, object], who: str
) -> None:
    """#49 §1 (medium, low): a CA-signed certificate with no name plus the shared client token
    was "not identified" and skipped the owner check; a subject alternative name alone counted
    as the common name (``DNS:alice`` acted as alice); of two common names the first was
    taken. Each is refused now, with or without a token."""
    client = pki[who]
    endpoint = Endpoint.of(target, "op", tls_ca=str(pki["ca"]), tls_client=client)  # type: ignore[arg-type]
    for meta in ((), (("authorization", "Bearer op"),)):
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.ClusterAllocatorStub(endpoint.channel()).GetAllocations(
                pb.GetAllocationsRequest(), metadata=meta, timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, who
        assert "common name" in (err.value.details() or ""), err.value.details()


def test_a_subjects_attributes_are_read_with_their_escapes() -> None:
    from dloader._daemon.server import _rdn_attributes

    assert _rdn_attributes(r"CN=a\,b,O=x+CN=c") == [("CN", r"a,b"), ("O", "x"), ("CN", "c")]
