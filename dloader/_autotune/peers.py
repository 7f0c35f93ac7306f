"""Where the ``num_workers="auto"`` loaders of one user on one machine see each other.

Each tuned loader writes one small JSON file, its :class:`dloader._autotune.tuner.Peer` (what a
CPU-second is worth to it, the CPU its workers used, whether its trainer waits for them, how
busy its trainer is), into a directory only its user can use: ``dloader-auto-<uid>`` under
``/dev/shm`` (else the temporary directory). It reads the others' files with each window it
measures. No daemon, no socket: the files are the whole protocol, and a loader that finds the
directory unsafe (not a directory of its own user, or open to others) works alone, as if it
had no peers.

Bounded: at most :data:`MAX_PEERS` files are read, each at most :data:`MAX_BYTES`; a file not
rewritten for :data:`STALE_S` seconds, or whose process is gone, is ignored (and removed once
it is :data:`REMOVE_S` old). Another user's loaders are never seen: they share CPU through the
idle-CPU rule alone.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import stat
import tempfile
import time
from pathlib import Path

from dloader._autotune.tuner import Peer

__all__ = ["PeerBoard", "default_root"]

log = logging.getLogger("dloader")

MAX_PEERS = 64
MAX_BYTES = 512
#: Longer than the longest window (``_autotune.MAX_WINDOW_S``) a live loader measures.
STALE_S = 40.0
REMOVE_S = 300.0
_SUFFIX = ".json"
_keys = itertools.count()


def default_root() -> Path:
    """``/dev/shm`` where it is a writable directory (memory, cleared at boot), else the
    temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PeerBoard:
    """One loader's file on the board, and its view of the others' (see the module's docstring)."""

    def __init__(self, root: Path | None = None, *, enabled: bool = True) -> None:
        uid = os.getuid()
        self.dir = (root if root is not None else default_root()) / f"dloader-auto-{uid}"
        self.pid = os.getpid()
        self.path = self.dir / f"{self.pid}-{next(_keys)}{_SUFFIX}"
        self.usable = enabled and self._prepare(uid)

    def _prepare(self, uid: int) -> bool:
        try:
            self.dir.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(self.dir)
        except OSError as e:
            log.info("dloader: num_workers='auto' works alone: cannot use %s (%s)", self.dir, e)
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
            log.warning(
                "dloader: num_workers='auto' works alone: %s is not a directory of uid %d "
                "closed to others (mode %o, owner %d)",
                self.dir,
                uid,
                stat.S_IMODE(st.st_mode),
                st.st_uid,
            )
            return False
        return True

    def publish(self, peer: Peer, now: float | None = None) -> None:
        """Writes this loader's file (atomically: a reader sees the old or the new one)."""
        if not self.usable:
            return
        record = {
            "pid": self.pid,
            "time": time.time() if now is None else now,
            "worth": peer.worth,
            "cpus": peer.cpus,
            "starved": peer.starved,
            "busy": peer.busy,
            "yielding": peer.yielding,
            "settled": peer.settled,
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)
        except OSError as e:
            log.debug("dloader: cannot publish to %s: %s", self.path, e)

    def peers(self, now: float | None = None) -> tuple[Peer, ...]:
        """The other loaders' last records: live, fresh and well formed ones only."""
        if not self.usable:
            return ()
        now = time.time() if now is None else now
        try:
            with os.scandir(self.dir) as entries:
                names = [
                    e.name
                    for e in itertools.islice(entries, 4 * MAX_PEERS)
                    if e.name.endswith(_SUFFIX) and e.name != self.path.name
                ]
        except OSError:
            return ()
        out: list[Peer] = []
        for name in names[:MAX_PEERS]:
            record = self._read(self.dir / name)
            if record is None:
                continue
            pid, when, peer = record
            if now - when > REMOVE_S or not _alive(pid):
                self._remove(self.dir / name)
            elif now - when <= STALE_S:
                out.append(peer)
        return tuple(out)

    @staticmethod
    def _read(path: Path) -> tuple[int, float, Peer] | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                data = os.read(fd, MAX_BYTES + 1)
            finally:
                os.close(fd)
            if len(data) > MAX_BYTES:
                return None
            r = json.loads(data)
            pid, when = r["pid"], r["time"]
            worth, cpus, starved, busy = r["worth"], r["cpus"], r["starved"], r["busy"]
            yielding, settled = r["yielding"], r["settled"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        numbers = (when, worth, cpus, busy)
        if (
            type(pid) is not int
            or pid <= 0
            or type(starved) is not bool
            or type(yielding) is not bool
            or type(settled) is not bool
        ):
            return None
        if not all(isinstance(x, int | float) and math.isfinite(x) for x in numbers):
            return None
        if worth < 0 or not 0 <= cpus <= 4096 or not 0 <= busy <= 1:
            return None
        peer = Peer(float(worth), float(cpus), starved, float(busy), yielding, settled)
        return pid, float(when), peer

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    def close(self) -> None:
        """Takes this loader's file off the board."""
        if self.usable:
            self._remove(self.path)
