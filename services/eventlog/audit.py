"""Audit records of the fraud team's lists on the event log: one ``ListChangeEvent`` per
change (``fraudmesh lists add/remove``, the console), written synchronously by what made it,
so that it can say when the audit could not be written; an entry's expiry is written by the
feature updater, which sweeps it off (``services.updater.expiry``)."""

from __future__ import annotations

import time

from fraud.v1 import events_pb2
from services.domain.lists import ListEntry
from services.eventlog.backends import open_writer
from services.eventlog.events import key_of, new_event_id
from services.eventlog.settings import EventLogSettings

_CHANGES = {
    "add": events_pb2.LIST_CHANGE_ADD,
    "remove": events_pb2.LIST_CHANGE_REMOVE,
    "expire": events_pb2.LIST_CHANGE_EXPIRE,
}


def list_change(
    change: str,
    list_name: str,
    kind: str,
    value: str,
    *,
    reason: str = "",
    expires_at_s: float | None = None,
    actor: str = "",
    generation: int = 0,
    changed_at_s: float | None = None,
) -> events_pb2.EventEnvelope:
    """The envelope of one change (``change``: ``add``, ``remove`` or ``expire``)."""
    envelope = events_pb2.EventEnvelope()
    event = envelope.list_change
    event.event_id = new_event_id()
    event.change = _CHANGES[change]
    event.list = list_name
    event.kind = kind
    event.value = value
    event.reason = reason
    if expires_at_s is not None:
        event.expires_at.FromNanoseconds(int(expires_at_s * 1e9))
    event.actor = actor
    event.changed_at.FromNanoseconds(int((changed_at_s or time.time()) * 1e9))
    event.generation = generation
    return envelope


def entry_change(
    change: str, entry: ListEntry, generation: int, changed_at_s: float, actor: str | None = None
) -> events_pb2.EventEnvelope:
    """The envelope of ``change`` to ``entry`` (its list, kind, value, reason and expiry), by
    ``actor`` (default: whoever added the entry)."""
    return list_change(
        change,
        entry.list.value,
        entry.kind.value,
        entry.value,
        reason=entry.reason,
        expires_at_s=entry.expires_at_s,
        actor=entry.actor if actor is None else actor,
        generation=generation,
        changed_at_s=changed_at_s,
    )


def write(settings: EventLogSettings, envelope: events_pb2.EventEnvelope) -> None:
    """Writes one event and returns once the backend stored it; raises the backend's
    ``EventLogError`` when it could not."""
    writer = open_writer(settings)
    try:
        writer.write([(key_of(envelope), envelope.SerializeToString())])
        writer.sync()
    finally:
        writer.close()
