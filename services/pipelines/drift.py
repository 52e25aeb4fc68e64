"""Drift you can reproduce: traffic drawn from a simulated (or imported) history, changed the
way a real population changes, for tests and the demo to show what the monitor catches and
what it rightly ignores.

``traffic(history, scenario, n, seed)`` draws ``n`` transactions of the history (seeded, so a
scenario is the same traffic every time) and changes them; each row keeps a new unique
``transaction_id``, the request's fields, and ``is_fraud`` (what the outcome report says).

- ``none``: the history as it was (no drift: the score's PSI stays low);
- ``shifted``: amounts ``factor`` times larger, card not present, at online merchants of
  another country than the card's home (inputs drift: the score and the amount, channel and
  geography features move; hour of day, for one, does not);
- ``new_merchants``: the same payments at merchants the feature store has never seen (their
  merchant features go missing: the missing share jumps);
- ``new_fraud``: the payments as they were, a ``fraud_share`` of them reported as fraud (a
  pattern the model cannot see: inputs do not move, live recall falls);
- ``dcc``: dynamic currency conversion: the same payments charged in another currency at
  the same value in EUR (the requests change, the model's inputs do not: the monitor must
  stay quiet).

Sent to a mesh whose store already holds the drawn transactions, a payment would read the
store's state of after itself; ``restamp`` moves them into the last day.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from services.domain import featurespec, money

SCENARIOS: tuple[str, ...] = ("none", "shifted", "new_merchants", "new_fraud", "dcc")
"""Every scenario ``traffic`` knows."""

_DCC_CURRENCIES = ("USD", "GBP", "CHF", "SEK", "JPY")


@dataclass(frozen=True)
class DriftParams:
    """How strong a scenario's change is."""

    factor: float = 5.0
    """``shifted``: amount multiplier."""
    fraud_share: float = 0.05
    """``new_fraud``: share of the payments that turn out fraudulent."""


def traffic(
    history: pd.DataFrame,
    scenario: str,
    n: int,
    seed: int = 0,
    params: DriftParams | None = None,
    prefix: str = "drift",
) -> pd.DataFrame:
    """``n`` transactions of ``history`` (raw transaction columns with labels) changed as the
    scenario says; columns: transaction_id, card_id, merchant_id, terminal_id, amount_minor,
    currency, timestamp, channel, is_fraud, scenario."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown drift scenario {scenario!r}; choose one of {SCENARIOS}")
    if n < 1 or history.empty:
        raise ValueError("drift traffic needs a history and at least one transaction")
    p = params or DriftParams()
    rng = np.random.default_rng(seed)
    rows = history.iloc[rng.choice(len(history), size=n, replace=n > len(history))]
    out = pd.DataFrame(
        {
            "transaction_id": [f"{prefix}-{scenario}-{seed}-{i:07d}" for i in range(n)],
            "card_id": rows["card_id"].astype(str).to_numpy(),
            "merchant_id": rows["merchant_id"].astype(str).to_numpy(),
            "terminal_id": rows["terminal_id"].astype(object).to_numpy()
            if "terminal_id" in rows
            else None,
            "amount_minor": rows["amount_minor"].to_numpy(dtype=np.int64),
            "currency": rows["currency"].astype(str).to_numpy(),
            "timestamp": rows["timestamp"].to_numpy(),
            "channel": rows["channel"].astype(str).to_numpy(),
            "is_fraud": rows["is_fraud"].fillna(False).to_numpy(dtype=bool),
            "scenario": scenario,
        }
    )
    if scenario == "shifted":
        _shift(out, rows, history, rng, p.factor)
    elif scenario == "new_merchants":
        codes = rng.integers(0, 10**6, size=n)
        out["merchant_id"] = [f"merch-new-{c:06d}" for c in codes]
        out["terminal_id"] = [f"merch-new-{c:06d}-t1" for c in codes]
    elif scenario == "new_fraud":
        out["is_fraud"] = out["is_fraud"].to_numpy() | (rng.random(n) < p.fraud_share)
    elif scenario == "dcc":
        eur = _eur(out["amount_minor"].to_numpy(), out["currency"].to_numpy())
        currency = rng.choice(_DCC_CURRENCIES, size=n)
        out["currency"] = currency
        out["amount_minor"] = _minor(eur, currency)
    return out


def _eur(amount_minor: np.ndarray, currency: np.ndarray) -> np.ndarray:
    return np.asarray(
        [money.amount_eur(int(a), str(c)) for a, c in zip(amount_minor, currency, strict=True)]
    )


def _minor(eur: np.ndarray, currency: np.ndarray) -> np.ndarray:
    return np.asarray(
        [
            max(1, round(e / money.eur_per_unit(str(c)) * money.minor_per_major(str(c))))
            for e, c in zip(eur, currency, strict=True)
        ],
        dtype=np.int64,
    )


def _shift(
    out: pd.DataFrame,
    rows: pd.DataFrame,
    history: pd.DataFrame,
    rng: np.random.Generator,
    factor: float,
) -> None:
    """Larger amounts, card not present, at an online merchant abroad, in its currency."""
    online = history[history["channel"] == featurespec.CARD_NOT_PRESENT]
    merchants = online.drop_duplicates("merchant_id")[
        ["merchant_id", "merchant_country", "currency"]
    ]
    if "terminal_id" in online:
        first_terminal = online.drop_duplicates("merchant_id").set_index("merchant_id")[
            "terminal_id"
        ]
    else:
        first_terminal = pd.Series(dtype=object)
    home = rows["card_home_country"].to_numpy()
    eur = _eur(out["amount_minor"].to_numpy(), out["currency"].to_numpy()) * factor
    chosen_merchant, chosen_currency, chosen_terminal = [], [], []
    by_country = {c: g for c, g in merchants.groupby("merchant_country")}
    countries = np.asarray(sorted(by_country))
    for h in home:
        abroad = countries[countries != h]
        country = rng.choice(abroad if len(abroad) else countries)
        pool = by_country[country]
        pick = pool.iloc[int(rng.integers(len(pool)))]
        chosen_merchant.append(str(pick["merchant_id"]))
        chosen_currency.append(str(pick["currency"]))
        chosen_terminal.append(first_terminal.get(pick["merchant_id"]))
    out["merchant_id"] = chosen_merchant
    out["terminal_id"] = chosen_terminal
    out["currency"] = chosen_currency
    out["amount_minor"] = _minor(eur, np.asarray(chosen_currency))
    out["channel"] = featurespec.CARD_NOT_PRESENT


def restamp(frame: pd.DataFrame, now: pd.Timestamp) -> pd.DataFrame:
    """``frame``'s transactions moved into the day that ends at ``now``, each to the latest
    moment with its own time of day (so the hours of the day keep their shares and none is in
    the future)."""
    now = pd.Timestamp(now).tz_convert("UTC")
    stamp = pd.to_datetime(frame["timestamp"], utc=True)
    day = pd.Timedelta(days=1)
    out = frame.copy()
    out["timestamp"] = now - ((now - stamp) % day)
    return out
