"""File names of a dataset folder: the labelled transactions and the feature tables
Feast's offline store reads. The simulator and the importer write them; the Feast
definitions, materialization and training read them."""

from __future__ import annotations

from pathlib import Path

TRANSACTIONS_FILE = "transactions.parquet"
"""Labelled transactions, sorted by time."""
CARD_FEATURES_FILE = "card_features.parquet"
"""Feast source of the card feature view."""
MERCHANT_FEATURES_FILE = "merchant_features.parquet"
"""Feast source of the merchant feature view."""
TERMINAL_FEATURES_FILE = "terminal_features.parquet"
"""Feast source of the terminal feature view (no rows when the data names no terminals)."""
FEATURE_FILES = (CARD_FEATURES_FILE, MERCHANT_FEATURES_FILE, TERMINAL_FEATURES_FILE)
"""The feature tables, one per feature view."""
DATA_FILES = (TRANSACTIONS_FILE, *FEATURE_FILES)
"""Every file a complete dataset holds."""
MANIFEST_FILE = "dataset.json"
"""Where an imported dataset came from and how it was read (optional)."""


def data_present(data_dir: Path) -> bool:
    """True when every file of a dataset exists in ``data_dir``."""
    return all((data_dir / name).is_file() for name in DATA_FILES)
