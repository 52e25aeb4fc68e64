"""Sample transactions for ``fraudmesh up --demo``: picked from the simulated data, sent
through Envoy, printed with what a person would expect of them."""

from __future__ import annotations

import grpc
import pandas as pd
from rich.console import Console

from services import client
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import MeshConfig


def _latest(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """Each entity's newest feature row (what the online store holds), if from the last day."""
    latest = frame.sort_values("event_timestamp").groupby(key, sort=False).tail(1)
    fresh = latest["event_timestamp"] >= latest["event_timestamp"].max() - pd.Timedelta(days=1)
    return latest[fresh].set_index(key)


def samples(config: MeshConfig) -> list[client.Sample]:
    """A legitimate payment, two fraud-like ones, an unknown card and an invalid request."""
    data = FeatureStoreSettings(var_dir=config.var_dir).data_path
    tx = pd.read_parquet(data / layout.TRANSACTIONS_FILE)
    cards = _latest(pd.read_parquet(data / layout.CARD_FEATURES_FILE), "card_id")
    merchants = _latest(pd.read_parquet(data / layout.MERCHANT_FEATURES_FILE), "merchant_id")

    eur = tx[(tx["currency"] == "EUR") & ~tx["is_fraud"]]
    card = str(eur["card_id"].value_counts().index[0])
    mine = eur[eur["card_id"] == card]
    home_merchant = str(mine["merchant_id"].value_counts().index[0])
    typical = int(mine["amount_minor"].median())
    home = cards.loc[card, "card_home_country"]

    foreign = merchants[merchants["merchant_country"] != home]
    risky = str(foreign["merchant_fraud_rate_28d"].idxmax())
    tester = str(cards["card_small_txn_count_1h"].idxmax())
    return [
        client.Sample(
            "typical payment at the card's usual merchant",
            card, home_merchant, typical, expect="APPROVE",
        ),
        client.Sample(
            "60x the card's usual amount, card not present, abroad at a high-fraud merchant",
            card, risky, typical * 60, card_not_present=True, expect="REVIEW or DECLINE",
        ),
        client.Sample(
            "large online payment right after a burst of tiny ones (card testing)",
            tester, risky, 180_000, card_not_present=True, expect="REVIEW or DECLINE",
        ),
        client.Sample(
            "card never seen before, ordinary amount",
            "card-unknown-0001", home_merchant, typical, expect="APPROVE (default features)",
        ),
        client.Sample(
            "invalid: negative amount", card, home_merchant, -500, expect="INVALID_ARGUMENT",
        ),
    ]  # fmt: skip


def run(
    config: MeshConfig, console: Console, credentials: client.Credentials = client.PLAINTEXT
) -> None:
    """Sends every sample through Envoy and prints each answer under what was expected."""
    console.rule("sample transactions through Envoy")
    for sample in samples(config):
        console.print(f"[bold]{sample.label}[/]  (expected: {sample.expect})")
        try:
            response = client.score(config.envoy_target, sample.request(), credentials=credentials)
        except grpc.RpcError as error:
            console.print(f"  [yellow]{error.code().name}[/]: {error.details()}\n")
            continue
        decision = client.DECISION_NAMES.get(response.decision, "UNSPECIFIED")
        colour = {"APPROVE": "green", "REVIEW": "yellow", "DECLINE": "red"}.get(decision, "white")
        summary, *reasons = client.describe(response).splitlines()
        console.print(f"  [{colour}]{summary}[/]", highlight=False)
        console.print("\n".join(reasons) + "\n", highlight=False)
