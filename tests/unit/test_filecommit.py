"""The file-commit helper: writers in several processes serialise on the lock and never lose
an update, a reader never sees half a file, and a writer that dies mid-write leaves the old
file whole."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from services.common import filecommit

_CTX = multiprocessing.get_context("fork")


def _bump(path: str, times: int) -> None:
    """Adds ``times`` to the counter in ``path``, one locked read-modify-write at a time."""
    final = Path(path)
    for _ in range(times):
        with filecommit.locked(final.with_name("lock")):
            count = json.loads(final.read_text())["count"]
            # A large body: a torn write or a lost update would show in the reader or the sum.
            body = {"count": count + 1, "pad": "x" * 50_000}
            filecommit.replace_bytes(final, json.dumps(body).encode(), durable=False)


def test_concurrent_writers_lose_no_update_and_readers_see_whole_files(tmp_path: Path) -> None:
    final = tmp_path / "state.json"
    filecommit.replace_bytes(final, json.dumps({"count": 0}).encode())
    writers = [_CTX.Process(target=_bump, args=(str(final), 40)) for _ in range(4)]
    for writer in writers:
        writer.start()
    reads = 0
    while any(w.is_alive() for w in writers):
        json.loads(final.read_text())  # raises on a torn file
        reads += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert json.loads(final.read_text())["count"] == 160
    assert reads > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock", "state.json"]


def _die_mid_write(path: str, started: multiprocessing.synchronize.Event) -> None:
    with filecommit.replacing(Path(path)) as tmp, open(tmp, "wb") as out:
        out.write(b'{"version": "new", "pad": "')
        out.flush()
        started.set()
        time.sleep(60)  # killed here


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path: Path) -> None:
    final = tmp_path / "routing.json"
    filecommit.replace_bytes(final, b'{"version": "old"}')
    started = _CTX.Event()
    writer = _CTX.Process(target=_die_mid_write, args=(str(final), started))
    writer.start()
    assert started.wait(30)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    assert final.read_bytes() == b'{"version": "old"}'
    # The half-written file is a hidden one beside it, never the file itself.
    assert all(p.name.startswith(".") for p in tmp_path.iterdir() if p != final)


def test_an_error_mid_write_removes_the_temporary_file(tmp_path: Path) -> None:
    final = tmp_path / "plan.json"
    filecommit.replace_bytes(final, b"old")
    with pytest.raises(RuntimeError), filecommit.replacing(final) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert final.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def _hold(path: str, create: bool, held: multiprocessing.synchronize.Event) -> None:
    if create:
        filecommit.create_locked(Path(path))
    else:
        filecommit.hold_lock(Path(path))
    held.set()
    time.sleep(60)  # killed here


class Holder:
    """Another process that holds the lock on a file until it is SIGKILLed."""

    def __init__(self, path: Path, create: bool = False) -> None:
        held = _CTX.Event()
        self.process = _CTX.Process(target=_hold, args=(str(path), create, held))
        self.process.start()
        assert held.wait(30)

    def kill(self) -> None:
        assert self.process.pid is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join()


def test_a_lock_is_exclusive_and_dies_with_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    holder = Holder(lock)
    with pytest.raises(BlockingIOError), filecommit.locked(lock, wait=False):
        pass
    holder.kill()
    with filecommit.locked(lock, wait=False):
        pass


def test_temporary_names_differ_between_writers(tmp_path: Path) -> None:
    final = tmp_path / "x.json"
    names = {filecommit.temp_path(final) for _ in range(100)}
    assert len(names) == 100
    assert all(n.parent == tmp_path and n.name.startswith(".x.json.") for n in names)


def test_a_file_is_adopted_only_once_its_creator_is_dead(tmp_path: Path) -> None:
    orphan = tmp_path / "spill-1.log"
    assert filecommit.adopt(orphan) is None  # not there
    creator = Holder(orphan, create=True)
    with pytest.raises(FileExistsError):
        filecommit.create_locked(orphan)
    assert filecommit.adopt(orphan) is None  # its creator lives
    creator.kill()
    fd = filecommit.adopt(orphan)
    assert fd is not None
    try:
        with pytest.raises(BlockingIOError), filecommit.locked(orphan, wait=False):
            pass  # the adopter holds it now
    finally:
        os.close(fd)
