"""Seeding: the entity states of the batch history, so that live rows continue it.

The online store starts with the batch tables' newest rows (``features materialize``); the
updater must start from the states that produced them. Those cannot be recovered from the
feature tables (a window's count says nothing about when its events leave the window), so
they are rebuilt from the dataset's raw transactions: every transaction is applied in time
order with the same incremental functions the live path runs (``aggregation.apply_card``,
``apply_merchant``, ``apply_label``), which ``tests/unit/test_aggregation.py`` holds equal
to the batch tables. The result is exactly the state a stream of the whole history would
have left, evictions and caps included. Labels count as the batch counts them: reported at
``fraud_reported_at`` when the dataset has it, else one label delay after the transaction.

The transaction index (transaction → merchant, for outcomes of historical transactions)
is filled from the same replay, within the merchant horizon.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from services.domain import aggregation
from services.domain.aggregation import (
    CardState,
    MerchantState,
    apply_card,
    apply_label,
    apply_merchant,
)
from services.updater.state import IndexEntry

log = logging.getLogger(__name__)

_US = 1_000_000


@dataclass
class Seed:
    """The states a replay of the history left."""

    cards: dict[str, CardState] = field(default_factory=dict)
    merchants: dict[str, MerchantState] = field(default_factory=dict)
    transactions: list[IndexEntry] = field(default_factory=list)
    """Index entries of the transactions the merchant states still hold."""
    events: int = 0
    """Transactions replayed."""


def fingerprint(path: Path) -> str:
    """Identifies a dataset file's content cheaply (size and modification time)."""
    stat = path.stat()
    return f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"


def replay(tx: pd.DataFrame) -> Seed:
    """Applies every transaction of a raw frame (``aggregation.RAW_COLUMNS``) in time order."""
    start = time.perf_counter()
    ordered = tx.sort_values(["timestamp", "transaction_id"], kind="stable")
    reported = _explicit_reports(ordered)
    seed = Seed()
    cards, merchants = seed.cards, seed.merchants
    for event, reported_s in zip(aggregation.events_from_frame(ordered), reported, strict=True):
        if reported_s is not None:
            # The label's own report time rules (as in the batch tables), not the default delay.
            event = dataclasses.replace(event, is_fraud=None)
        card = apply_card(cards.get(event.card_id), event)
        cards[event.card_id] = card.state
        merchant = apply_merchant(merchants.get(event.merchant_id), event)
        merchants[event.merchant_id] = merchant.state
        if reported_s is not None:
            apply_label(merchant.state, event.transaction_id, True, reported_s)
        seed.events += 1
    for merchant_id, state in merchants.items():
        events = state.events
        seed.transactions.extend(
            (tid, merchant_id, t_us) for tid, t_us in zip(events.ids, events.times_us, strict=True)
        )
    log.info(
        "seeded entity states from the history",
        extra={
            "transactions": seed.events,
            "cards": len(cards),
            "merchants": len(merchants),
            "seconds": round(time.perf_counter() - start, 2),
        },
    )
    return seed


def _explicit_reports(tx: pd.DataFrame) -> list[float | None]:
    """Per row: the report time (epoch seconds) of a fraud label that has its own, else None."""
    if "fraud_reported_at" not in tx.columns:
        return [None] * len(tx)
    fraud = tx["is_fraud"].fillna(False).astype(bool).to_numpy()
    column = tx["fraud_reported_at"]
    known = (~column.isna()).to_numpy()
    micros = aggregation.timestamps_us(column.fillna(tx["timestamp"]))
    return [
        m / _US if f and k else None
        for f, k, m in zip(fraud.tolist(), known.tolist(), micros.tolist(), strict=True)
    ]
