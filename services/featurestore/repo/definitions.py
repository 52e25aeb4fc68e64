"""Feast objects: the card, merchant and terminal entities, their Parquet sources and views.

Source paths are relative: Feast resolves them against the repo path, which the store
configuration sets to the data folder (a setting), not to this source folder.
"""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

from services.domain import featurespec
from services.featurestore.layout import (
    CARD_FEATURES_FILE,
    MERCHANT_FEATURES_FILE,
    TERMINAL_FEATURES_FILE,
)

CARD_TTL = timedelta(days=30)
"""Oldest card row training's point-in-time join accepts; online reads judge staleness by it."""
MERCHANT_TTL = timedelta(days=14)
"""Oldest merchant row training's point-in-time join accepts; the online staleness limit."""
TERMINAL_TTL = timedelta(days=14)
"""Oldest terminal row training's point-in-time join accepts; the online staleness limit."""
FEATURE_SERVICE = "fraud_scoring"
"""Feature service naming every store feature the model path reads."""

# Counts, timestamps and codes are integers; everything else is a float.
_INTEGER_NAMES = {
    "card_distinct_merchants_24h",
    "card_last_txn_s",
    "card_home_country",
    "merchant_category",
    "merchant_country",
}


def _is_integer(name: str) -> bool:
    return "_count_" in name or name in _INTEGER_NAMES


def _schema(names: tuple[str, ...]) -> list[Field]:
    return [Field(name=n, dtype=Int64 if _is_integer(n) else Float64) for n in names]


card = Entity(
    name="card",
    join_keys=["card_id"],
    value_type=ValueType.STRING,
    description="A payment card.",
)
merchant = Entity(
    name="merchant",
    join_keys=["merchant_id"],
    value_type=ValueType.STRING,
    description="A merchant (shop or web shop) accepting card payments.",
)
terminal = Entity(
    name="terminal",
    join_keys=["terminal_id"],
    value_type=ValueType.STRING,
    description="A payment terminal (ids unique across merchants).",
)

card_source = FileSource(
    name="card_features_source",
    path=CARD_FEATURES_FILE,
    timestamp_field="event_timestamp",
    description="Card aggregates after each of the card's transactions.",
)
merchant_source = FileSource(
    name="merchant_features_source",
    path=MERCHANT_FEATURES_FILE,
    timestamp_field="event_timestamp",
    description="Merchant aggregates after each of the merchant's transactions.",
)
terminal_source = FileSource(
    name="terminal_features_source",
    path=TERMINAL_FEATURES_FILE,
    timestamp_field="event_timestamp",
    description="Terminal aggregates after each of the terminal's transactions.",
)

card_features = FeatureView(
    name=featurespec.CARD_VIEW,
    entities=[card],
    ttl=CARD_TTL,
    schema=_schema(featurespec.CARD_FEATURES),
    source=card_source,
    online=True,
    description="Card velocity and amount aggregates, home country, last transaction time.",
)
merchant_features = FeatureView(
    name=featurespec.MERCHANT_VIEW,
    entities=[merchant],
    ttl=MERCHANT_TTL,
    schema=_schema(featurespec.MERCHANT_FEATURES),
    source=merchant_source,
    online=True,
    description="Merchant volume, mean amount, label-delayed fraud rates, category, country.",
)
terminal_features = FeatureView(
    name=featurespec.TERMINAL_VIEW,
    entities=[terminal],
    ttl=TERMINAL_TTL,
    schema=_schema(featurespec.TERMINAL_FEATURES),
    source=terminal_source,
    online=True,
    description="Terminal volume and label-delayed fraud rates.",
)

fraud_scoring = FeatureService(
    name=FEATURE_SERVICE,
    features=[card_features, merchant_features, terminal_features],
    description="Every store feature of the fraud model, in featurespec.STORE_FEATURES order.",
)
