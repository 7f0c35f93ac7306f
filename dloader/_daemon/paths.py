"""The daemons' files on a shared node: socket and state folders, and the claim on a socket.

* A folder the daemon creates gets a mode that keeps other users out (state: 0700; socket:
  0750, so that a group can reach the 0660 socket). A folder that exists already must belong
  to the daemon's user (or root) and must not be writable by others; else the daemon refuses
  to start, naming the folder: someone else could swap the socket or read the state.
* Before binding, a daemon takes an exclusive lock (``<socket>.lock``) for its lifetime, and
  removes an old socket only if it is a socket that no live daemon answers on. A regular file
  at the socket path is never removed. So a second daemon on the same socket refuses to start
  instead of taking the first one's clients.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from dloader.errors import ConfigError

__all__ = ["SocketClaim", "own_folder", "private_file"]


def own_folder(path: str | Path, *, mode: int, what: str) -> Path:
    """``path`` as a folder fit for the daemon: created with ``mode``, or checked if it exists:
    this user's or root's, and writable by no one else (a state folder: by no group either,
    whatever ``mode`` says of reading)."""
    if not str(path).strip():
        raise ConfigError(f"{what} folder '': expected a path (--{_FLAG.get(what, what)})")
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=False, mode=mode)
        os.chmod(folder, mode)  # mkdir's mode is masked by the umask
        return folder
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"{what} folder {str(folder)!r} cannot be created: {exc}") from None
    try:
        st = folder.stat()
    except OSError as exc:
        raise ConfigError(f"{what} folder {str(folder)!r}: {exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} folder {str(folder)!r} exists and is not a folder")
    flag = _FLAG.get(what, what)
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{what} folder {str(folder)!r} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}) or root: someone else created it first. Give --{flag} a "
            f"path in a folder of your own (e.g. under $HOME), or set XDG_RUNTIME_DIR"
        )
    writable = stat.S_IWOTH | (stat.S_IWGRP if not mode & stat.S_IWGRP else 0)
    if st.st_mode & writable:
        whom = "other users" if st.st_mode & stat.S_IWOTH else "its group"
        raise ConfigError(
            f"{what} folder {str(folder)!r} is writable by {whom} (mode "
            f"{stat.S_IMODE(st.st_mode):o}): anyone who may write it can replace what the "
            f"daemon keeps there. chmod {mode:o} it, or give --{flag} a folder of your own"
        )
    return folder


_FLAG = {"socket": "socket", "state": "state-dir"}


def private_file(path: str | Path) -> None:
    """Makes ``path`` (and SQLite's ``-wal``/``-shm`` files beside it) readable by its owner
    only."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)


class SocketClaim:
    """This daemon's claim on a Unix socket path, held while it serves."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(os.path.abspath(path))
        own_folder(self.path.parent, mode=0o750, what="socket")
        lock = f"{self.path}.lock"
        try:
            self._fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(f"socket lock {lock!r} cannot be opened: {exc}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ConfigError(
                f"socket {str(self.path)!r} is in use: another daemon holds {lock!r}"
            ) from None
        try:
            self._clear_stale()
        except BaseException:
            self.release()
            raise

    def _clear_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(
                f"socket path {str(self.path)!r} exists and is not a socket; it is left alone: "
                "choose another --socket or remove it yourself"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(self.path))
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise ConfigError(f"socket {str(self.path)!r}: {exc}") from None
            os.unlink(self.path)  # a stale socket from a killed daemon
            return
        finally:
            probe.close()
        raise ConfigError(f"socket {str(self.path)!r} is in use: a live daemon answers on it")

    def release(self) -> None:
        """Gives the path up (the daemon stopped)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
