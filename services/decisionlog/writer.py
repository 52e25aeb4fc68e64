"""Durable writes of the decision log: parts, the flush journal, the root lock.

A part is written under a hidden name, fsynced, renamed into place and its folder fsynced,
so a part either exists whole or not at all, also after a power loss. Before a flush writes
its parts, the journal names them (``Journal``): a sink that crashes after writing parts
and before committing the log position reads those records again on restart, and the
journal tells it which event ids it has already written, so it skips them instead of
writing them twice. Only one flush is ever uncommitted (the sink commits before it polls
again), so the journal holds one flush.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from services.common import filecommit
from services.decisionlog import layout

log = logging.getLogger(__name__)


class RootBusyError(RuntimeError):
    """Another live sink writes the same decision log folder."""


def ensure_dir(path: Path) -> None:
    """Creates ``path`` and missing parents, each made durable in its parent."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
        filecommit.fsync_dir(folder.parent)


def write_durably(final: Path, data: bytes) -> None:
    """Writes a small file atomically: hidden name, fsync, rename, fsync of the folder."""
    filecommit.replace_bytes(final, data, tmp=layout.tmp_path(final))


def write_part(
    table: pa.Table, final: Path, compression: str = "zstd", replace: bool = False
) -> int:
    """Writes one part durably; returns its size in bytes. An existing part is replaced only
    when ``replace`` says so (compaction rewriting its own output)."""
    if final.exists() and not replace:
        raise FileExistsError(errno.EEXIST, "part exists already", str(final))
    ensure_dir(final.parent)
    with filecommit.replacing(final, tmp=layout.tmp_path(final)) as tmp:
        pq.write_table(
            table,
            tmp,
            compression=None if compression == "none" else compression,
            # One row group per part: parts are small, and readers scan whole parts.
            row_group_size=max(table.num_rows, 1),
        )
        size = tmp.stat().st_size
    return size


@dataclass(frozen=True)
class JournalEntry:
    """The flush in progress (or the last one, committed or not) and its parts."""

    flush: int
    parts: tuple[str, ...]
    """Paths of the flush's parts, relative to the root."""


class Journal:
    """A sink's flush journal: ``<root>/_sink/journal[.<sink>].json``."""

    def __init__(
        self, root: Path, sink: str = layout.DEFAULT_SINK, *, path: Path | None = None
    ) -> None:
        self.root = root
        self.path = path or layout.journal_path(root, sink)

    @classmethod
    def every(cls, root: Path) -> list[JournalEntry]:
        """The last flush each sink under ``root`` began (a compaction leaves their parts
        alone: they may not be committed yet)."""
        entries = (cls(root, path=path).read() for path in layout.journal_paths(root))
        return [entry for entry in entries if entry is not None]

    def read(self) -> JournalEntry | None:
        """The last flush begun, or None when the sink never flushed here."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        return JournalEntry(int(data["flush"]), tuple(str(p) for p in data["parts"]))

    def begin(self, entry: JournalEntry) -> None:
        """Records that ``entry.flush`` is about to write ``entry.parts`` (durably)."""
        ensure_dir(self.path.parent)
        body = {"flush": entry.flush, "parts": list(entry.parts)}
        write_durably(self.path, json.dumps(body, indent=1).encode())

    def written_ids(self, entry: JournalEntry) -> list[str]:
        """Event ids in the parts of ``entry`` that reached the disk; removes the hidden
        files of parts a crash interrupted."""
        ids: list[str] = []
        for relative in entry.parts:
            final = self.root / relative
            with contextlib.suppress(FileNotFoundError):
                layout.tmp_path(final).unlink()
            try:
                table = pq.read_table(final, columns=["event_id"])
            except FileNotFoundError:
                continue
            ids += table.column("event_id").to_pylist()
        return ids


def last_flush_on_disk(root: Path, sink: str = layout.DEFAULT_SINK) -> int:
    """The highest flush number of ``sink``'s parts (a full scan; used only without a
    journal). The default sink also counts compacted parts, as it always has; another
    sink's numbers only have to differ from its own parts still on disk."""
    last = 0
    for kind in layout.KINDS:
        for _, day_dir in layout.day_dirs(root, kind):
            for entry in day_dir.iterdir():
                covered = layout.parse_part(entry.name)
                if covered is None:
                    continue
                owner = layout.part_sink(entry.name)
                if owner == sink or (owner is None and sink == layout.DEFAULT_SINK):
                    last = max(last, covered[1])
    return last


class RootLock:
    """An exclusive ``flock`` on ``<root>/_sink/lock[.<sink>]``: one live sink of each name
    per folder (sinks of other names write beside it)."""

    def __init__(self, root: Path, sink: str = layout.DEFAULT_SINK) -> None:
        ensure_dir(root / layout.SINK_DIR)
        try:
            self._fd = filecommit.hold_lock(layout.lock_path(root, sink), wait=False)
        except BlockingIOError as exc:
            named = "" if sink == layout.DEFAULT_SINK else f" under the name {sink!r}"
            raise RootBusyError(f"another sink writes {root}{named}") from exc

    def release(self) -> None:
        """Releases the lock."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
