"""Every environment variable dloader reads, in one place (docs/loader.md lists the same table).

=============================  ==========================================================
``DLOADER_POLL_INTERVAL_S``    how often (s) a waiting trainer wakes to apply resizes and
                               notice dead workers (default 0.05; read at import)
``DLOADER_SIDECAR``            the node sidecar a loader joins: ``unix:///path.sock`` or
                               ``host:port`` (default: none)
``DLOADER_SIDECAR_TOKEN``      bearer token for a sidecar on TCP (the daemon's ``--token``
                               default and the clients')
``DLOADER_JOB_NAME``           the job's name at the sidecar (default: script-PID)
``DLOADER_JOB_KEY``            what ties the job's loaders to its job at the cluster
                               allocator (``dloader-launch`` sets it; a name never does)
``DLOADER_REPORT_INTERVAL_S``  seconds between a loader's reports to the sidecar (default 1)
``DLOADER_ALLOCATOR``          the cluster allocator (``--allocator`` default of the sidecar
                               and the launcher)
``DLOADER_ALLOCATOR_TOKEN``    bearer token for an allocator on TCP
``DLOADER_TLS_CA``             PEM file of the CA that signed the daemons' TLS certificates;
                               clients use TLS on TCP when it is set
``DLOADER_AUTO_PEERS``         ``1`` (default) or ``0``: whether a ``num_workers="auto"``
                               loader shares the machine's CPU with this user's other tuned
                               loaders (``0``: it works alone)
``DLOADER_CACHE``              folder for generated benchmark data, e.g. the real-pipeline
                               JPEGs (default ``$XDG_CACHE_HOME/dloader``, else
                               ``~/.cache/dloader``)
``XDG_RUNTIME_DIR``            default socket folder: ``$XDG_RUNTIME_DIR/dloader``
``XDG_STATE_HOME``             default state folder: ``$XDG_STATE_HOME/dloader``
=============================  ==========================================================

Exported, not read: ``dloader-launch`` sets these for the training script it starts (see
:data:`LAUNCH_EXPORTS`):

=============================  ==========================================================
``DLOADER_JOB_NAME``           the job id (also read, above)
``DLOADER_ALLOCATED_GPUS``     the job's processes (GPUs) on this node
``DLOADER_GLOBAL_BATCH_SIZE``  the global batch size of the allocation it was started for
``DLOADER_LOCAL_BATCH_SIZE``   each process's batch in that allocation (start the loader
                               with it; later changes come through the sidecar)
``DLOADER_ACCUMULATION_STEPS`` micro-batches per optimizer step in that allocation
``DLOADER_GENERATION``         the allocation's placement generation (rises with each change)
``DLOADER_JOB_KEY``            the job's key (also read, above)
=============================  ==========================================================

Values are read when asked for (so a daemon's settings are built from the environment of the
moment), except ``DLOADER_POLL_INTERVAL_S``, which the loader reads once at import. A bad value
raises :class:`dloader.errors.ConfigError` naming the variable and what was expected.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from dloader._shared.files import MAX_SECRET_BYTES, open_regular
from dloader.errors import ConfigError

__all__ = [
    "LAUNCH_EXPORTS",
    "allocator_target",
    "allocator_token",
    "auto_peers",
    "cache_dir",
    "default_socket",
    "default_state_dir",
    "env_float",
    "env_str",
    "job_key",
    "job_name",
    "launch_exports",
    "report_interval_s",
    "secret",
    "sidecar_target",
    "sidecar_token",
    "tls_ca",
    "tls_client_cert",
    "tracemalloc_dir",
]


def env_str(name: str) -> str | None:
    """A string variable; unset or empty is ``None``."""
    return os.environ.get(name) or None


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """A float variable (``default`` when unset), which must be finite and > ``minimum``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not a number") from None
    if not (math.isfinite(value) and value > minimum):
        raise ConfigError(
            f"environment variable {name}={raw!r} must be a finite number > {minimum}"
        )
    return value


def secret(value: str | None, what: str) -> str | None:
    """A token given as itself, or as ``@/path/to/file`` (its first line): a file keeps it out
    of ``ps`` and shell history. The file must not be readable by other users."""
    if not value or not value.startswith("@"):
        return value or None
    path = Path(value[1:])
    fd = open_regular(path, f"{what} file", follow=True)  # a link is fine (Kubernetes secrets)
    if fd is None:
        raise ConfigError(f"{what} file {str(path)!r} cannot be read: it does not exist")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        raw = f.read(MAX_SECRET_BYTES)
    try:
        text = raw.decode().strip().splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} file {str(path)!r} is not text") from None
    if st.st_mode & 0o004:
        raise ConfigError(f"{what} file {str(path)!r} is readable by other users (chmod 600 it)")
    if st.st_mode & 0o022:
        raise ConfigError(
            f"{what} file {str(path)!r} is writable by others (mode "
            f"{st.st_mode & 0o777:o}): anyone who may write it sets the token (chmod 600 it)"
        )
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{what} file {str(path)!r} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}) or root: its owner sets the token; use a file of your own"
        )
    if not text or not text[0]:
        raise ConfigError(f"{what} file {str(path)!r} is empty")
    return text[0]


