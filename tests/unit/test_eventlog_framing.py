"""Record frames: round trip, and every kind of damage is told apart from a valid frame."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.eventlog import framing
from services.eventlog.filelog import scan_valid_end


def test_round_trip_keeps_order_and_offsets() -> None:
    records = [(b"card-1", b"a" * 10), (b"", b""), (b"card-2", bytes(range(256)))]
    buf = framing.encode_many(records)
    frames, end = framing.decode(buf)
    assert [(k, v) for _, k, v in frames] == records
    assert end == len(buf)
    assert frames[1][0] == len(framing.encode(*records[0]))


def test_decode_stops_at_a_torn_tail() -> None:
    buf = framing.encode_many([(b"k", b"one"), (b"k", b"two")])
    cut = buf[:-3]
    frames, end = framing.decode(cut)
    assert [v for _, _, v in frames] == [b"one"]
    assert end == len(framing.encode(b"k", b"one"))


def test_decode_stops_at_a_corrupt_frame() -> None:
    first = framing.encode(b"k", b"one")
    buf = bytearray(first + framing.encode(b"k", b"two"))
    buf[-1] ^= 0xFF
    frames, end = framing.decode(bytes(buf))
    assert len(frames) == 1 and end == len(first)


def test_decode_rejects_an_absurd_length() -> None:
    buf = framing.HEADER.pack(framing.MAX_BODY + 1, 0) + b"x" * 16
    assert framing.decode(buf) == ([], 0)


def test_max_records_limits_a_decode() -> None:
    buf = framing.encode_many([(b"k", b"%d" % i) for i in range(10)])
    frames, end = framing.decode(buf, max_records=3)
    assert len(frames) == 3
    frames2, _ = framing.decode(buf, start=end)
    assert len(frames2) == 7


def test_oversized_key_is_refused() -> None:
    with pytest.raises(ValueError):
        framing.encode(b"k" * (framing.MAX_KEY + 1), b"")


def test_scan_valid_end_finds_frames_larger_than_a_read_chunk(tmp_path: Path) -> None:
    big = framing.encode(b"k", b"x" * (3 * 1024 * 1024))
    small = framing.encode(b"k", b"y")
    path = tmp_path / "seg"
    path.write_bytes(small + big + small + big[: len(big) // 2])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert scan_valid_end(fd, path.stat().st_size) == 2 * len(small) + len(big)
    finally:
        os.close(fd)
