"""Spill files: where a producer keeps events while the backend is down or slow.

Each producer writes its own file ``spill-<pid>-<random>.log`` of CRC-checked frames and
holds an exclusive ``flock`` on it while it lives. A file nobody holds belongs to a producer
that is gone (closed with the backend down, or killed): the next producer adopts it and
delivers it before anything of its own, so nothing spilled is lost across restarts. A torn
tail (a producer killed mid-write) is cut when a file is adopted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from pathlib import Path

from services.common import filecommit
from services.eventlog import framing
from services.eventlog.records import KeyValue

log = logging.getLogger(__name__)

_READ_CHUNK = 1024 * 1024


class SpillFile:
    """One spill file: append frames at the end, read them back from a cursor, in order.

    Appends and reads may come from different threads; a lock serializes them.
    """

    def __init__(self, path: Path, fd: int, max_bytes: int, adopted: bool) -> None:
        self.path = path
        self.adopted = adopted
        """True for the file of a producer that is gone."""
        self._fd = fd
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._end = os.fstat(fd).st_size
        self._read_pos = 0
        self._count = 0
        """Records written and not yet read back (exact for own files, counted on adoption)."""

    @classmethod
    def create(cls, folder: Path, max_bytes: int) -> SpillFile:
        """A new, locked, empty spill file of this process."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"spill-{os.getpid()}-{os.urandom(4).hex()}.log"
        return cls(path, filecommit.create_locked(path), max_bytes, adopted=False)

    @classmethod
    def adopt_orphans(cls, folder: Path, max_bytes: int) -> list[SpillFile]:
        """Spill files no live producer holds, oldest first, locked for this process, with
        torn tails cut."""
        if not folder.is_dir():
            return []
        adopted = []
        for path in sorted(folder.glob("spill-*.log"), key=lambda p: p.stat().st_mtime):
            fd = filecommit.adopt(path)
            if fd is None:
                continue
            spill = cls(path, fd, max_bytes, adopted=True)
            spill._repair()
            if spill.pending_bytes == 0:
                spill.remove()
                continue
            log.info(
                "eventlog: adopted spill file %s with %d event(s)", path.name, spill.pending_count
            )
            adopted.append(spill)
        return adopted

    def _repair(self) -> None:
        """Counts the intact records and cuts a torn tail."""
        pos, count = 0, 0
        while pos < self._end:
            chunk = os.pread(self._fd, min(_READ_CHUNK, self._end - pos), pos)
            frames, stop = framing.decode(chunk)
            if not frames:
                whole = self._frame_at(pos)
                frames, stop = framing.decode(whole, max_records=1)
                if not frames:
                    break
            count += len(frames)
            pos += stop
        if pos < self._end:
            log.warning("eventlog: cut %d byte(s) of torn tail from %s", self._end - pos, self.path)
            os.ftruncate(self._fd, pos)
            self._end = pos
        self._count = count

    def _frame_at(self, pos: int) -> bytes:
        header = os.pread(self._fd, framing.HEADER.size, pos)
        if len(header) < framing.HEADER.size:
            return b""
        body_len, _ = framing.HEADER.unpack(header)
        if body_len > framing.MAX_BODY:
            return b""
        return os.pread(self._fd, framing.HEADER.size + body_len, pos)

    @property
    def pending_bytes(self) -> int:
        """Bytes written and not yet read back."""
        return self._end - self._read_pos

    @property
    def pending_count(self) -> int:
        """Records written and not yet read back."""
        return self._count

    def append(self, records: list[KeyValue]) -> int:
        """Writes the records at the end (to the page cache: survives a killed process) and
        returns how many it took: those that fit under the cap, none if the disk is full."""
        frames = [framing.encode(key, value) for key, value in records]
        with self._lock:
            room, take = self._max_bytes - self._end, 0
            for frame in frames:
                if len(frame) > room:
                    break
                room -= len(frame)
                take += 1
            if take == 0:
                return 0
            data = b"".join(frames[:take])
            try:
                framing.pwrite_all(self._fd, data, self._end)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._end)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    return 0
                raise
            self._end += len(data)
            self._count += take
            return take

    def peek(self, max_records: int) -> tuple[list[KeyValue], int]:
        """Up to ``max_records`` records from the read cursor, and the bytes they span."""
        with self._lock:
            if self._read_pos >= self._end:
                return [], 0
            chunk = os.pread(self._fd, min(_READ_CHUNK, self._end - self._read_pos), self._read_pos)
            frames, stop = framing.decode(chunk, max_records=max_records)
            if not frames:
                whole = self._frame_at(self._read_pos)
                frames, stop = framing.decode(whole, max_records=1)
                if not frames:
                    # Only this process writes the file, under the lock: a bad frame here is
                    # damage on disk. Skip the rest rather than block delivery forever.
                    log.error(
                        "eventlog: unreadable spill record in %s at %d; %d byte(s) skipped",
                        self.path,
                        self._read_pos,
                        self._end - self._read_pos,
                    )
                    self._read_pos = self._end
                    self._count = 0
                    return [], 0
            return [(key, value) for _, key, value in frames], stop

    def consume(self, n_records: int, n_bytes: int) -> None:
        """Moves the read cursor past records that were delivered; empties the file once all
        are, so it does not grow across outages."""
        with self._lock:
            self._read_pos += n_bytes
            self._count = max(0, self._count - n_records)
            if self._read_pos >= self._end and not self.adopted:
                os.ftruncate(self._fd, 0)
                self._read_pos = self._end = 0
                self._count = 0

    def sync(self) -> None:
        """Forces the file to disk."""
        with self._lock, contextlib.suppress(OSError):
            os.fdatasync(self._fd)

    def release(self) -> None:
        """Keeps the undelivered events for the next producer and unlocks the file.

        Events already delivered are left out (a new file replaces this one), so the next
        producer does not deliver them again; a crash in between only duplicates.
        """
        with self._lock:
            if self._fd < 0:
                return
            if self._read_pos > 0 and self._read_pos < self._end:
                fresh = self.path.with_name(f"spill-{os.getpid()}-{os.urandom(4).hex()}.log")
                fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                # Locked until complete, so that no producer adopts it half written.
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    pos, out = self._read_pos, 0
                    while pos < self._end:
                        data = os.pread(self._fd, min(_READ_CHUNK, self._end - pos), pos)
                        framing.pwrite_all(fd, data, out)
                        pos, out = pos + len(data), out + len(data)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                self.path.unlink()
                self.path = fresh
            elif self._read_pos >= self._end:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            with contextlib.suppress(OSError):
                os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        """Deletes the file (everything delivered) and unlocks it."""
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
