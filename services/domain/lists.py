"""The fraud team's block and allow lists: entries, their checks, and the in-memory index a
gateway asks on every call.

An entry puts one card, card prefix (BIN), merchant or terminal on the block list (decline)
or the allow list (approve, whatever the model says), with a reason and an optional expiry.
A payment matching a live block entry is declined, else one matching a live allow entry is
approved; an expired entry matches nothing (docs/controls.md).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.domain.validation import check_id

MAX_REASON = 200
"""Longest reason kept with an entry, in characters."""
PREFIX_LENGTHS = range(4, 13)
"""Lengths a card prefix may have (BINs are 6 or 8 digits; shorter or longer ranges too)."""


class ListKind(enum.Enum):
    """What an entry names."""

    CARD = "card"
    CARD_PREFIX = "card_prefix"
    MERCHANT = "merchant"
    TERMINAL = "terminal"


class ListName(enum.Enum):
    """Which list an entry is on."""

    BLOCK = "block"
    ALLOW = "allow"


@dataclass(frozen=True, slots=True)
class ListEntry:
    """One entry of a list."""

    kind: ListKind
    value: str
    list: ListName
    reason: str
    expires_at_s: float | None
    """Epoch seconds after which the entry matches nothing; None: never expires."""
    added_at_s: float
    actor: str

    def live(self, now_s: float) -> bool:
        """Whether the entry still matches at ``now_s``."""
        return self.expires_at_s is None or now_s < self.expires_at_s


def check_entry(
    kind: ListKind, value: str, reason: str, expires_at_s: float | None, now_s: float
) -> None:
    """Raises InvalidArgument naming the field when an entry to add is wrong."""
    if kind is ListKind.CARD_PREFIX:
        if len(value) not in PREFIX_LENGTHS or not value.isascii() or not value.isprintable():
            raise InvalidArgument(
                "value",
                f"a card prefix has {PREFIX_LENGTHS.start} to {PREFIX_LENGTHS.stop - 1} "
                "printable ASCII characters",
            )
    else:
        check_id("value", value)
    if not reason.strip() or len(reason) > MAX_REASON or not reason.isprintable():
        raise InvalidArgument("reason", f"must be 1 to {MAX_REASON} printable characters")
    if expires_at_s is not None and (not math.isfinite(expires_at_s) or expires_at_s <= now_s):
        raise InvalidArgument("expires", "must be in the future")


def parse_kind(text: str) -> ListKind:
    """The kind named by ``text``; InvalidArgument naming ``kind`` for any other."""
    try:
        return ListKind(text)
    except ValueError:
        names = ", ".join(k.value for k in ListKind)
        raise InvalidArgument("kind", f"{text[:32]!r} is not a kind: one of {names}") from None


def parse_list(text: str) -> ListName:
    """The list named by ``text``; InvalidArgument naming ``list`` for any other."""
    try:
        return ListName(text)
    except ValueError:
        raise InvalidArgument("list", f"{text[:32]!r} is not a list: block or allow") from None


class ListIndex:
    """Every entry by list, kind and value: a payment is matched with a few dict lookups."""

    def __init__(self, entries: Iterable[ListEntry], generation: int = 0) -> None:
        self.generation = generation
        """The store's generation these entries were read at."""
        self._by: dict[tuple[ListName, ListKind], dict[str, ListEntry]] = {}
        lengths: set[int] = set()
        for entry in entries:
            self._by.setdefault((entry.list, entry.kind), {})[entry.value] = entry
            if entry.kind is ListKind.CARD_PREFIX:
                lengths.add(len(entry.value))
        self._prefix_lengths = tuple(sorted(lengths))
        self.size = sum(len(found) for found in self._by.values())

    def _find(
        self, name: ListName, card_id: str, merchant_id: str, terminal_id: str, now_s: float
    ) -> ListEntry | None:
        by = self._by
        candidates = (
            (ListKind.CARD, card_id),
            (ListKind.MERCHANT, merchant_id),
            (ListKind.TERMINAL, terminal_id),
        )
        for kind, value in candidates:
            found = by.get((name, kind))
            entry = found.get(value) if found and value else None
            if entry is not None and entry.live(now_s):
                return entry
        prefixes = by.get((name, ListKind.CARD_PREFIX))
        if prefixes:
            for length in self._prefix_lengths:
                entry = prefixes.get(card_id[:length]) if len(card_id) >= length else None
                if entry is not None and entry.live(now_s):
                    return entry
        return None

    def match(
        self, card_id: str, merchant_id: str, terminal_id: str, now_s: float
    ) -> ListEntry | None:
        """The live block entry the payment matches, else the live allow entry, else None."""
        if not self._by:
            return None
        return self._find(ListName.BLOCK, card_id, merchant_id, terminal_id, now_s) or self._find(
            ListName.ALLOW, card_id, merchant_id, terminal_id, now_s
        )
