"""TLS on both sides: a daemon with --tls-cert/--tls-key, clients through dloader._shared.client."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from dloader._shared.client import Endpoint
from dloader.sidecar.ctl import main as ctl_main
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc
from tests._daemon import free_port
from tests.sidecar.conftest import Sidecar

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (its own CA)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_clients_speak_tls_with_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = make_cert(tmp_path)
    port = free_port()
    s = Sidecar(
        tmp_path,
        *("--listen", f"127.0.0.1:{port}", "--token", "s3cret"),
        *("--tls-cert", str(cert), "--tls-key", str(key)),
    )
    try:
        secure = Endpoint.of(f"127.0.0.1:{port}", "s3cret", str(cert))
        with secure.channel() as ch:
            jobs = pb_grpc.NodeServiceStub(ch).ListJobs(
                pb.ListJobsRequest(), metadata=secure.metadata, timeout=10
            )
        assert list(jobs.jobs) == []
        # a client without the CA cannot talk to it in plain text
        plain = Endpoint(f"127.0.0.1:{port}", "s3cret")
        with plain.channel() as ch, pytest.raises(grpc.RpcError) as err:
            pb_grpc.NodeServiceStub(ch).ListJobs(
                pb.ListJobsRequest(), metadata=plain.metadata, timeout=3
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # dloaderctl over TLS
        code = ctl_main(
            [
                *("--target", f"127.0.0.1:{port}", "--token", "s3cret"),
                *("--tls-ca", str(cert), "policy", "get"),
            ]
        )
        assert code == 0 and "adaptive" in capsys.readouterr().out
    finally:
        s.stop()


def test_a_missing_ca_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nowhere\.pem"):
        Endpoint.of("127.0.0.1:1", tls_ca=str(tmp_path / "nowhere.pem")).channel()
