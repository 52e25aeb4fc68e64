"""Length-prefixed, CRC-checked record frames, as stored in file-log segments and spill files.

A frame is ``body_len:u32 | crc32(body):u32 | body`` with ``body = key_len:u16 | key | value``
(little endian). A reader can always tell a complete, intact frame from a torn or corrupt one.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable

from services.eventlog.records import KeyValue

HEADER = struct.Struct("<II")
"""Frame header: body length, CRC-32 of the body."""

KEY_LEN = struct.Struct("<H")
"""Key length at the start of the body."""

MAX_KEY = 0xFFFF
"""Longest key a frame can hold."""

MAX_BODY = 64 * 1024 * 1024
"""Longest body a reader accepts; a longer length field marks a corrupt frame."""


def encode(key: bytes, value: bytes) -> bytes:
    """One frame."""
    if len(key) > MAX_KEY:
        raise ValueError(f"key of {len(key)} bytes is longer than {MAX_KEY}")
    body = KEY_LEN.pack(len(key)) + key + value
    if len(body) > MAX_BODY:
        raise ValueError(f"record of {len(body)} bytes is longer than {MAX_BODY}")
    return HEADER.pack(len(body), zlib.crc32(body)) + body


def encode_many(records: Iterable[KeyValue]) -> bytes:
    """Frames of every record, concatenated."""
    return b"".join(encode(key, value) for key, value in records)


def decode(
    buf: bytes | memoryview, start: int = 0, limit: int | None = None, max_records: int = -1
) -> tuple[list[tuple[int, bytes, bytes]], int]:
    """Intact frames from ``buf[start:]``: ``([(offset, key, value)…], end)``.

    Stops at the first frame that is incomplete or fails its CRC (``end`` is its start), or
    after ``max_records`` frames (negative: no limit). The caller decides whether what
    follows ``end`` is a write in progress, a torn tail, or corruption.
    """
    view = memoryview(buf)
    size = len(view) if limit is None else min(limit, len(view))
    out: list[tuple[int, bytes, bytes]] = []
    pos = start
    header_size = HEADER.size
    while pos + header_size <= size and max_records != len(out):
        body_len, crc = HEADER.unpack_from(view, pos)
        end = pos + header_size + body_len
        if body_len < KEY_LEN.size or body_len > MAX_BODY or end > size:
            break
        body = view[pos + header_size : end]
        if zlib.crc32(body) != crc:
            break
        (key_len,) = KEY_LEN.unpack_from(body, 0)
        if KEY_LEN.size + key_len > body_len:
            break
        out.append(
            (
                pos,
                bytes(body[KEY_LEN.size : KEY_LEN.size + key_len]),
                bytes(body[KEY_LEN.size + key_len :]),
            )
        )
        pos = end
    return out, pos


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Writes all of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
