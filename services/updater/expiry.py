"""Expired list entries, audited and swept off their lists by the feature updater.

An entry stops matching at its expiry by itself: a gateway checks ``ListEntry.live`` on
every match, so the answer changes at that moment whatever happens here. What the expiry
still needs is its audit record, like any other change to the lists, and the entry's removal
from the store, so that the lists do not grow with dead entries.

The updater is the online store's writer, so it sweeps. Each sweep reads only the lists'
generation while nothing changed and no known expiry has passed; otherwise it reads the
entries, and for each expired one writes a ``ListChangeEvent`` (``LIST_CHANGE_EXPIRE``, at
the entry's expiry, actor ``expiry``) and then removes the entry if it is still the one it
read. The record is written first: a crash between the two writes it again on the next
sweep (at least once, as every event on the log), and never leaves a swept entry unaudited.
Two sweepers (two updaters) may both audit an entry before either removes it; the record's
entry and expiry tell such duplicates apart.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from fraud.v1 import events_pb2
from services.domain.lists import ListEntry
from services.featurestore.lists import ListStore

log = logging.getLogger(__name__)

ACTOR = "expiry"
"""The actor of an expiry's audit record."""


class ListExpiry:
    """Sweeps a store's expired entries, writing each one's audit record first."""

    def __init__(
        self,
        store: ListStore,
        write: Callable[[events_pb2.EventEnvelope], None],
        envelope: Callable[[ListEntry, int], events_pb2.EventEnvelope],
    ) -> None:
        self._store = store
        self._write = write
        self._envelope = envelope
        self._generation = -1
        self._next_expiry = math.inf

    def sweep(self, now_s: float) -> list[ListEntry]:
        """Audits and removes the entries expired at ``now_s``; returns those removed here.
        Raises what the store or the log raised (the next sweep tries again)."""
        generation = self._store.generation()
        if generation == self._generation and now_s < self._next_expiry:
            return []
        generation, entries = self._store.entries()
        expired = [e for e in entries if not e.live(now_s)]
        removed = []
        for entry in expired:
            self._write(self._envelope(entry, generation))
            if self._store.remove_entry(entry):
                removed.append(entry)
        pending = [e.expires_at_s for e in entries if e.live(now_s) and e.expires_at_s]
        self._next_expiry = min(pending, default=math.inf)
        # Removing moved the generation: read it again on the next sweep.
        self._generation = -1 if expired else generation
        if removed:
            log.info(
                "expired list entries swept off",
                extra={"entries": len(removed), "next_expiry_s": self._next_expiry},
            )
        return removed
