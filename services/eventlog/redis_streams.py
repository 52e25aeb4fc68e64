"""The Redis backend: one stream, consumer groups, acknowledgements, safe trimming.

Each record is a stream entry ``{k: key, v: value}`` added with ``XADD``. Consumers read with
``XREADGROUP`` and acknowledge with ``XACK``. A restarted consumer first re-reads its own
pending entries (``XREADGROUP … 0``), and entries another consumer of the group left pending
for longer than ``redis_claim_idle_ms`` are taken over with ``XAUTOCLAIM``.

The stream is bounded without ever losing an unconsumed entry: past ``redis_max_len``
entries, a consumer trims with ``XTRIM MINID`` up to the oldest entry that some known group
has not acknowledged yet (its oldest pending entry, or the first it has not been given).
Declared groups are created when the log is opened, so they count before they first run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.eventlog.records import BackendUnavailable, KeyValue, Record
from services.eventlog.settings import EventLogSettings

log = logging.getLogger(__name__)

KEY_FIELD = b"k"
VALUE_FIELD = b"v"
_MAX_BLOCK_S = 5.0
_CLAIM_INTERVAL_S = 5.0
_RANGE_COUNT = 1000


def _parse_id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


SyncRedis = Any
"""A synchronous ``redis.Redis``: redis-py annotates replies as sync-or-awaitable unions,
which would need a cast at every call."""


def _client(settings: EventLogSettings, socket_timeout_s: float) -> SyncRedis:
    """A client that fails fast: the producer and consumers do their own retrying."""
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(socket_timeout_s, 2.0),
        retry=Retry(NoBackoff(), 0),
    )


def ensure_groups(client: SyncRedis, stream: str, groups: Sequence[str]) -> None:
    """Creates the stream and every declared group (from the stream's start) if missing."""
    for group in groups:
        try:
            client.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def trim_floor(client: SyncRedis, stream: str) -> tuple[int, int] | None:
    """The oldest entry id some group has not acknowledged; None if there are no groups."""
    floor: tuple[int, int] | None = None
    for info in client.xinfo_groups(stream):
        name = info["name"]
        if info["pending"]:
            summary = client.xpending(stream, name)
            group_floor = _parse_id(summary["min"])
        else:
            ms, seq = _parse_id(info["last-delivered-id"])
            group_floor = (ms, seq + 1)
        if floor is None or group_floor < floor:
            floor = group_floor
    return floor


def trim(client: SyncRedis, settings: EventLogSettings) -> int:
    """Trims entries every group acknowledged once the stream is longer than
    ``redis_max_len``; returns how many were removed."""
    stream = settings.topic
    if client.xlen(stream) <= settings.redis_max_len:
        return 0
    ensure_groups(client, stream, settings.groups)
    floor = trim_floor(client, stream)
    if floor is None:
        return 0
    # Floors only move forward (groups acknowledge, new entries get larger ids), so a floor
    # computed a moment ago is still safe when XTRIM runs.
    removed = int(client.xtrim(stream, minid=f"{floor[0]}-{floor[1]}", approximate=False))
    if client.xlen(stream) > settings.redis_max_len:
        log.warning(
            "eventlog stream %s holds more than %d unconsumed entries: a group is behind",
            stream,
            settings.redis_max_len,
        )
    return removed


class RedisStreamWriter:
    """Adds batches to the stream in one round trip on a connection of its own.

    The commands are packed and their replies read on the connection directly rather than
    through a redis-py pipeline: the sender thread writes a small batch every few ms, and
    the pipeline's machinery cost more CPU per batch (measured: docs/eventlog.md).
    """

    def __init__(self, settings: EventLogSettings) -> None:
        self._settings = settings
        self._client = _client(settings, settings.send_timeout_s)
        self._conn: Any = None
        self._ready = False
        self._last_id: str | None = None

    def write(self, batch: Sequence[KeyValue]) -> None:
        """XADDs the batch in order; raises ``BackendUnavailable`` if Redis does not answer,
        naming the entries Redis refused (an error reply) when it answered."""
        stream = self._settings.topic
        try:
            if not self._ready:
                ensure_groups(self._client, stream, self._settings.groups)
                self._ready = True
            if self._conn is None:
                self._conn = self._client.connection_pool.get_connection()
            conn = self._conn
            conn.send_packed_command(
                conn.pack_commands(
                    [
                        ("XADD", stream, "*", KEY_FIELD, key, VALUE_FIELD, value)
                        for key, value in batch
                    ]
                )
            )
            refused: list[int] = []
            error: redis.ResponseError | None = None
            for i in range(len(batch)):
                try:
                    entry_id = conn.read_response()
                except redis.ResponseError as exc:  # e.g. OOM: the other replies still come
                    refused.append(i)
                    error = exc
                else:
                    self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        except (redis.RedisError, OSError) as exc:
            # After a restart without persistence the stream and its groups are gone.
            self._ready = False
            self._drop_connection()
            raise BackendUnavailable(f"redis: {exc}") from exc
        if refused:
            raise BackendUnavailable(f"redis: {error}", failed=refused)

    def position(self) -> str:
        """The id of this writer's last entry (before its first: the stream's last id, or
        0-0): entries it adds next get larger ids."""
        if self._last_id is None:
            try:
                info = self._client.xinfo_stream(self._settings.topic)
                last = info.get("last-generated-id", b"0-0")
            except redis.ResponseError:  # no stream yet
                last = b"0-0"
            except (redis.RedisError, OSError) as exc:
                raise BackendUnavailable(f"redis: {exc}") from exc
            self._last_id = last.decode() if isinstance(last, bytes) else str(last)
        return self._last_id

    def values_since(self, position: str) -> Iterator[bytes]:
        """The values of the entries after id ``position``, oldest first."""
        stream, start = self._settings.topic, f"({position or '0-0'}"
        while True:
            try:
                entries = self._client.xrange(stream, min=start, max="+", count=_RANGE_COUNT)
            except (redis.RedisError, OSError) as exc:
                raise BackendUnavailable(f"redis: {exc}") from exc
            for _, fields in entries:
                yield fields.get(VALUE_FIELD, b"")
            if len(entries) < _RANGE_COUNT:
                return
            last = entries[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
            self._client.connection_pool.release(self._conn)
            self._conn = None

    def sync(self) -> None:
        """Nothing to do: Redis persists by its own configuration."""

    def close(self) -> None:
        """Closes the connections."""
        self._drop_connection()
        self._client.close()


class RedisStreamConsumer:
    """A consumer group member on the stream."""

    def __init__(
        self, settings: EventLogSettings, group: str, consumer_name: str | None = None
    ) -> None:
        self.group = group
        self.name = consumer_name or settings.consumer_name
        self._settings = settings
        self._stream = settings.topic
        self._client = _client(settings, settings.send_timeout_s + _MAX_BLOCK_S)
        self._ready = False
        self._pel_cursor: bytes | None = b"0"
        self._polled: list[bytes] = []
        self._last_claim = float("-inf")  # claim on the first poll: a restart may follow a crash
        self._claim_cursor = b"0-0"
        self._last_trim = 0.0

    def _ensure(self) -> None:
        if not self._ready:
            ensure_groups(self._client, self._stream, (*self._settings.groups, self.group))
            self._ready = True

    def _records(self, entries: Sequence[tuple[bytes, Any]]) -> list[Record]:
        records, gone = [], []
        for entry_id, fields in entries:
            self._polled.append(entry_id)
            if not fields:
                gone.append(entry_id)  # deleted from the stream while pending
                continue
            records.append(
                Record(fields.get(KEY_FIELD, b""), fields.get(VALUE_FIELD, b""), entry_id.decode())
            )
        if gone:
            log.warning(
                "eventlog: %d pending entries of group %s were deleted", len(gone), self.group
            )
        return records

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Own pending entries first (after a restart), then claimed ones, then new ones."""
        try:
            self._ensure()
            if self._pel_cursor is not None:
                reply = self._client.xreadgroup(
                    self.group, self.name, {self._stream: self._pel_cursor}, count=max_records
                )
                entries = reply[0][1] if reply else []
                if entries:
                    self._pel_cursor = entries[-1][0]
                    return self._records(entries)
                self._pel_cursor = None
            now = time.monotonic()
            if now - self._last_claim >= min(
                _CLAIM_INTERVAL_S, self._settings.redis_claim_idle_ms / 2e3
            ):
                self._last_claim = now
                claimed = self._claim(max_records)
                if claimed:
                    return claimed
            deadline = now + timeout_s
            while True:
                block_s = min(max(deadline - time.monotonic(), 0.0), _MAX_BLOCK_S)
                reply = self._client.xreadgroup(
                    self.group,
                    self.name,
                    {self._stream: ">"},
                    count=max_records,
                    block=max(1, int(block_s * 1000)),
                )
                entries = reply[0][1] if reply else []
                if entries or time.monotonic() >= deadline:
                    return self._records(entries)
        except (redis.RedisError, OSError) as exc:
            self._lost_contact()
            raise BackendUnavailable(f"redis: {exc}") from exc

    def _lost_contact(self) -> None:
        """After an error: check the group again and re-read this consumer's pending entries
        (what was polled but not acknowledged), as after a restart."""
        self._ready = False
        self._pel_cursor = b"0"

    def _claim(self, max_records: int) -> list[Record]:
        reply = self._client.xautoclaim(
            self._stream,
            self.group,
            self.name,
            min_idle_time=self._settings.redis_claim_idle_ms,
            start_id=self._claim_cursor,
            count=max_records,
        )
        self._claim_cursor = reply[0]
        entries = reply[1]
        if len(reply) > 2 and reply[2]:
            self._client.xack(self._stream, self.group, *reply[2])
        if entries:
            log.info("eventlog: group %s claimed %d idle pending entries", self.group, len(entries))
        return self._records(entries)

    def commit(self) -> None:
        """XACKs every entry polled so far; trims the stream now and then."""
        if self._polled:
            try:
                pipe = self._client.pipeline(transaction=False)
                for i in range(0, len(self._polled), 1000):
                    pipe.xack(self._stream, self.group, *self._polled[i : i + 1000])
                pipe.execute()
            except (redis.RedisError, OSError) as exc:
                self._lost_contact()
                raise BackendUnavailable(f"redis: {exc}") from exc
            self._polled = []
        now = time.monotonic()
        if now - self._last_trim >= self._settings.redis_trim_interval_s:
            self._last_trim = now
            try:
                trim(self._client, self._settings)
            except (redis.RedisError, OSError) as exc:
                log.warning("eventlog: trimming %s failed: %s", self._stream, exc)

    def close(self) -> None:
        """Closes the connection; unacknowledged entries stay pending for this consumer name."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
