"""Files a client trusts on a shared machine: credentials it reads and writes.

The rule: a file a process trusts is one its own user made, in a folder only its user can
write. Another user who can write the folder can put a symbolic link where the file will be
written (the process then overwrites whatever the link names), create the file first (and read
what is written into it, or set what is read from it), or put a FIFO or a folder there (a
reader blocks, or fails after it acted). So:

* :func:`check_private_folder`: the folder exists, is a folder, belongs to this user (or root)
  and is writable by no group and no one else;
* :func:`read_private`: a regular file (opened without following a link, without blocking on
  a FIFO), this user's, readable by no one else;
* :func:`write_private`: written into a new file created exclusively beside the path, without
  following links, then renamed over it (a link at the path is replaced, never followed).

Each refusal is a :class:`~dloader.errors.ConfigError` naming the path and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from dloader.errors import ConfigError

__all__ = [
    "MAX_SECRET_BYTES",
    "check_private_folder",
    "open_regular",
    "read_private",
    "write_private",
]

MAX_SECRET_BYTES = 4096  # read from a credential file at most

_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def check_private_folder(folder: Path, what: str) -> None:
    """That ``folder`` may hold ``what``: it exists, is a folder, belongs to this user or root,
    and no group or other user may write it."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        raise ConfigError(
            f"{what}: folder {str(folder)!r} does not exist; create it (mode 700) first"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{what}: folder {str(folder)!r}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what}: {str(folder)!r} is {_kind(st.st_mode)}, not a folder")
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{what}: folder {str(folder)!r} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}): its owner could replace the file. Use a folder of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        whom = "other users" if st.st_mode & stat.S_IWOTH else "its group"
        raise ConfigError(
            f"{what}: folder {str(folder)!r} is writable by {whom} (mode "
            f"{stat.S_IMODE(st.st_mode):o}): another user could put a link, a FIFO or a file "
            "of theirs there first. Use a folder only you can write (chmod 700)"
        )


def open_regular(path: Path, what: str, *, follow: bool) -> int | None:
    """A read-only descriptor of the regular file ``path`` (None: it does not exist), opened
    without blocking on a FIFO and, unless ``follow``, without following a symbolic link;
    else :class:`ConfigError` saying what is there instead."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"{what} {str(path)!r} is a symbolic link: refusing to follow it (it may point "
                "at another user's file)"
            ) from None
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{what} {str(path)!r} is {_kind(st.st_mode)}, not a regular file")
    return fd


def read_private(path: Path, what: str) -> str | None:
    """The first line of the credential file ``path`` (None: no file yet); it must be a
    regular file of this user's, not a link, readable and writable by no one else."""
    fd = open_regular(path, what, follow=False)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"{what} {str(path)!r} belongs to uid {st.st_uid}, not to this user (uid "
                f"{os.geteuid()}): someone else made it. Remove it, or use a folder of your own"
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{what} {str(path)!r} may be read or written by others (mode "
                f"{stat.S_IMODE(st.st_mode):o}): it is not a credential this launcher wrote"
            )
        raw = f.read(MAX_SECRET_BYTES)
    try:
        lines = raw.decode().strip().splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {str(path)!r} is not text") from None
    return lines[0].strip() if lines else ""


def write_private(path: Path, text: str, what: str) -> None:
    """Writes ``text`` to ``path`` (mode 0600) in a folder only this user may write: into a
    new file made exclusively beside it, then renamed over ``path``."""
    check_private_folder(path.parent, what)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise ConfigError(f"{what} {str(path)!r} is a folder, not a file")
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
