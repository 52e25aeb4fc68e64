"""What every backend shares: the record a consumer receives, the writer and consumer
contracts, and the errors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from fraud.v1 import events_pb2


class EventLogError(Exception):
    """Base of the event log's errors."""


class BackendUnavailable(EventLogError):
    """The backend could not take or give records now (down, unreachable, too slow).

    ``failed`` lists the positions in the written batch that were not stored; None means
    the whole batch is in doubt. Either way, rewriting them can only duplicate, never lose.
    """

    def __init__(self, message: str, failed: Sequence[int] | None = None) -> None:
        super().__init__(message)
        self.failed = failed


class CorruptLogError(EventLogError):
    """The file log holds bytes that are not a valid record where no write can be in progress."""


class GroupBusyError(EventLogError):
    """Another live consumer of the same group holds the file log's group lock."""


KeyValue = tuple[bytes, bytes]
"""One record as written: (key, value)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One record as consumed: key, serialized ``EventEnvelope``, and where it sits in the log."""

    key: bytes
    """The partitioning key (card_id of a decision, transaction_id of an outcome)."""
    value: bytes
    """The serialized ``fraud.v1.EventEnvelope``."""
    position: str
    """Backend-specific position, for logs: file byte offset, stream id, partition:offset."""

    def envelope(self) -> events_pb2.EventEnvelope:
        """The decoded envelope."""
        envelope = events_pb2.EventEnvelope()
        envelope.ParseFromString(self.value)
        return envelope


class LogWriter(Protocol):
    """A backend's write side, used by one thread (the producer's sender) at a time."""

    def write(self, batch: Sequence[KeyValue]) -> None:
        """Stores the batch in order, or raises ``BackendUnavailable``."""
        ...

    def sync(self) -> None:
        """Forces what was written to stable storage where that is the writer's job (the
        file log with a lazy fsync policy); called when the producer falls idle."""
        ...

    def close(self) -> None:
        """Releases connections and files (syncing first)."""
        ...


@runtime_checkable
class PositionedWriter(Protocol):
    """A writer that can say where in the log its next records will go and read the log
    back from there: what a journal needs to deliver a batch whose fate it does not know
    (the writer died or timed out meanwhile) exactly once. The file log and Redis have it."""

    def position(self) -> str:
        """A position in the log at or before every record this writer writes from now on."""
        ...

    def values_since(self, position: str) -> Iterator[bytes]:
        """The value of every record stored after ``position`` (one ``position`` returned),
        oldest first; raises ``BackendUnavailable`` when the backend cannot be read."""
        ...


class Consumer(Protocol):
    """A member of a consumer group: poll, apply, commit; at-least-once.

    ``commit`` acknowledges every record returned by ``poll`` so far. After a crash the
    group resumes from its last commit, so records polled but not committed come again.
    Calls are blocking; from asyncio, run them with ``asyncio.to_thread``.
    """

    group: str
    """The consumer group."""

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records, waiting at most ``timeout_s`` for the first one;
        raises ``BackendUnavailable`` when the backend cannot be reached."""
        ...

    def commit(self) -> None:
        """Acknowledges every record polled so far; raises ``BackendUnavailable`` on failure."""
        ...

    def close(self) -> None:
        """Leaves the group (uncommitted records are delivered again) and releases resources."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
