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


def private(path: Path, text: str) -> Path:
    """A token file as a launcher writes it (mode 0600)."""
    path.write_text(text)
    path.chmod(0o600)
    return path


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
    wrong = private(tmp_path / "wrong.token", "0" * 32)
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
    # even with the job's own token (a re-run of the same launcher)
    mine = private(tmp_path / "bert-7.token", token)
    assert launcher.main(argv(tcp, tmp_path, "--token-file", str(mine))) == 2
    assert "'bert-7' has already ended" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_with_the_jobs_token_a_launcher_follows_it(tcp: str, tmp_path: Path) -> None:
    """A launcher restarted with the token file of the job it submitted resumes it."""
    mine = private(tmp_path / "bert-7.token", submit(tcp))
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
    private(token_file, submit(tcp))
    assert asyncio.run(submit_step()) and run.checked


def test_a_follower_with_a_wrong_token_is_refused(
    tcp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(tcp)
    wrong = private(tmp_path / "wrong.token", "0" * 32)
    args = argv(tcp, tmp_path, "--follow", "--token-file", str(wrong))
    args.remove("--batch-size")
    args.remove("32")
    assert launcher.main(args) == 2
    assert "is not job 'bert-7''s" in capsys.readouterr().err
    assert grpc is not None  # the module talks gRPC: it runs isolated (tests/conftest.py)


def test_an_operators_launcher_with_a_wrong_token_is_refused(
    tcp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#49 §1 (high): the token check was an empty UpdateJob, which passes for an operator
    whatever the token: with any token file at its path, the operator's launcher ran its
    script on another's job. Now the allocator checks a given token for every caller."""
    submit(tcp)  # another client's job
    wrong = private(tmp_path / "wrong.token", "0" * 32)
    args = argv(tcp, tmp_path, "--token-file", str(wrong))
    args[args.index("--token") + 1] = "op"  # the operator's launcher
    assert launcher.main(args) == 2
    assert "is not job 'bert-7''s" in capsys.readouterr().err
    follow = argv(tcp, tmp_path, "--follow", "--token-file", str(wrong))
    follow[follow.index("--token") + 1] = "op"
    follow.remove("--batch-size")
    follow.remove("32")
    assert launcher.main(follow) == 2
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo", "others", "readable", "shared"])
def test_a_token_file_the_launcher_did_not_make_is_refused_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """#49 §1 (high, medium): the launcher wrote its token through a symlink another user put
    there (overwriting a file of root's), leaked it through a file another user made first, a
    folder there ended the submitter in a traceback after it submitted (the job kept its GPU)
    and a FIFO blocked a follower past SIGTERM. Each is refused at start, before the allocator
    is contacted (there is none here: a refusal that waited for it would time out)."""
    import os

    folder = tmp_path / "tokens"
    folder.mkdir(mode=0o700)
    path = folder / "bert-7.token"
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "others":
        private(path, "f" * 32)
        os.chown(path, 65534, 65534)
    elif kind == "readable":
        path.write_text("f" * 32)
        path.chmod(0o644)
    else:  # a folder others may write: they could make any of the above
        folder.chmod(0o1777)
    target = f"unix://{tmp_path / 'no-allocator.sock'}"
    for extra in ((), ("--follow",)):
        args = argv(target, tmp_path, *extra, "--token-file", str(path))
        if extra:
            args.remove("--batch-size")
            args.remove("32")
        assert launcher.main(args) == 2
        err = capsys.readouterr().err
        assert "--token-file" in err and str(folder) in err, err
    assert victim.read_text() == "root's file\n"
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--scaling", json.dumps({**json.loads(SCALING_JSON), "gamma": float("nan")}), "gamma"),
        ("--measurements", "garbage", "--measurements"),
        ("--measurements", "nul", "--measurements"),
        ("--measurements", "fifo", "FIFO"),
        ("--token-file", "missing-folder", "does not exist"),
    ],
)
def test_bad_inputs_are_refused_before_the_allocator_is_contacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    """#49 §1 (low): ``--scaling`` with NaN, a garbage ``--measurements`` file and a missing
    ``--token-file`` folder waited for the allocator instead of being refused."""
    import os

    if flag == "--measurements":
        path = tmp_path / "m.csv"
        if value == "garbage":
            path.write_bytes(b"\xff\xfe garbage \x00\n1,2\n")
        elif value == "nul":
            path.write_text("nodes,replicas,local_bsz,step_time\n1,1,\x00,0.1\n")
        else:
            os.mkfifo(path)
        value = str(path)
    elif flag == "--token-file":
        value = str(tmp_path / "nowhere" / "bert-7.token")
    args = argv(f"unix://{tmp_path / 'no-allocator.sock'}", tmp_path)
    if flag == "--scaling":
        args[args.index("--scaling") + 1] = value
    else:
        args[-1:-1] = [flag, value]
    assert launcher.main(args) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert not (tmp_path / "ran").exists()
