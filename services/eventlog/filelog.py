"""The embedded backend: a durable append-only log in local segment files, no server.

Layout of one topic's folder::

    HEAD                     head record: newest segment's base, its valid end, CRC
    00000000000000000000.seg segment files, named by the global byte offset of their start
    00000000000067108912.seg
    groups/<group>.offset    committed global offset of each consumer group (text)
    groups/<group>.lock      held by the group's live consumer

Records are CRC-checked frames (``framing``). Positions are global byte offsets, so a
segment's name plus a record's offset in it is the record's position.

Writers in several processes are safe: each batch is written under an advisory lock on
``HEAD`` (``flock``), at the end the head names, and only then is the head moved past it.
A batch is acknowledged once the head covers it. A writer killed mid-batch leaves bytes
past the head; the next writer cuts them off before writing (the batch was never
acknowledged), and readers never look past the head. Opening a writer re-scans the newest
segment and cuts a torn or corrupt tail, which also repairs a head lost in a power cut.

Retention deletes whole sealed segments once every known group (declared in the settings
or holding an offset file) has committed past them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import itertools
import logging
import math
import os
import select
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from services.common import filecommit
from services.eventlog import framing
from services.eventlog.records import (
    BackendUnavailable,
    CorruptLogError,
    GroupBusyError,
    KeyValue,
    Record,
)
from services.eventlog.settings import EventLogSettings

log = logging.getLogger(__name__)

HEAD_FILE = "HEAD"
SEGMENT_SUFFIX = ".seg"
GROUPS_DIR = "groups"

_HEAD = struct.Struct("<QQI")
_HEAD_BODY = struct.Struct("<QQ")
_CHUNK = 1024 * 1024


def segment_name(base: int) -> str:
    """File name of the segment that starts at global offset ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


def list_segments(path: Path) -> list[int]:
    """Bases of the segments in ``path``, oldest first."""
    bases = []
    for entry in os.scandir(path):
        name = entry.name
        if name.endswith(SEGMENT_SUFFIX) and name[: -len(SEGMENT_SUFFIX)].isdigit():
            bases.append(int(name[: -len(SEGMENT_SUFFIX)]))
    return sorted(bases)


def scan_valid_end(fd: int, size: int) -> int:
    """End of the last intact frame of a contiguous run from offset 0 of a segment."""
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(_CHUNK, size - pos), pos)
        if not chunk:
            break
        _, stop = framing.decode(chunk)
        if stop > 0:
            pos += stop
            continue
        # The first frame does not fit in the chunk: read it whole if its length is plausible.
        if len(chunk) < framing.HEADER.size:
            break
        body_len, _ = framing.HEADER.unpack_from(chunk, 0)
        frame_len = framing.HEADER.size + body_len
        if body_len > framing.MAX_BODY or pos + frame_len > size or frame_len <= len(chunk):
            break
        frame = os.pread(fd, frame_len, pos)
        _, stop = framing.decode(frame)
        if stop != frame_len:
            break
        pos += frame_len
    return pos


