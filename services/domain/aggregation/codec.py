"""The binary encoding of incremental states: little-endian ints, strings and arrays.

A state says which parts it holds, in which order, behind which magic (``CardState.to_bytes``);
this module says how each part is laid out, and checks magic, length and trailing bytes.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import Protocol

_LITTLE = sys.byteorder == "little"


class LatestPart(Protocol):
    """A code with the (timestamp, transaction id) it was last seen at."""

    @property
    def value(self) -> int | None:
        """The code; None while unknown."""

    @property
    def at_us(self) -> int:
        """Timestamp of the transaction that carried it."""

    @property
    def at_id(self) -> str:
        """Id of the transaction that carried it."""


class EventsPart(Protocol):
    """An entity's events as parallel lists."""

    @property
    def ids(self) -> list[str]:
        """Transaction ids."""

    @property
    def times_us(self) -> list[int]:
        """Epoch microseconds."""

    @property
    def eur(self) -> list[float]:
        """Amounts in EUR."""


class LabelPart(Protocol):
    """An outcome and when it was reported."""

    @property
    def is_fraud(self) -> bool:
        """True for fraud."""

    @property
    def reported_us(self) -> int:
        """Epoch microseconds of the report."""


def _le(values: array) -> bytes:
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


class StateWriter:
    """Little-endian builder of a state's bytes."""

    def __init__(self, magic: bytes) -> None:
        self._parts: list[bytes] = [magic]

    def ints(self, *values: int) -> None:
        """Signed 64-bit integers."""
        self._parts.append(struct.pack(f"<{len(values)}q", *values))

    def strs(self, values: list[str]) -> None:
        """A count, the UTF-8 lengths, then the UTF-8 bytes."""
        encoded = [v.encode() for v in values]
        self._parts.append(struct.pack("<I", len(encoded)))
        self._parts.append(_le(array("I", [len(b) for b in encoded])))
        self._parts.append(b"".join(encoded))

    def latest(self, latest: LatestPart) -> None:
        """Whether the code is known, the code (0 if not), its time and transaction id."""
        known = latest.value is not None
        self.ints(int(known), latest.value if latest.value is not None else 0, latest.at_us)
        self.strs([latest.at_id])

    def events(self, events: EventsPart) -> None:
        """The ids, then the times and amounts as arrays of as many."""
        self.strs(events.ids)
        self._parts.append(_le(array("q", events.times_us)))
        self._parts.append(_le(array("d", events.eur)))

    def interned(self, values: list[str]) -> None:
        """Repetitive strings: each distinct one once, then an index per value."""
        table: dict[str, int] = {}
        index = array("I", [table.setdefault(v, len(table)) for v in values])
        self.strs(list(table))
        self._parts.append(_le(index))

    def labels(self, labels: Mapping[str, LabelPart]) -> None:
        """The transaction ids, a byte per verdict, then the report times."""
        self.strs(list(labels))
        self._parts.append(bytes(int(v.is_fraud) for v in labels.values()))
        self._parts.append(_le(array("q", [v.reported_us for v in labels.values()])))

    def bytes(self) -> bytes:
        """Everything written so far."""
        return b"".join(self._parts)


class StateReader:
    """Reads what ``StateWriter`` wrote, checking the magic and the length."""

    def __init__(self, data: bytes, magic: bytes) -> None:
        if data[: len(magic)] != magic:
            raise ValueError(f"not a {magic!r} state encoding")
        self._data = memoryview(data)
        self._at = len(magic)

    def _take(self, size: int) -> memoryview:
        end = self._at + size
        if end > len(self._data):
            raise ValueError("truncated state encoding")
        chunk = self._data[self._at : end]
        self._at = end
        return chunk

    def _array(self, typecode: str, count: int) -> array:
        values = array(typecode)
        values.frombytes(self._take(count * values.itemsize))
        if not _LITTLE:
            values.byteswap()
        return values

    def ints(self, count: int) -> tuple[int, ...]:
        """``count`` signed 64-bit integers."""
        return struct.unpack(f"<{count}q", self._take(8 * count))

    def strs(self) -> list[str]:
        """What ``StateWriter.strs`` wrote."""
        (count,) = struct.unpack("<I", self._take(4))
        lengths = self._array("I", count)
        blob = bytes(self._take(sum(lengths)))
        ends = list(accumulate(lengths))
        starts = [0, *ends][:-1]
        text = blob.decode()
        if len(text) == len(blob):
            # ASCII (the usual ids): byte offsets are character offsets, one decode suffices.
            return [text[a:b] for a, b in zip(starts, ends, strict=True)]
        return [blob[a:b].decode() for a, b in zip(starts, ends, strict=True)]

    def latest(self) -> tuple[int | None, int, str]:
        """What ``StateWriter.latest`` wrote: the code (None if unknown), time, transaction id."""
        known, value, at_us = self.ints(3)
        (at_id,) = self.strs()
        return value if known else None, at_us, at_id

    def events(self) -> tuple[list[str], list[int], list[float]]:
        """What ``StateWriter.events`` wrote: ids, times, amounts."""
        ids = self.strs()
        times = self._array("q", len(ids)).tolist()
        eur = self._array("d", len(ids)).tolist()
        return ids, times, eur

    def interned(self, count: int) -> list[str]:
        """What ``StateWriter.interned`` wrote, ``count`` values."""
        table = self.strs()
        return [table[i] for i in self._array("I", count)]

    def labels(self) -> Iterator[tuple[str, bool, int]]:
        """What ``StateWriter.labels`` wrote: (transaction id, is fraud, reported at) each."""
        ids = self.strs()
        flags = bytes(self._take(len(ids)))
        reported = self._array("q", len(ids)).tolist()
        return ((tid, bool(f), r) for tid, f, r in zip(ids, flags, reported, strict=True))

    def done(self) -> None:
        """Raises unless every byte was read."""
        if self._at != len(self._data):
            raise ValueError("trailing bytes after the state encoding")
