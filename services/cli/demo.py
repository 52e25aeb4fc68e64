"""Sample transactions for ``fraudmesh up --demo``: picked from the simulated data, sent
through Envoy, printed with what a person would expect of them; then, with the live loop,
a card-testing attack that the velocity features see as it happens."""

from __future__ import annotations

import time
import uuid

import grpc
import pandas as pd
from rich.console import Console

from fraud.v1 import features_pb2, features_pb2_grpc, outcomes_pb2, scoring_pb2
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

    # A typical payment in every way the model sees: a card never defrauded, at a merchant
    # of its home country, at an hour of the day it usually pays (within an hour of now).
    defrauded = tx.loc[tx["is_fraud"].fillna(False).astype(bool), "card_id"]
    # Among cards the online store holds fresh rows for: the sample is about a known card.
    eur = tx[
        (tx["currency"] == "EUR")
        & (tx["merchant_country"] == tx["card_home_country"])
        & ~tx["card_id"].isin(defrauded)
        & tx["card_id"].isin(cards.index)
    ]
    hour = pd.to_datetime(eur["timestamp"], utc=True).dt.hour
    now = eur[((hour - time.gmtime().tm_hour) % 24).isin([23, 0, 1])]
    card = str((now if len(now) else eur)["card_id"].value_counts().index[0])
    mine = eur[eur["card_id"] == card]
    home_merchant = str(mine["merchant_id"].value_counts().index[0])
    typical = int(mine.loc[mine["merchant_id"] == home_merchant, "amount_minor"].median())
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


_COLOUR = {"APPROVE": "green", "REVIEW": "yellow", "DECLINE": "red"}


def _print_answer(console: Console, response: scoring_pb2.ScoreResponse) -> None:
    decision = client.DECISION_NAMES.get(response.decision, "UNSPECIFIED")
    summary, *reasons = client.describe(response).splitlines()
    console.print(f"  [{_COLOUR.get(decision, 'white')}]{summary}[/]", highlight=False)
    console.print("\n".join(reasons) + "\n", highlight=False)


def _print_refusal(
    console: Console, error: grpc.RpcError, lead: str = "  ", end: str = "\n"
) -> None:
    """A call that got no answer (late or refused): said, and the demo goes on."""
    console.print(f"{lead}[yellow]{error.code().name}[/]: {error.details()}", end=end)


def run(
    config: MeshConfig, console: Console, credentials: client.Credentials = client.PLAINTEXT
) -> None:
    """Sends every sample through Envoy and prints each answer under what was expected;
    then, when the loop runs, the live attack and payments the model holds for review; and
    where the console runs, its address."""
    console.rule("sample transactions through Envoy")
    for sample in samples(config):
        console.print(f"[bold]{sample.label}[/]  (expected: {sample.expect})")
        try:
            response = client.score(config.envoy_target, sample.request(), credentials=credentials)
        except grpc.RpcError as error:
            _print_refusal(console, error, end="\n\n")
            continue
        _print_answer(console, response)
    held: list[str] = []
    if config.live_loop:
        live_attack(config, console, credentials)
        held = held_for_review(config, console, credentials)
    if config.observability:
        waiting = (
            f"the {len(held)} payments held for review above wait there for an analyst's "
            "verdict (within seconds, once the decision log has them)"
            if held
            else "REVIEW decisions wait there for an analyst's verdict"
        )
        console.print(
            f"[bold]console[/]: {config.console_url}/reviews — {waiting}; any decision: "
            f"{config.console_url}/decisions\n"
        )


BURST = 12
"""Tiny payments in the attack's burst."""


def _online_merchant(config: MeshConfig) -> str:
    """The merchant with the most card-not-present payments in the data (a web shop)."""
    data = FeatureStoreSettings(var_dir=config.var_dir).data_path
    tx = pd.read_parquet(data / layout.TRANSACTIONS_FILE, columns=["merchant_id", "channel"])
    online = tx[tx["channel"] == "card_not_present"]
    return str(online["merchant_id"].value_counts().index[0])


def _card_count(config: MeshConfig, card_id: str, merchant_id: str) -> float:
    target = f"{config.host}:{config.features_port}"
    with grpc.insecure_channel(target) as channel:
        reply = features_pb2_grpc.FeatureServiceStub(channel).GetFeatures(
            features_pb2.GetFeaturesRequest(card_id=card_id, merchant_id=merchant_id),
            timeout=2.0,
        )
    return next((f.value for f in reply.features if f.name == "card_txn_count_1h"), 0.0)