class FileLog:
    """One topic's folder: the head, the segments, the groups' offsets, retention."""

    def __init__(self, settings: EventLogSettings) -> None:
        self.settings = settings
        self.path = settings.file_path
        self.groups_path = self.path / GROUPS_DIR
        self.groups_path.mkdir(parents=True, exist_ok=True)
        self.head_path = self.path / HEAD_FILE
        self._fsync = settings.file_fsync != "never"

    @contextlib.contextmanager
    def locked(self, fd: int) -> Iterator[None]:
        """Holds the writers' lock (``flock`` on an open descriptor of HEAD)."""
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def open_head(self) -> int:
        """A read-write descriptor of HEAD, created if missing."""
        return os.open(self.head_path, os.O_RDWR | os.O_CREAT, 0o644)

    @staticmethod
    def read_head(fd: int) -> tuple[int, int] | None:
        """(base, end) of the newest segment, or None if HEAD is empty or unreadable.

        Readers call this without the lock: a read that overlaps a write fails its CRC and
        is retried.
        """
        for _ in range(100):
            raw = os.pread(fd, _HEAD.size, 0)
            if len(raw) < _HEAD.size:
                return None
            base, end, crc = _HEAD.unpack(raw)
            if zlib.crc32(raw[: _HEAD_BODY.size]) == crc:
                return base, end
        return None

    @staticmethod
    def write_head(fd: int, base: int, end: int) -> None:
        """Moves the head (caller holds the lock)."""
        body = _HEAD_BODY.pack(base, end)
        framing.pwrite_all(fd, body + struct.pack("<I", zlib.crc32(body)), 0)

    def segment_path(self, base: int) -> Path:
        """Path of the segment starting at ``base``."""
        return self.path / segment_name(base)

    def offset_path(self, group: str) -> Path:
        """Path of a group's committed offset."""
        return self.groups_path / f"{group}.offset"

    def committed(self, group: str) -> int | None:
        """A group's committed global offset, or None if it never committed."""
        try:
            return int(self.offset_path(group).read_text().strip())
        except FileNotFoundError:
            return None

    def store_offset(self, group: str, offset: int) -> None:
        """Commits a group's offset atomically (write, fsync, rename)."""
        final = self.offset_path(group)
        filecommit.replace_bytes(final, f"{offset}\n".encode(), durable=self._fsync)

    def known_groups(self) -> set[str]:
        """Declared groups plus every group with an offset file."""
        found = {p.name[: -len(".offset")] for p in self.groups_path.glob("*.offset")}
        return found | set(self.settings.groups)

    def apply_retention(self) -> list[int]:
        """Deletes sealed segments every known group has consumed; returns their bases."""
        floor: int | None = None
        for group in self.known_groups():
            offset = self.committed(group)
            if offset is None:
                return []  # a declared group that never ran: keep everything for it
            floor = offset if floor is None else min(floor, offset)
        if floor is None:
            return []
        bases = list_segments(self.path)
        deleted = []
        # The newest segment is never deleted: writers append to it.
        for base, next_base in itertools.pairwise(bases):
            if next_base > floor:
                break
            with contextlib.suppress(FileNotFoundError):
                self.segment_path(base).unlink()
            deleted.append(base)
        if deleted:
            log.info(
                "eventlog retention deleted %d segment(s) below offset %d", len(deleted), floor
            )
        return deleted


