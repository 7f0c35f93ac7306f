"""One precedence rule for both daemons: flag > environment > stored at run time > default."""

from __future__ import annotations

import pytest

from dloader.allocator.cli import parser as allocator_parser
from dloader.allocator.config import AllocatorDaemonConfig, Settings
from dloader.errors import ConfigError
from dloader.sidecar.cli import parser as sidecar_parser
from dloader.sidecar.config import PolicySettings, SidecarDaemonConfig


def sidecar(*flags: str, stored: str | None = None) -> SidecarDaemonConfig:
    return SidecarDaemonConfig.resolve(
        sidecar_parser().parse_args(["--socket", "/tmp/x.sock", *flags]), stored
    )


def allocator(*flags: str, stored: str | None = None) -> AllocatorDaemonConfig:
    args = allocator_parser().parse_args(["--socket", "/tmp/a.sock", *flags])
    return AllocatorDaemonConfig.resolve(args, stored)


def test_sidecar_stored_policy_beats_defaults_and_flags_beat_stored() -> None:
    stored = PolicySettings("even", 5, 1, 3.0).to_json()
    assert sidecar().policy.name == "adaptive"
    assert sidecar(stored=stored).policy == PolicySettings("even", 5, 1, 3.0)
    p = sidecar("--policy", "adaptive", "--period", "0.5", stored=stored).policy
    assert p == PolicySettings("adaptive", 5, 1, 0.5)
    # anything but what to_json wrote is refused, naming the value (no release wrote another)
    with pytest.raises(ConfigError, match=r"stored policy 'even,6,2,1\.0' is unreadable"):
        sidecar(stored="even,6,2,1.0")


def test_allocator_stored_settings_beat_defaults_and_flags_beat_stored() -> None:
    stored = Settings("elastic-dp", 30.0, True, 10.0).to_json()
    assert allocator().settings == Settings()
    assert allocator(stored=stored).settings == Settings("elastic-dp", 30.0, True, 10.0)
    got = allocator("--no-dry-run", "--policy", "static", stored=stored).settings
    assert got == Settings("static", 30.0, False, 10.0)


def test_environment_gives_tokens_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLOADER_SIDECAR_TOKEN", "from-env")
    monkeypatch.setenv("DLOADER_ALLOCATOR", "unix:///tmp/alloc.sock")
    c = sidecar("--listen", "127.0.0.1:0")
    assert c.listen.token == "from-env"
    assert c.allocator is not None and c.allocator.target == "unix:///tmp/alloc.sock"
    assert sidecar("--listen", "127.0.0.1:0", "--token", "flag").listen.token == "flag"
    monkeypatch.setenv("DLOADER_ALLOCATOR_TOKEN", "a-env")
    assert allocator("--listen", "127.0.0.1:0").listen.token == "a-env"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--listen", "127.0.0.1:99999", "--token", "t"), "port in 0..65535"),
        (("--listen", "nohost", "--token", "t"), "expected HOST:PORT"),
        (("--listen", "127.0.0.1:0"), "TCP needs --token"),
        (("--tls-cert", "c.pem"), "go together"),
        (("--metrics-port", "70000"), "--metrics-port 70000"),
        (("--period", "-1"), "config.period_seconds"),
        (("--worker-budget", "0"), "config.worker_budget"),
        (("--lend-cores",), "--lend-cores: a GPU node lends its spare cores through the alloc"),
        (("--cpu-pool",), "--cpu-pool: a node of the allocator's CPU pool offers no GPUs"),
    ],
)
def test_bad_sidecar_settings_name_the_value(flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sidecar(*flags)


def test_bad_allocator_settings_name_the_value() -> None:
    with pytest.raises(ConfigError, match="--node-timeout -1"):
        allocator("--node-timeout", "-1")
    with pytest.raises(ValueError, match=r"config\.interval_seconds"):
        allocator("--interval", "0")


@pytest.mark.parametrize("value", ["nan", "inf", "1e999"])
def test_non_finite_numbers_are_refused_by_the_parsers(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for make, flag in ((sidecar, "--period"), (allocator, "--interval")):
        with pytest.raises(SystemExit):
            make(flag, value)
        assert f"argument {flag}: {value!r}: expected a finite number" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="stored settings"):
        allocator(stored="{not json")


def test_the_default_worker_budget_is_the_least_of_the_nodes_measured_limits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Memory, open files, processes and CPU each divided by what a worker costs of them; the
    least is the default, and ``--help`` says which and why."""
    import resource

    from dloader.sidecar import config

    limits = config.default_budget()
    assert limits.workers == min(
        limits.memory, limits.open_files, limits.processes, limits.cpu, 4096
    )
    assert limits.cpu == int(config.UPKEEP_SHARE * limits.cpus / config.WORKER_UPKEEP_CORES)
    assert sidecar().policy.worker_budget == limits.workers
    # a trainer allowed 100 open files holds (100 - 64) / 5 = 7 workers: that binds
    real = resource.getrlimit
    monkeypatch.setattr(
        resource,
        "getrlimit",
        lambda which: (100, 100) if which == resource.RLIMIT_NOFILE else real(which),
    )
    small = config.default_budget()
    assert small.open_files == 7 and small.workers == 7
    assert "7 = the least of memory" in small.describe()
    with pytest.raises(SystemExit):
        sidecar_parser().parse_args(["--help"])
    assert "open files 7" in " ".join(capsys.readouterr().out.split())