def sidecar_target() -> str | None:
    """``DLOADER_SIDECAR``."""
    return env_str("DLOADER_SIDECAR")


def sidecar_token() -> str | None:
    """``DLOADER_SIDECAR_TOKEN``."""
    return env_str("DLOADER_SIDECAR_TOKEN")


def job_name() -> str | None:
    """``DLOADER_JOB_NAME``."""
    return env_str("DLOADER_JOB_NAME")


def report_interval_s() -> float:
    """``DLOADER_REPORT_INTERVAL_S`` (default 1.0)."""
    return env_float("DLOADER_REPORT_INTERVAL_S", 1.0)


def tls_client_cert() -> tuple[str, str] | None:
    """``DLOADER_TLS_CERT`` and ``DLOADER_TLS_KEY``: this client's certificate and key (PEM) for
    a daemon that asks for one (mutual TLS); both or neither."""
    cert, key = env_str("DLOADER_TLS_CERT"), env_str("DLOADER_TLS_KEY")
    if bool(cert) != bool(key):
        raise ConfigError("DLOADER_TLS_CERT and DLOADER_TLS_KEY go together: set both or neither")
    return (cert, key) if cert and key else None


def tracemalloc_dir() -> Path | None:
    """``DLOADER_TRACEMALLOC``: a folder where a daemon writes its Python heap (tracemalloc)
    every 30 s, for soak runs (unset: not traced)."""
    value = env_str("DLOADER_TRACEMALLOC")
    return Path(value) if value else None


def allocator_target() -> str | None:
    """``DLOADER_ALLOCATOR``."""
    return env_str("DLOADER_ALLOCATOR")


def allocator_token() -> str | None:
    """``DLOADER_ALLOCATOR_TOKEN``."""
    return env_str("DLOADER_ALLOCATOR_TOKEN")


def tls_ca() -> str | None:
    """``DLOADER_TLS_CA``."""
    return env_str("DLOADER_TLS_CA")


def auto_peers() -> bool:
    """``DLOADER_AUTO_PEERS`` (default ``1``)."""
    raw = env_str("DLOADER_AUTO_PEERS")
    if raw is None or raw in ("1", "0"):
        return raw != "0"
    raise ConfigError(f"environment variable DLOADER_AUTO_PEERS={raw!r}: expected 1 or 0")


def cache_dir() -> Path:
    """``$DLOADER_CACHE``, else ``$XDG_CACHE_HOME/dloader``, else ``~/.cache/dloader``."""
    own = env_str("DLOADER_CACHE")
    if own:
        return Path(own)
    return Path(env_str("XDG_CACHE_HOME") or Path.home() / ".cache") / "dloader"


#: The variables ``dloader-launch`` exports to the training script it starts, and what each
#: holds; :func:`launch_exports` builds them.
LAUNCH_EXPORTS = {
    "DLOADER_JOB_NAME": "the job id",
    "DLOADER_ALLOCATED_GPUS": "the job's processes (GPUs) on this node",
    "DLOADER_GLOBAL_BATCH_SIZE": "the global batch size of the allocation it was started for",
    "DLOADER_LOCAL_BATCH_SIZE": "each process's batch in that allocation",
    "DLOADER_ACCUMULATION_STEPS": "micro-batches per optimizer step in that allocation",
    "DLOADER_GENERATION": "the allocation's placement generation",
    "DLOADER_JOB_KEY": "the job's key: ties its loaders to the allocator's job at the sidecar",
}


def launch_exports(
    job_id: str,
    gpus: int,
    global_batch_size: int,
    local_batch_size: int,
    accumulation_steps: int,
    generation: int,
    key: str,
) -> dict[str, str]:
    """The :data:`LAUNCH_EXPORTS` values for one start of a job's training script (each
    value as the allocation gives it: nothing is computed here)."""
    values = (
        job_id,
        gpus,
        global_batch_size,
        local_batch_size,
        accumulation_steps,
        generation,
        key,
    )
    return {name: str(v) for name, v in zip(LAUNCH_EXPORTS, values, strict=True)}


def job_key() -> str:
    """``DLOADER_JOB_KEY`` ("" when unset): 64 hex digits, as ``dloader-launch`` sets it."""
    key = env_str("DLOADER_JOB_KEY") or ""
    if key and (len(key) != 64 or any(c not in "0123456789abcdef" for c in key)):
        raise ConfigError(
            f"DLOADER_JOB_KEY={key[:80]!r}: expected 64 lowercase hex digits, as dloader-launch "
            "sets it"
        )
    return key


def default_socket(name: str = "sidecar.sock") -> str:
    """``$XDG_RUNTIME_DIR/dloader/<name>``, else ``/tmp/dloader-<uid>/<name>``."""
    runtime = env_str("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "dloader" / name)
    return f"/tmp/dloader-{os.getuid()}/{name}"


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/dloader``, else ``~/.local/state/dloader``."""
    base = env_str("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "dloader")