class FileLogWriter:
    """Appends batches to the file log; safe alongside writers in other processes."""

    def __init__(self, settings: EventLogSettings) -> None:
        self._log = FileLog(settings)
        self._settings = settings
        self._head_fd = self._log.open_head()
        self._seg_fd = -1
        self._seg_base = -1
        self._last_fsync = time.monotonic()
        self._unsynced = False
        self.recovered_bytes = 0
        """Bytes of torn or corrupt tail cut off when this writer opened the log."""
        self._position = 0
        with self._log.locked(self._head_fd):
            self._recover()

    def _open_segment(self, base: int, create: bool = False) -> None:
        if self._seg_fd >= 0:
            os.close(self._seg_fd)
            self._seg_fd = -1
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self._seg_fd = os.open(self._log.segment_path(base), flags, 0o644)
        self._seg_base = base

    def _recover(self) -> None:
        """Finds the newest segment's valid end, cuts what follows, and rewrites the head."""
        bases = list_segments(self._log.path)
        if not bases:
            self._open_segment(0, create=True)
            self._log.write_head(self._head_fd, 0, 0)
            if self._settings.file_fsync != "never":
                filecommit.fsync_dir(self._log.path)
            self._position = 0
            return
        base = bases[-1]
        self._open_segment(base)
        size = os.fstat(self._seg_fd).st_size
        end = scan_valid_end(self._seg_fd, size)
        if end < size:
            self.recovered_bytes = size - end
            log.warning(
                "eventlog %s: cut %d byte(s) of torn or corrupt tail from segment %s",
                self._log.path,
                size - end,
                segment_name(base),
            )
            os.ftruncate(self._seg_fd, end)
            if self._settings.file_fsync != "never":
                os.fsync(self._seg_fd)
        self._log.write_head(self._head_fd, base, end)
        self._position = base + end

    def write(self, batch: Sequence[KeyValue]) -> None:
        """Appends the batch under the writers' lock; acknowledged when this returns."""
        if not batch:
            return
        data = framing.encode_many(batch)
        try:
            with self._log.locked(self._head_fd):
                self._append(data)
        except OSError as exc:
            raise BackendUnavailable(f"file log write failed: {exc}") from exc

    def _append(self, data: bytes) -> None:
        head = self._log.read_head(self._head_fd)
        if head is None:
            self._recover()
            head = self._log.read_head(self._head_fd)
            assert head is not None
        base, end = head
        if base != self._seg_base:
            self._open_segment(base)
        if os.fstat(self._seg_fd).st_size > end:
            # A writer died between writing and moving the head: its batch was never
            # acknowledged, and what follows must start at a frame boundary.
            os.ftruncate(self._seg_fd, end)
        if end >= self._settings.file_segment_bytes:
            if self._settings.file_fsync != "never":
                os.fsync(self._seg_fd)
            base, end = base + end, 0
            self._open_segment(base, create=True)
            if self._settings.file_fsync != "never":
                filecommit.fsync_dir(self._log.path)
        try:
            framing.pwrite_all(self._seg_fd, data, end)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                with contextlib.suppress(OSError):
                    os.ftruncate(self._seg_fd, end)
            raise
        self._maybe_fsync()
        self._log.write_head(self._head_fd, base, end + len(data))
        self._position = base + end + len(data)

    def position(self) -> str:
        """The global offset just past this writer's last batch (at open: the log's end):
        whatever it writes next lies beyond it."""
        return str(self._position)

    def values_since(self, position: str) -> Iterator[bytes]:
        """The values of every acknowledged record from global offset ``position`` on."""
        try:
            yield from read_values(self._settings, int(position or 0))
        except OSError as exc:
            raise BackendUnavailable(f"file log read failed: {exc}") from exc

    def _maybe_fsync(self) -> None:
        policy = self._settings.file_fsync
        if policy == "never":
            return
        now = time.monotonic()
        if (
            policy == "batch"
            or now - self._last_fsync >= self._settings.file_fsync_interval_ms / 1e3
        ):
            os.fdatasync(self._seg_fd)
            self._last_fsync = now
            self._unsynced = False
        else:
            self._unsynced = True

    def sync(self) -> None:
        """Forces appends an interval policy has not synced yet to disk."""
        if self._unsynced and self._seg_fd >= 0:
            try:
                os.fdatasync(self._seg_fd)
            except OSError as exc:
                raise BackendUnavailable(f"file log fsync failed: {exc}") from exc
            self._last_fsync = time.monotonic()
            self._unsynced = False

    def close(self) -> None:
        """Forces written data to disk (unless fsync is off) and closes the files."""
        if self._seg_fd >= 0:
            if self._settings.file_fsync != "never":
                with contextlib.suppress(OSError):
                    os.fdatasync(self._seg_fd)
            os.close(self._seg_fd)
            self._seg_fd = -1
        if self._head_fd >= 0:
            os.close(self._head_fd)
            self._head_fd = -1


def read_values(settings: EventLogSettings, since: int) -> Iterator[bytes]:
    """The values of every acknowledged record at or after global offset ``since`` (from the
    oldest segment on when retention deleted that far), oldest first."""
    log_ = FileLog(settings)
    head_fd = log_.open_head()
    try:
        head = log_.read_head(head_fd)
    finally:
        os.close(head_fd)
    if head is None:
        return
    head_base, head_end = head
    for base in list_segments(log_.path):
        if base > head_base:
            break
        try:
            fd = os.open(log_.segment_path(base), os.O_RDONLY)
        except FileNotFoundError:  # deleted by retention meanwhile
            continue
        try:
            limit = head_end if base == head_base else os.fstat(fd).st_size
            if base + limit <= since:
                continue
            yield from _segment_values(fd, max(0, since - base), limit)
        finally:
            os.close(fd)


