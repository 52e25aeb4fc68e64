"""Committing files: an exclusive lock between processes, and a replace that a reader or a
crash never sees half done.

A file is replaced by writing a hidden file beside it, making that durable, renaming it
over the old one and making the rename durable in the folder: a reader opens the old file
or the new one, and a crash at any point leaves one of the two whole. Locks are ``flock``
on a file of their own: the kernel drops them when their holder dies, so a crashed
process never leaves a lock behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Makes the entries of a folder (created, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as error:
        # Some file systems refuse fsync on a folder; their renames are as durable as
        # they get.
        if error.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def hold_lock(path: Path, wait: bool = True) -> int:
    """Takes the exclusive lock on ``path`` (created if missing) and returns its descriptor;
    closing the descriptor releases it. With ``wait`` False a lock held elsewhere raises
    ``BlockingIOError`` at once."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_locked(path: Path) -> int:
    """Creates ``path``, which must not exist, locked by this process; returns its
    descriptor (open for reading and writing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def adopt(path: Path) -> int | None:
    """Locks a file that another process created and no live process holds; returns its
    descriptor (open for reading and writing), or None while a holder lives or once the
    file is gone."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not path.exists():  # removed by its holder between the open and the lock
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[None]:
    """Holds the exclusive lock on ``path`` for the block (see ``hold_lock``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = hold_lock(path, wait)
    try:
        yield
    finally:
        os.close(fd)


def temp_path(final: Path) -> Path:
    """A hidden name beside ``final`` that no other writer, thread or process, picks."""
    return final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def replacing(final: Path, durable: bool = True, tmp: Path | None = None) -> Iterator[Path]:
    """Yields a temporary path to write the new ``final`` to; when the block ends without an
    error the file replaces ``final`` (made durable first unless ``durable`` is False), and
    otherwise it is removed and ``final`` is left as it was."""
    tmp = tmp or temp_path(final)
    try:
        yield tmp
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(final.parent)


def replace_bytes(final: Path, data: bytes, durable: bool = True, tmp: Path | None = None) -> None:
    """Replaces ``final`` with ``data`` (see ``replacing``)."""
    with replacing(final, durable, tmp) as path:
        path.write_bytes(data)
