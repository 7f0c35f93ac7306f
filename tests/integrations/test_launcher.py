"""dloader-launch acts only on a job it submitted, or whose token it holds, against a real
allocator on TCP (each launcher a client of its own, by the client token): an id another client
took first is refused, as is a wrong token, and an id whose job has ended; each says why, and
the script never runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from dloader._shared.client import Endpoint
from dloader.integrations import launcher
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc
from tests._daemon import free_port
from tests.allocator.test_service import SCALING, Allocator, job

SCALING_JSON = json.dumps(
    {
        f: getattr(SCALING, f)
        for f in ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")
    }
)


@pytest.fixture
def tcp(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    alloc = Allocator(
        tmp_path, "--listen", f"127.0.0.1:{port}", "--token", "op", "--client-token", "cl"
    )
    yield f"127.0.0.1:{port}"
    alloc.stop()


def argv(target: str, tmp_path: Path, *extra: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    return [
        *("--allocator", target, "--token", "cl", "--job-id", "bert-7", "--node-id", "n0"),
        *("--batch-size", "32", "--scaling", SCALING_JSON, *extra, str(script)),
    ]


def submit(target: str) -> str:
    """Another client submits bert-7 first; its token."""
    with Endpoint.of(target, "cl").channel() as channel:
        stub = pb_grpc.ClusterAllocatorStub(channel)
        meta = (("authorization", "Bearer cl"),)
        return stub.SubmitJob(job("bert-7"), metadata=meta, timeout=10).token


def test_an_id_another_client_took_is_refused(
    tcp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(tcp)
    assert launcher.main(argv(tcp, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "'bert-7' is already taken" in err and "no token for it" in err
    wrong = tmp_path / "wrong.token"
    wrong.write_text("0" * 32)
    assert launcher.main(argv(tcp, tmp_path, "--token-file", str(wrong))) == 2
    assert f"the token in {wrong} is not job 'bert-7''s" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_an_id_whose_job_ended_is_not_run_again(
    tcp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = submit(tcp)
    with Endpoint.of(tcp, "cl").channel() as channel:
        pb_grpc.ClusterAllocatorStub(channel).CompleteJob(
            pb.CompleteJobRequest(job_id="bert-7", token=token),
            metadata=(("authorization", "Bearer cl"),),
            timeout=10,
        )
    mine = tmp_path / "bert-7.token"
    mine.write_text(token)  # even with the job's own token (a re-run of the same launcher)
    assert launcher.main(argv(tcp, tmp_path, "--token-file", str(mine))) == 2
    assert "'bert-7' has already ended" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_with_the_jobs_token_a_launcher_follows_it(tcp: str, tmp_path: Path) -> None:
    """A launcher restarted with the token file of the job it submitted resumes it."""
    mine = tmp_path / "bert-7.token"
    mine.write_text(submit(tcp))
    args = launcher.parser().parse_args(argv(tcp, tmp_path, "--token-file", str(mine)))
    run = launcher.Launcher(args, Endpoint.of(tcp, "cl"), launcher.job_spec(args))

    async def submit_step() -> None:
        async with run.allocator.aio_channel() as channel:
            await run._submit(pb_grpc.ClusterAllocatorStub(channel))

    asyncio.run(submit_step())
    assert run.submitted and run.checked


def test_a_follower_that_starts_first_waits_for_the_job_and_its_token(
    tmp_path: Path, tcp: str
) -> None:
    """A follower may start before the submitting launcher: with no token file yet it waits
    (run() retries), it is not refused; once the job and its token exist it follows."""
    token_file = tmp_path / "bert-7.token"
    args = argv(tcp, tmp_path, "--follow", "--token-file", str(token_file))
    args.remove("--batch-size")
    args.remove("32")
    run = launcher.Launcher(launcher.parser().parse_args(args), Endpoint.of(tcp, "cl"), None)

    async def submit_step() -> bool:
        async with run.allocator.aio_channel() as channel:
            return await run._submit(pb_grpc.ClusterAllocatorStub(channel))

    assert not asyncio.run(submit_step()) and not run.checked  # waits, not refused
    token_file.write_text(submit(tcp))
    assert asyncio.run(submit_step()) and run.checked


def test_a_follower_with_a_wrong_token_is_refused(
    tcp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(tcp)
    wrong = tmp_path / "wrong.token"
    wrong.write_text("0" * 32)
    args = argv(tcp, tmp_path, "--follow", "--token-file", str(wrong))
    args.remove("--batch-size")
    args.remove("32")
    assert launcher.main(args) == 2
    assert "is not job 'bert-7''s" in capsys.readouterr().err
    assert grpc is not None  # the module talks gRPC: it runs isolated (tests/conftest.py)