def _segment_values(fd: int, pos: int, limit: int) -> Iterator[bytes]:
    """Values of the frames of one segment between ``pos`` and ``limit``."""
    while pos < limit:
        chunk = os.pread(fd, min(_CHUNK, limit - pos), pos)
        frames, stop = framing.decode(chunk)
        if not frames:
            header = os.pread(fd, framing.HEADER.size, pos)
            if len(header) < framing.HEADER.size:
                return
            body_len, _ = framing.HEADER.unpack(header)
            whole = os.pread(fd, min(framing.HEADER.size + body_len, limit - pos), pos)
            frames, stop = framing.decode(whole, max_records=1)
            if not frames:
                return
        for _, _, value in frames:
            yield value
        pos += stop


_IN_MODIFY = 0x00000002
"""inotify's event mask bit for a file written to (``<sys/inotify.h>``)."""


def watch_head(path: Path) -> int | None:
    """A non-blocking inotify descriptor that becomes readable whenever ``path`` (the head
    file) is written, that is whenever a writer acknowledges a batch; None where inotify is
    not available (not Linux) or refused (out of watches), and readers poll instead."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0 or add(fd, os.fsencode(path), _IN_MODIFY) < 0:
        log.warning(
            "eventlog: no inotify watch on %s (%s); polling instead",
            path,
            os.strerror(ctypes.get_errno()),
        )
        if fd >= 0:
            os.close(fd)
        return None
    return fd


class FileLogConsumer:
    """A consumer group member of the file log (one live member per group).

    A ``poll`` that finds nothing sleeps until a writer moves the head (an inotify watch on
    it, on Linux) instead of looking again every ``file_poll_interval_ms``: a consumer wakes
    once per acknowledged batch and not at all while the log is idle, and reads a batch as
    soon as it is acknowledged. Where the watch cannot be set, it looks every interval.
    Consumers that want their records in larger batches wait between polls themselves (the
    decision sink's and the monitor's ``poll_linger_s``).
    """

    def __init__(self, settings: EventLogSettings, group: str) -> None:
        if not group or "/" in group or group.startswith("."):
            raise ValueError(f"invalid group name {group!r}")
        self.group = group
        self._settings = settings
        self._log = FileLog(settings)
        self._head_fd = self._log.open_head()
        try:
            self._lock_fd = filecommit.hold_lock(
                self._log.groups_path / f"{group}.lock", wait=False
            )
        except BlockingIOError as exc:
            os.close(self._head_fd)
            raise GroupBusyError(f"group {group!r} already has a live consumer") from exc
        watch = watch_head(self._log.head_path) if settings.file_watch_head else None
        self._watch_fd = -1 if watch is None else watch
        self._head_moved = select.poll()
        if watch is not None:
            self._head_moved.register(watch, select.POLLIN)
        self._seg_fd = -1
        self._seg_base = -1
        self._seg_next: int | None = None
        committed = self._log.committed(group)
        if committed is None:
            # Registering the group at the earliest offset holds retention for it from now on.
            bases = list_segments(self._log.path)
            committed = bases[0] if bases else 0
            self._log.store_offset(group, committed)
        self._committed = committed
        self._pos = committed
        self._last_retention = 0.0

    def _locate(self, pos: int) -> bool:
        """Opens the segment holding ``pos``; False if no segment does yet."""
        if (
            self._seg_fd >= 0
            and self._seg_base <= pos
            and (self._seg_next is None or pos < self._seg_next)
        ):
            return True
        bases = list_segments(self._log.path)
        candidates = [b for b in bases if b <= pos]
        if not candidates:
            if bases and pos < bases[0]:
                log.warning(
                    "eventlog group %s: offset %d was deleted; resuming at %d",
                    self.group,
                    pos,
                    bases[0],
                )
                self._pos = pos = bases[0]
                candidates = [bases[0]]
            else:
                return False
        base = candidates[-1]
        later = [b for b in bases if b > base]
        if self._seg_fd >= 0:
            os.close(self._seg_fd)
            self._seg_fd = -1
        try:
            self._seg_fd = os.open(self._log.segment_path(base), os.O_RDONLY)
        except FileNotFoundError:
            return False
        self._seg_base = base
        self._seg_next = later[0] if later else None
        return True

    def _read(self, max_records: int) -> list[Record]:
        head = self._log.read_head(self._head_fd)
        if head is None or not self._locate(self._pos):
            return []
        head_base, head_end = head
        base = self._seg_base
        if base == head_base:
            limit = head_end
        elif base < head_base:
            if self._seg_next is None:
                # The segment was sealed since we looked: learn its successor.
                self._seg_fd, fd = -1, self._seg_fd
                os.close(fd)
                if not self._locate(self._pos):
                    return []
                return self._read(max_records)
            limit = self._seg_next - base
        else:
            return []
        rel = self._pos - base
        if rel >= limit:
            if base < head_base and self._seg_next is not None:
                self._pos = self._seg_next
                return self._read(max_records)
            return []
        # Enough for max_records typical events; a longer frame is read whole below.
        want = max(64 * 1024, max_records * 1024) if max_records > 0 else _CHUNK
        chunk = os.pread(self._seg_fd, min(_CHUNK, want, limit - rel), rel)
        frames, stop = framing.decode(chunk, max_records=max_records)
        if not frames:
            chunk = self._whole_frame(rel, limit)
            frames, stop = framing.decode(chunk, max_records=1)
            if not frames:
                raise CorruptLogError(
                    f"{self._log.segment_path(base)}: no valid record at offset {rel} "
                    f"(below the acknowledged end {limit})"
                )
        self._pos = base + rel + stop
        return [Record(key, value, str(base + rel + off)) for off, key, value in frames]

    def _whole_frame(self, rel: int, limit: int) -> bytes:
        """The bytes of one frame longer than a read chunk."""
        header = os.pread(self._seg_fd, framing.HEADER.size, rel)
        if len(header) < framing.HEADER.size:
            return b""
        body_len, _ = framing.HEADER.unpack(header)
        frame_len = framing.HEADER.size + min(body_len, framing.MAX_BODY)
        return os.pread(self._seg_fd, min(frame_len, limit - rel), rel)

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records after the last polled one, waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        interval = self._settings.file_poll_interval_ms / 1e3
        watch = self._watch_fd
        while True:
            records = self._read(max_records)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if watch >= 0:
                # Events of batches already read may be queued: they end this wait at once,
                # are read here, and the next look at the head waits for a new one.
                if self._head_moved.poll(math.ceil(remaining * 1000)):
                    with contextlib.suppress(BlockingIOError):
                        os.read(watch, 4096)
            else:
                time.sleep(min(interval, remaining))

    def commit(self) -> None:
        """Stores the position after the last polled record as the group's offset."""
        if self._pos != self._committed:
            try:
                self._log.store_offset(self.group, self._pos)
            except OSError as exc:
                raise BackendUnavailable(f"file log commit failed: {exc}") from exc
            self._committed = self._pos
        now = time.monotonic()
        if now - self._last_retention >= self._settings.file_retention_check_s:
            self._last_retention = now
            try:
                self._log.apply_retention()
            except OSError as exc:
                log.warning("eventlog retention failed: %s", exc)

    @property
    def committed(self) -> int:
        """The group's committed global offset."""
        return self._committed

    def close(self) -> None:
        """Releases the group lock; records polled but not committed come again."""
        for attr in ("_seg_fd", "_head_fd", "_watch_fd", "_lock_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                os.close(fd)
                setattr(self, attr, -1)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
