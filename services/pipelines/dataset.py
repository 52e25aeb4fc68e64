"""A dataset folder: labelled transactions and the feature tables Feast's offline store reads.

``Dataset.from_transactions`` computes the card and merchant tables from raw transactions
with ``domain.aggregation`` (the code the live updater runs per event), so the offline
tables, training and the online store agree:

* ``card_features.parquet``: one row per (card, timestamp), the card's aggregates
  *including* the transactions of that instant, stamped ``event_timestamp`` = their time.
  The newest row is what the online store holds after materialization: the card's state
  right after its latest transaction, which is what its next transaction finds.
* ``merchant_features.parquet``: the same for merchants; the fraud rate covers the 28 days
  ending one label delay (7 days) before each row, because chargebacks reveal fraud late.

Training joins each transaction at ``timestamp - 1 µs`` (point in time), so it sees the
state after the card's and merchant's *previous* transactions: exactly what serving sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from services.domain import aggregation
from services.featurestore.layout import (
    CARD_FEATURES_FILE,
    MERCHANT_FEATURES_FILE,
    TRANSACTIONS_FILE,
)


@dataclass(frozen=True)
class Dataset:
    """Labelled transactions and the two feature tables computed from them."""

    transactions: pd.DataFrame
    card_features: pd.DataFrame
    merchant_features: pd.DataFrame

    @classmethod
    def from_transactions(
        cls, transactions: pd.DataFrame, label_delay: timedelta = aggregation.LABEL_DELAY
    ) -> Dataset:
        """The dataset of ``transactions`` (``aggregation.RAW_COLUMNS``, sorted by time)."""
        return cls(
            transactions,
            aggregation.card_feature_table(transactions),
            aggregation.merchant_feature_table(transactions, label_delay=label_delay),
        )


def write(dataset: Dataset, data_dir: Path) -> dict[str, Path]:
    """Writes the three Parquet files into ``data_dir``, each atomically; returns their paths."""
    data_dir.mkdir(parents=True, exist_ok=True)
    frames = {
        TRANSACTIONS_FILE: dataset.transactions,
        CARD_FEATURES_FILE: dataset.card_features,
        MERCHANT_FEATURES_FILE: dataset.merchant_features,
    }
    paths = {}
    for name, frame in frames.items():
        path = data_dir / name
        tmp = path.with_suffix(".parquet.tmp")
        table = pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(path)
        paths[name] = path
    return paths
