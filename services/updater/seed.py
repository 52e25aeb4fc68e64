"""Seeding: the entity states of the batch history, so that live rows continue it.

The online store starts with the batch tables' newest rows (``features materialize``); the
updater must start from the states that produced them. Those cannot be recovered from the
feature tables (a window's count says nothing about when its events leave the window), so
they are rebuilt from the dataset's raw transactions: every transaction is applied in time
order with the same incremental functions the live path runs (``aggregation.apply_card``,
``apply_merchant``, ``apply_terminal`` for those that name a terminal, ``apply_label``,
``apply_terminal_label``), which ``tests/unit/test_aggregation.py`` holds equal to the batch
tables. The result is exactly the state a stream of the whole history would
have left, evictions and caps included. Labels count as the batch counts them: reported at
``fraud_reported_at`` when the dataset has it, else one label delay after the transaction.

The transaction index (transaction → merchant and terminal, for outcomes of historical
transactions) is filled from the same replay: the transactions the merchant and terminal
states still hold.
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
    apply_terminal,
    apply_terminal_label,
    move_to_reports,
    reports_after,
)
from services.updater.state import DueReport, IndexEntry

log = logging.getLogger(__name__)

_US = 1_000_000


@dataclass
class Seed:
    """The states a replay of the history left."""

    cards: dict[str, CardState] = field(default_factory=dict)
    merchants: dict[str, MerchantState] = field(default_factory=dict)
    terminals: dict[str, MerchantState] = field(default_factory=dict)
    transactions: list[IndexEntry] = field(default_factory=list)
    """Index entries of the transactions the merchant or terminal states still hold."""
    due: list[DueReport] = field(default_factory=list)
    """Fraud reports after the history's newest payment that will move a terminal's row
    when the live clock passes them (``LiveAggregator``)."""
    events: int = 0
    """Transactions replayed."""


def fingerprint(path: Path) -> str:
    """Identifies a dataset file's content cheaply (size and modification time)."""
    stat = path.stat()
    return f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"


def replay(tx: pd.DataFrame, *, terminals_only: bool = False) -> Seed:
    """Applies every transaction of a raw frame (``aggregation.RAW_COLUMNS``) in time order.

    ``terminals_only``: only the terminal states and their index entries (a state file of
    the format before terminals keeps its live card and merchant states)."""
    start = time.perf_counter()
    ordered = tx.sort_values(["timestamp", "transaction_id"], kind="stable")
    reported = _explicit_reports(ordered)
    seed = Seed()
    cards, merchants, terminals = seed.cards, seed.merchants, seed.terminals
    merchant_of: dict[str, str] = {}
    """Terminal → its merchant (terminal ids are unique across merchants)."""
    for event, reported_s in zip(aggregation.events_from_frame(ordered), reported, strict=True):
        if reported_s is not None:
            # The label's own report time rules (as in the batch tables), not the default delay.
            event = dataclasses.replace(event, is_fraud=None)
        if not terminals_only:
            card = apply_card(cards.get(event.card_id), event)
            cards[event.card_id] = card.state
            merchant = apply_merchant(merchants.get(event.merchant_id), event)
            merchants[event.merchant_id] = merchant.state
            if reported_s is not None:
                apply_label(merchant.state, event.transaction_id, True, reported_s)
        terminal_id = event.terminal_id
        if terminal_id:
            terminal = apply_terminal(terminals.get(terminal_id), event)
            terminals[terminal_id] = terminal.state
            merchant_of[terminal_id] = event.merchant_id
            if reported_s is not None:
                apply_terminal_label(terminal.state, event.transaction_id, True, reported_s)
                # Replayed in payment order, not report order: moved at the end instead.
                terminal.state.reported_us = 0
        seed.events += 1
    if len(ordered):
        now_us = int(aggregation.timestamps_us(ordered["timestamp"]).max())
        seed.due = _move_to_reports(terminals, merchant_of, now_us)
    seed.transactions = _index(merchants, terminals, merchant_of)
    log.info(
        "seeded entity states from the history",
        extra={
            "transactions": seed.events,
            "cards": len(cards),
            "merchants": len(merchants),
            "terminals": len(terminals),
            "seconds": round(time.perf_counter() - start, 2),
        },
    )
    return seed


def _move_to_reports(
    terminals: dict[str, MerchantState], merchant_of: dict[str, str], now_us: int
) -> list[DueReport]:
    """Each terminal's row as of its latest fraud label reported after its newest payment
    and by the history's newest payment (``now_us``), as the batch table's newest row is
    (``aggregation.terminal_feature_table``); labels the events carry count as reported at
    timestamp + delay. Returns the reports still to come after ``now_us``, which the live
    loop moves the rows to when its clock passes them."""
    due: list[DueReport] = []
    for terminal_id, state in terminals.items():
        state.reported_us = 0
        move_to_reports(state, now_us)
        merchant_id = merchant_of[terminal_id]
        due += [(terminal_id, merchant_id, r) for r in reports_after(state, now_us)]
    return due


def _index(
    merchants: dict[str, MerchantState],
    terminals: dict[str, MerchantState],
    merchant_of: dict[str, str],
) -> list[IndexEntry]:
    """Index entries of every transaction a merchant or terminal state holds.

    A terminal's state can hold a transaction its merchant's no longer does (its newest
    event, which bounds its horizon, is older), so both are walked."""
    entries: dict[str, IndexEntry] = {}
    for merchant_id, state in merchants.items():
        events = state.events
        for tid, t_us in zip(events.ids, events.times_us, strict=True):
            entries[tid] = (tid, merchant_id, "", t_us)
    for terminal_id, state in terminals.items():
        events = state.events
        merchant_id = merchant_of[terminal_id]
        for tid, t_us in zip(events.ids, events.times_us, strict=True):
            entries[tid] = (tid, merchant_id, terminal_id, t_us)
    return list(entries.values())


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
