"""One journal file on local disk: a header (cursor, log position) and records after it.

A record is a frame (``framing``) whose value starts with a kind byte: ``KIND_EVENT``, an
event; ``KIND_PENDING`` + token, an event whose final form follows later; ``KIND_FINAL`` +
token, that final form. The file is ``flock``ed while its process lives, so that a file
nobody holds is known to belong to a process that is gone (``JournalFile.adopt_orphans``).
``journal.JournalProducer`` writes and delivers it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from services.common import filecommit
from services.eventlog import framing

log = logging.getLogger(__name__)

MAGIC = b"FMJ1"
HEADER_SIZE = 64
"""Bytes of the header at the start of every journal file."""
_HEADER = struct.Struct("<4sQH")
"""magic, cursor, length of the position; then the position, then the CRC-32 of it all."""
_MAX_POSITION = HEADER_SIZE - _HEADER.size - 4
_TOKEN = struct.Struct("<Q")
KIND_EVENT, KIND_PENDING, KIND_FINAL = b"D", b"P", b"C"
_READ_CHUNK = 1024 * 1024


@dataclass(slots=True)
class JournalEntry:
    """One record read from a journal."""

    end: int
    """Offset just past the record."""
    kind: bytes
    token: int
    key: bytes
    value: bytes


@dataclass
class Doubt:
    """Records of a journal that may already be in the log: up to ``end``, those whose event
    ids the log holds (``stored``, None until the log has been read)."""

    end: int
    stored: set[str] | None = None


class JournalFile:
    """One journal file: a header (cursor, log position) and records appended after it."""

    def __init__(self, path: Path, fd: int, adopted: bool) -> None:
        self.path = path
        self.adopted = adopted
        self._fd = fd
        self._lock = threading.Lock()
        self.end = max(os.fstat(fd).st_size, HEADER_SIZE)
        self.written = 0
        """Bytes appended by this process, ever (a reset does not lower it)."""
        self.cursor, self.position = HEADER_SIZE, ""
        self.doubt: Doubt | None = None
        self.completions: dict[int, bytes] = {}
        """Final forms of pending records (an adopter reads them from the file)."""
        self.pending_records = 0
        """Events after the cursor, counted when adopted (0 for this process's own)."""

    @classmethod
    def create(cls, folder: Path) -> JournalFile:
        """A new, locked, empty journal of this process."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"journal-{os.getpid()}-{os.urandom(4).hex()}.log"
        journal = cls(path, filecommit.create_locked(path), adopted=False)
        journal.commit(HEADER_SIZE, "")
        return journal

    @classmethod
    def adopt_orphans(cls, folder: Path, mine: set[Path] | None = None) -> list[JournalFile]:
        """Journals no live process holds, oldest first, locked for this process; each with
        its cursor, the log position from its header, and its undelivered records in doubt."""
        if not folder.is_dir():
            return []
        adopted = []
        for path in sorted(folder.glob("journal-*.log"), key=_mtime):
            if mine and path in mine:
                continue
            fd = filecommit.adopt(path)
            if fd is None:
                continue
            journal = cls(path, fd, adopted=True)
            journal._read_header()
            journal._cut_torn_tail()
            if journal.cursor >= journal.end:
                journal.remove()
                continue
            journal.doubt = Doubt(journal.end)
            log.info(
                "eventlog: adopted journal %s with %d undelivered event(s)",
                path.name,
                journal.pending_records,
            )
            adopted.append(journal)
        return adopted

    def _read_header(self) -> None:
        raw = os.pread(self._fd, HEADER_SIZE, 0)
        if len(raw) == HEADER_SIZE:
            magic, cursor, length = _HEADER.unpack_from(raw, 0)
            body_end = _HEADER.size + min(length, _MAX_POSITION)
            (crc,) = struct.unpack_from("<I", raw, HEADER_SIZE - 4)
            if magic == MAGIC and zlib.crc32(raw[:body_end]) == crc:
                self.cursor = min(max(cursor, HEADER_SIZE), self.end)
                self.position = raw[_HEADER.size : body_end].decode("ascii", "replace")
                return
        # A header torn by a power cut: deliver everything the log does not hold, reading
        # the log from its start.
        log.warning("eventlog: journal %s has no valid header; checking it whole", self.path)
        self.cursor, self.position = HEADER_SIZE, ""

    def _cut_torn_tail(self) -> None:
        """Counts the events after the cursor and cuts a record torn by the crash."""
        pos = self.cursor
        while pos < self.end:
            entries, stop = self._decode(pos, 1 << 30)
            if not entries:
                break
            self.pending_records += sum(e.kind != KIND_FINAL for e in entries)
            pos = stop
        if pos < self.end:
            log.warning("eventlog: cut %d byte(s) of torn tail from %s", self.end - pos, self.path)
            os.ftruncate(self._fd, pos)
            self.end = pos

    @property
    def pending_bytes(self) -> int:
        """Bytes after the cursor."""
        return max(0, self.end - self.cursor)

    def append(self, data: bytes) -> int:
        """Writes records at the end; returns ``written`` after them."""
        with self._lock:
            framing.pwrite_all(self._fd, data, self.end)
            self.end += len(data)
            self.written += len(data)
            return self.written

    def read(self, pos: int, max_records: int) -> list[JournalEntry]:
        """Up to ``max_records`` records from ``pos`` (a record boundary)."""
        with self._lock:
            end = self.end
        entries, _ = self._decode(pos, max_records, end)
        return entries

    def _decode(
        self, pos: int, max_records: int, end: int | None = None
    ) -> tuple[list[JournalEntry], int]:
        end = self.end if end is None else end
        if pos >= end:
            return [], pos
        chunk = os.pread(self._fd, min(_READ_CHUNK, end - pos), pos)
        frames, stop = framing.decode(chunk, max_records=max_records)
        if not frames:
            header = os.pread(self._fd, framing.HEADER.size, pos)
            if len(header) < framing.HEADER.size:
                return [], pos
            body_len, _ = framing.HEADER.unpack(header)
            if body_len > framing.MAX_BODY:
                return [], pos
            whole = os.pread(self._fd, min(framing.HEADER.size + body_len, end - pos), pos)
            frames, stop = framing.decode(whole, max_records=1)
        entries = []
        for i, (_, key, body) in enumerate(frames):
            record_end = pos + (frames[i + 1][0] if i + 1 < len(frames) else stop)
            kind, rest = body[:1], body[1:]
            token = 0
            if kind in (KIND_PENDING, KIND_FINAL):
                (token,) = _TOKEN.unpack_from(rest, 0)
                rest = rest[_TOKEN.size :]
            entries.append(JournalEntry(record_end, kind, token, key, rest))
        return entries, pos + stop

    def commit(self, cursor: int, position: str) -> None:
        """Records in the header that everything before ``cursor`` is delivered, and where in
        the log this process's next records will go."""
        encoded = position.encode("ascii")[:_MAX_POSITION]
        body = _HEADER.pack(MAGIC, cursor, len(encoded)) + encoded
        body = body.ljust(HEADER_SIZE - 4, b"\0")
        header = body + struct.pack("<I", zlib.crc32(body[: _HEADER.size + len(encoded)]))
        with self._lock:
            framing.pwrite_all(self._fd, header, 0)
        self.cursor, self.position = cursor, position

    def reset(self) -> bool:
        """Empties the journal if everything in it is delivered (False if not)."""
        with self._lock:
            if self.cursor < self.end:
                return False
            os.ftruncate(self._fd, HEADER_SIZE)
            self.end = HEADER_SIZE
        self.commit(HEADER_SIZE, self.position)
        return True

    def sync(self) -> None:
        """Forces the file (records and header) to disk."""
        os.fdatasync(self._fd)

    def release(self) -> None:
        """Leaves the file, with its header, for the next producer, and unlocks it."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = -1

    def remove(self) -> None:
        """Deletes the file (everything delivered) and unlocks it."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def record_frame(key: bytes, kind: bytes, value: bytes, token: int = 0) -> bytes:
    body = kind + (_TOKEN.pack(token) if kind != KIND_EVENT else b"") + value
    return framing.encode(key, body)