def live_attack(
    config: MeshConfig, console: Console, credentials: client.Credentials = client.PLAINTEXT
) -> None:
    """Card testing on a fresh card: a burst of tiny online payments, then a large one that
    the velocity features (updated by the live loop after each answer) make the model
    decline, then an analyst's fraud verdict reported for it."""
    console.rule("live attack: card testing on a fresh card")
    card = f"card-stolen-{uuid.uuid4().hex[:8]}"
    merchant = _online_merchant(config)
    console.print(
        f"[bold]{BURST} payments of 0.99 EUR, card not present[/] on {card} at {merchant}"
    )
    target = config.envoy_target
    answered = 0
    for i in range(1, BURST + 1):
        sample = client.Sample("burst", card, merchant, 99, card_not_present=True)
        try:
            response = client.score(target, sample.request(), credentials=credentials)
        except grpc.RpcError as error:  # said and passed over: the attack goes on
            _print_refusal(console, error, lead=f"  {i:2d}. ")
            continue
        answered += 1
        decision = client.DECISION_NAMES.get(response.decision, "UNSPECIFIED")
        # The model sees the card's earlier payments as they happen: the live loop updated
        # its velocity features after each answer.
        velocity = next((r for r in response.reasons if "in the last hour" in r), "")
        console.print(
            f"  {i:2d}. [{_COLOUR.get(decision, 'white')}]{decision:<7}[/] "
            f"score={response.score:.3f}  {velocity}",
            highlight=False,
        )
    start = time.monotonic()
    while _card_count(config, card, merchant) < answered and time.monotonic() - start < 10:
        time.sleep(0.005)
    seen = _card_count(config, card, merchant)
    console.print(
        f"the feature service counts {seen:.0f} payments on the card in the last hour, "
        f"{(time.monotonic() - start) * 1000:.0f} ms after the last answer\n"
    )
    large = client.Sample("large", card, merchant, 180_000, card_not_present=True, expect="DECLINE")
    request = large.request()
    console.print("[bold]then 1,800 EUR, card not present[/]  (expected: DECLINE)")
    try:
        response = client.score(target, request, credentials=credentials)
    except grpc.RpcError as error:
        _print_refusal(console, error, end="\n\n")
        return
    _print_answer(console, response)
    reply = client.report_outcome(
        target,
        request.transaction_id,
        outcomes_pb2.OUTCOME_FRAUD,
        outcomes_pb2.OUTCOME_SOURCE_ANALYST,
        credentials=credentials,
    )
    console.print(
        f"[bold]outcome reported[/]: {request.transaction_id} is FRAUD (analyst), "
        f"event {reply.event_id} on the log; the merchant's fraud rate counts it once "
        "the label delay has passed, as in training\n"
    )


HELD = 3
"""Payments the demo has the model hold for review."""
_GROWING_AMOUNTS = tuple(int(500 * 1.6**i) for i in range(16))
"""5 EUR to about 5,600 EUR: somewhere on the way the model stops approving."""


def _risky_merchants(config: MeshConfig, count: int = 6) -> list[str]:
    """The merchants with the highest 28-day fraud rates in the data."""
    data = FeatureStoreSettings(var_dir=config.var_dir).data_path
    merchants = _latest(pd.read_parquet(data / layout.MERCHANT_FEATURES_FILE), "merchant_id")
    return [str(m) for m in merchants.nlargest(count, "merchant_fraud_rate_28d").index]


def held_for_review(
    config: MeshConfig,
    console: Console,
    credentials: client.Credentials = client.PLAINTEXT,
    wanted: int = HELD,
) -> list[str]:
    """Online payments of growing amounts on fresh cards at high-fraud merchants, until the
    model has held ``wanted`` of them for review (the ones an analyst then judges); their
    transaction ids. Bounded: 16 amounts at each of 6 merchants."""
    console.rule("payments held for review")
    console.print(
        "[bold]online payments of growing amounts on new cards at high-fraud merchants[/], "
        f"until the model holds {wanted} for an analyst"
    )
    held: list[str] = []
    sent = 0
    for merchant in _risky_merchants(config):
        card = f"card-new-{uuid.uuid4().hex[:8]}"
        for amount in _GROWING_AMOUNTS:
            sample = client.Sample("held", card, merchant, amount, card_not_present=True)
            sent += 1
            try:
                response = client.score(
                    config.envoy_target, sample.request(), timeout_s=2.0, credentials=credentials
                )
            except grpc.RpcError as error:  # said and passed over: the demo goes on
                _print_refusal(console, error)
                continue
            if response.decision != scoring_pb2.DECISION_REVIEW:
                continue
            held.append(response.transaction_id)
            console.print(
                f"  [yellow]REVIEW[/]  {response.transaction_id}  {amount / 100:,.2f} EUR  "
                f"{card} at {merchant}  score={response.score:.3f}",
                highlight=False,
            )
            if len(held) == wanted:
                break
        if len(held) == wanted:
            break
    console.print(f"{len(held)} held for review in {sent} payments\n")
    return held
