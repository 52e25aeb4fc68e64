"""The training frame: every transaction joined with its point-in-time store features (Feast)."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq

from services.domain import featurespec
from services.featurestore import admin, layout
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings
from services.pipelines.training.params import TrainingDataError


def training_frame(settings: FeatureStoreSettings) -> pd.DataFrame:
    """Transactions with their point-in-time store features from Feast, in time order."""
    data_dir = settings.data_path
    if not layout.data_present(data_dir):
        raise TrainingDataError(
            f"no dataset in {data_dir}: run `fraudmesh features simulate` or `fraudmesh data import`"
        )
    available = pq.ParquetFile(data_dir / layout.TRANSACTIONS_FILE).schema_arrow.names
    tx = pd.read_parquet(
        data_dir / layout.TRANSACTIONS_FILE, columns=[c for c in _TX_COLUMNS if c in available]
    )
    # Time order, so that periods are contiguous and scores come out in time order.
    tx = tx.sort_values("timestamp", kind="stable").reset_index(drop=True)
    fs = admin.feature_store(settings)
    service = admin.feature_service(fs, definitions.FEATURE_SERVICE)
    if service is None:
        raise TrainingDataError(
            f"feature service {definitions.FEATURE_SERVICE!r} is not registered: "
            "run `fraudmesh features apply`"
        )
    entity_df = pd.DataFrame(
        {
            "card_id": tx["card_id"],
            "merchant_id": tx["merchant_id"],
            # Payments without a terminal find no terminal row: its features stay missing.
            "terminal_id": _terminal_ids(tx),
            # The state after the previous transactions, as the online store holds it.
            "event_timestamp": tx["timestamp"] - pd.Timedelta(microseconds=1),
        }
    )
    features = fs.get_historical_features(entity_df=entity_df, features=service).to_df()
    del entity_df
    if len(features) != len(tx):
        raise TrainingDataError(f"the offline store returned {len(features)} rows for {len(tx)}")
    # Every entity row comes back once, in input order (the offline store's contract). Raw
    # columns named like store features (the codes) give way to the store's values: those
    # are what serving reads.
    columns = {name: tx[name].array for name in tx.columns}
    columns |= {name: features[name].array for name in featurespec.STORE_FEATURES}
    columns["timestamp_s"] = tx["timestamp"].astype("datetime64[ns, UTC]").astype("int64") / 1e9
    columns["card_not_present"] = (tx["channel"] == featurespec.CARD_NOT_PRESENT).array
    return pd.DataFrame(columns, copy=False)


_TX_COLUMNS = (
    "transaction_id",
    "timestamp",
    "card_id",
    "merchant_id",
    "terminal_id",
    "amount_minor",
    "currency",
    "channel",
    "is_fraud",
    "fraud_scenario",
)
"""The transaction columns training reads."""


def _terminal_ids(tx: pd.DataFrame) -> pd.Series:
    """The terminal of each transaction, "" where none is named (no terminal row has that id)."""
    if "terminal_id" not in tx.columns:
        return pd.Series("", index=tx.index, dtype=object)
    return tx["terminal_id"].fillna("").astype(object)
