"""A dataset folder: labelled transactions and the feature tables Feast's offline store reads.

``Dataset.from_transactions`` computes the card, merchant and terminal tables from raw
transactions with ``domain.aggregation`` (the code the live updater runs per event), so the
offline tables, training and the online store agree:

* ``card_features.parquet``: one row per (card, timestamp), the card's aggregates
  *including* the transactions of that instant, stamped ``event_timestamp`` = their time.
  The newest row is what the online store holds after materialization: the card's state
  right after its latest transaction, which is what its next transaction finds.
* ``merchant_features.parquet`` and ``terminal_features.parquet``: the same for merchants
  and terminals; the fraud rates cover windows ending one label delay (7 days) before each
  row, because chargebacks reveal fraud late.

Training joins each transaction at ``timestamp - 1 µs`` (point in time), so it sees the
state after the card's, merchant's and terminal's *previous* transactions: exactly what
serving sees.

Publishing is atomic: ``write`` fills a new folder beside the data folder
(``<data>.versions/<id>/``) and then points the data folder, a symbolic link, at it with one
``rename``. Readers see the previous dataset until the new one is complete, and a failed
write leaves the previous one in place. The previous version is kept (a job that resolved
the link before the swap may still read it); older ones are removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from services.domain import aggregation
from services.featurestore.layout import (
    CARD_FEATURES_FILE,
    MERCHANT_FEATURES_FILE,
    TERMINAL_FEATURES_FILE,
    TRANSACTIONS_FILE,
)

KEEP_VERSIONS = 2
"""Dataset versions kept: the current one and the one before it."""


@dataclass(frozen=True)
class Dataset:
    """Labelled transactions and the feature tables computed from them."""

    transactions: pd.DataFrame
    card_features: pd.DataFrame
    merchant_features: pd.DataFrame
    terminal_features: pd.DataFrame

    @classmethod
    def from_transactions(
        cls, transactions: pd.DataFrame, label_delay: timedelta = aggregation.LABEL_DELAY
    ) -> Dataset:
        """The dataset of ``transactions`` (``aggregation.RAW_COLUMNS``, sorted by time)."""
        cards, merchants, terminals = (
            compute(transactions, label_delay) for compute in TABLES.values()
        )
        return cls(transactions, cards, merchants, terminals)

    def frames(self) -> dict[str, pd.DataFrame]:
        """File name → frame, for every file of the dataset folder."""
        return {
            TRANSACTIONS_FILE: self.transactions,
            CARD_FEATURES_FILE: self.card_features,
            MERCHANT_FEATURES_FILE: self.merchant_features,
            TERMINAL_FEATURES_FILE: self.terminal_features,
        }


def write(dataset: Dataset, data_dir: Path) -> dict[str, Path]:
    """Publishes the dataset's Parquet files as ``data_dir`` (atomically); returns their paths."""
    with staging(data_dir) as folder:
        for name, frame in dataset.frames().items():
            write_table(pa.Table.from_pandas(frame, preserve_index=False), folder / name)
    return {name: data_dir / name for name in dataset.frames()}


TABLES: dict[str, Callable[[pd.DataFrame, timedelta], pd.DataFrame]] = {
    CARD_FEATURES_FILE: lambda tx, delay: aggregation.card_feature_table(tx),
    MERCHANT_FEATURES_FILE: lambda tx, delay: aggregation.merchant_feature_table(tx, delay),
    TERMINAL_FEATURES_FILE: lambda tx, delay: aggregation.terminal_feature_table(tx, delay),
}
"""Each feature table's file and how ``Dataset.from_transactions`` computes it."""


def write_feature_tables(
    transactions: pd.DataFrame,
    folder: Path,
    label_delay: timedelta = aggregation.LABEL_DELAY,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Computes and writes the feature tables one at a time (the tables of
    ``Dataset.from_transactions``, with one of them in memory at a time)."""
    for done, (name, compute) in enumerate(TABLES.items()):
        if progress is not None:
            progress(done, len(TABLES))
        table = compute(transactions, label_delay)
        write_table(pa.Table.from_pandas(table, preserve_index=False), folder / name)
        del table
    if progress is not None:
        progress(len(TABLES), len(TABLES))


def write_table(table: pa.Table, path: Path) -> None:
    """One Parquet file as every dataset file is written (zstd)."""
    pq.write_table(table, path, compression="zstd")


def versions_dir(data_dir: Path) -> Path:
    """The folder holding the published versions behind the ``data_dir`` link."""
    return data_dir.with_name(f"{data_dir.name}.versions")


@contextlib.contextmanager
def staging(data_dir: Path) -> Iterator[Path]:
    """A new, empty version folder, published as ``data_dir`` when the block completes.

    Write every file into the folder inside the ``with`` block; on normal exit the data
    folder is swapped to it, on an exception the folder is removed and the data folder is
    left as it was.
    """
    versions = versions_dir(data_dir)
    versions.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".staging-", dir=versions))
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    publish(folder, data_dir)


def publish(folder: Path, data_dir: Path) -> Path:
    """Renames the complete ``folder`` to a new version and points ``data_dir`` at it.

    A ``data_dir`` that is a real folder (written before versions existed) first moves into
    the versions folder, which leaves a moment without a dataset; from then on every swap is
    one atomic ``rename`` of a link. Returns the new version's folder.
    """
    versions = versions_dir(data_dir)
    versions.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    version = versions / f"{stamp}-{uuid.uuid4().hex[:6]}"
    os.rename(folder, version)
    if data_dir.exists() and not data_dir.is_symlink():
        os.rename(data_dir, versions / f"{stamp}-{uuid.uuid4().hex[:6]}-before")
    link = data_dir.with_name(f".{data_dir.name}.link-{uuid.uuid4().hex[:6]}")
    os.symlink(Path(versions.name) / version.name, link, target_is_directory=True)
    os.replace(link, data_dir)
    _prune(versions, keep=version)
    return version


def _prune(versions: Path, keep: Path) -> None:
    """Removes versions beyond the newest ``KEEP_VERSIONS`` (never ``keep``)."""
    # By the time their files were written: names of one second do not order them.
    done = sorted(
        (p for p in versions.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime_ns,
    )
    for old in done[:-KEEP_VERSIONS]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
