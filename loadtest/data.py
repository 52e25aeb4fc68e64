"""Request data for load tests, drawn from the simulated population, written as ghz data files.

The mix is what a scoring service sees in production, in proportions set by ``Mix``:

- **known**: a card scoring at a merchant it has paid before, with one of its own amounts,
  currency and channel (the online store has both entities);
- **unknown**: a card the store has never seen, at a real merchant (features default);
- **fraud-like**: the card, merchant, amount and channel of a simulated fraud (compromised
  cards, card-testing bursts of tiny amounts, compromised terminals, odd-hour highs,
  geo mismatch), so the model and the rules have something to decline.

Timestamps must be "now" when the call is made: the gateway refuses transactions more than
5 minutes ahead or 7 days old. Two ways, chosen by ``stamp``:

- ``"now"`` (what the runner uses): the file is written right before each run with the
  current time in every request; ghz then parses the JSON once and caches the messages,
  which keeps the load generator cheap. A run of a few minutes stays well inside the window.
- ``"template"``: every timestamp is ghz's ``{{.Timestamp}}`` (the call's own time, RFC 3339)
  and every transaction id carries ``{{.RequestNumber}}``, so a file stays valid forever
  (for ``ghz --config loadtest/ghz/score.json`` by hand). ghz then renders and parses each
  request per call, which costs it CPU at high rates.

Three builders share one sample of the population (``sample_population``): ``score_requests``
(public ``Score``), ``feature_requests`` (``GetFeatures``) and ``infer_requests``
(``ModelInfer``, the exact feature vectors the gateway would send, from the latest feature
rows). ``write_data_file`` writes any of them for ghz.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from google.protobuf import json_format

from services.domain import featurespec
from services.featurestore import layout
from services.models import repository
from services.models.lifecycle import ModelLifecycle
from services.models.v2 import RowRequests

Stamp = Literal["now", "template"]
"""How request timestamps are set: fixed at writing time, or per call by ghz."""

TEMPLATE_TIMESTAMP = "{{.Timestamp}}"
"""ghz's call-time template (RFC 3339), accepted as a google.protobuf.Timestamp in JSON."""


@dataclass(frozen=True)
class Mix:
    """Shares of the request kinds; they need not sum to 1 (they are normalized)."""

    known: float = 0.85
    unknown: float = 0.10
    fraud: float = 0.05

    def counts(self, n: int) -> tuple[int, int, int]:
        """How many of ``n`` requests are known, unknown and fraud-like."""
        total = self.known + self.unknown + self.fraud
        if total <= 0 or min(self.known, self.unknown, self.fraud) < 0:
            raise ValueError(f"mix shares must be non-negative with a positive sum: {self}")
        unknown = round(n * self.unknown / total)
        fraud = round(n * self.fraud / total)
        return n - unknown - fraud, unknown, fraud


@dataclass(frozen=True)
class Txn:
    """One sampled transaction to send; ``kind`` is known, unknown or fraud."""

    kind: str
    card_id: str
    merchant_id: str
    amount_minor: int
    currency: str
    card_not_present: bool


def sample_population(
    data_dir: Path, n: int = 2000, mix: Mix | None = None, seed: int = 7
) -> list[Txn]:
    """``n`` transactions in the ``mix`` proportions, shuffled, from ``transactions.parquet``.

    Known and fraud-like rows come from the last 30 days of the simulated data, so their
    cards and merchants are in the online store; unknown cards are new ids at real merchants
    with amounts drawn from the legitimate population.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    path = data_dir / layout.TRANSACTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: run `fraudmesh features simulate` (or `make data`)")
    columns = ["timestamp", "card_id", "merchant_id", "amount_minor", "currency", "channel"]
    tx = pd.read_parquet(path, columns=[*columns, "is_fraud"])
    recent = tx[tx["timestamp"] >= tx["timestamp"].max() - pd.Timedelta(days=30)]
    legit = recent[~recent["is_fraud"]]
    fraud = recent[recent["is_fraud"]]
    if fraud.empty:
        fraud = tx[tx["is_fraud"]]
    rng = np.random.default_rng(seed)
    n_known, n_unknown, n_fraud = (Mix() if mix is None else mix).counts(n)

    def rows(frame: pd.DataFrame, k: int) -> pd.DataFrame:
        if k == 0 or frame.empty:
            return frame.iloc[:0]
        return frame.iloc[rng.integers(0, len(frame), size=k)]

    out: list[Txn] = []
    for kind, frame in (("known", rows(legit, n_known)), ("fraud", rows(fraud, n_fraud))):
        out += [
            Txn(kind, c, m, int(a), cur, ch == "card_not_present")
            for c, m, a, cur, ch in zip(
                frame["card_id"],
                frame["merchant_id"],
                frame["amount_minor"],
                frame["currency"],
                frame["channel"],
                strict=True,
            )
        ]
    for i, row in enumerate(rows(legit, n_unknown).itertuples(index=False)):
        out.append(
            Txn(
                "unknown",
                f"card-unknown-{i:06d}",
                str(row.merchant_id),
                int(row.amount_minor),
                str(row.currency),
                bool(row.channel == "card_not_present"),
            )
        )
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def _rfc3339(epoch_s: float) -> str:
    return (
        datetime.fromtimestamp(epoch_s, UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )


def _stamp(stamp: Stamp, now_s: float | None) -> str:
    if stamp == "template":
        return TEMPLATE_TIMESTAMP
    return _rfc3339(time.time() if now_s is None else now_s)


def score_requests(
    population: Sequence[Txn], stamp: Stamp = "now", now_s: float | None = None
) -> list[dict[str, Any]]:
    """``fraud.v1.ScoreRequest`` messages (proto JSON) for the population."""
    ts = _stamp(stamp, now_s)
    run = f"{int(time.time()):x}"
    requests = []
    for i, t in enumerate(population):
        tx_id = f"lt-{run}-{i}" if stamp == "now" else f"lt-{i}-{{{{.RequestNumber}}}}"
        requests.append(
            {
                "transaction_id": tx_id,
                "card_id": t.card_id,
                "merchant_id": t.merchant_id,
                "amount_minor": str(t.amount_minor),
                "currency": t.currency,
                "timestamp": ts,
                "channel": "CHANNEL_CARD_NOT_PRESENT"
                if t.card_not_present
                else "CHANNEL_CARD_PRESENT",
            }
        )
    return requests


def feature_requests(
    population: Sequence[Txn], stamp: Stamp = "now", now_s: float | None = None
) -> list[dict[str, Any]]:
    """``fraud.v1.GetFeaturesRequest`` messages (proto JSON) for the population."""
    ts = _stamp(stamp, now_s)
    return [{"card_id": t.card_id, "merchant_id": t.merchant_id, "as_of": ts} for t in population]


def latest_store_rows(data_dir: Path) -> dict[tuple[str, str], dict[str, float]]:
    """Per (kind, id), the newest store feature values: what the online store holds."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for kind, file, key, names in (
        ("card", layout.CARD_FEATURES_FILE, "card_id", featurespec.CARD_FEATURES),
        ("merchant", layout.MERCHANT_FEATURES_FILE, "merchant_id", featurespec.MERCHANT_FEATURES),
    ):
        frame = pd.read_parquet(data_dir / file, columns=[key, "event_timestamp", *names])
        latest = frame.sort_values("event_timestamp").drop_duplicates(key, keep="last")
        for record in latest.to_dict("records"):
            out[(kind, str(record[key]))] = {n: float(record[n]) for n in names}
    return out


def model_vectors(
    population: Sequence[Txn],
    data_dir: Path,
    metadata: repository.ModelMetadata,
    now_s: float | None = None,
) -> list[list[float]]:
    """The model input the gateway would build for each transaction, scored now."""
    store = latest_store_rows(data_dir)
    now = time.time() if now_s is None else now_s
    defaults = dict(metadata.default_features)
    vectors = []
    for t in population:
        values: dict[str, float | None] = {}
        values.update(store.get(("card", t.card_id), {}))
        values.update(store.get(("merchant", t.merchant_id), {}))
        vectors.append(
            featurespec.model_vector(
                values,
                amount_minor=t.amount_minor,
                currency=t.currency,
                timestamp_s=now,
                card_not_present=t.card_not_present,
                defaults=defaults,
            )
        )
    return vectors


def infer_requests(
    vectors: Sequence[Sequence[float]],
    model_name: str,
    model_version: str = "",
    input_name: str = "input",
    outputs: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``inference.ModelInferRequest`` messages (proto JSON), one FP32 [1, n] row each, as
    ``raw_input_contents`` (little-endian bytes, base64 in JSON) like the gateway sends.

    Leave ``outputs`` empty to compare servers whose output names differ (every server then
    returns its default outputs)."""
    builder = RowRequests(model_name, model_version, input_name, len(vectors[0]) if vectors else 0)
    requests = []
    for vector in vectors:
        message = builder.request(list(vector))
        for name in outputs:
            message.outputs.add(name=name)
        requests.append(json_format.MessageToDict(message, preserving_proto_field_name=True))
    return requests


def write_data_file(path: Path, requests: Sequence[Mapping[str, Any]]) -> Path:
    """Writes ghz's data file: a JSON array of messages, sent round robin."""
    if not requests:
        raise ValueError("no requests to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(list(requests), separators=(",", ":")))
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class DataFiles:
    """The three ghz data files of one run."""

    score: Path
    features: Path
    infer: Path


def write_all(
    out_dir: Path,
    data_dir: Path,
    model_root: Path,
    *,
    n: int = 2000,
    mix: Mix | None = None,
    stamp: Stamp = "now",
    seed: int = 7,
) -> DataFiles:
    """Writes ``score.json``, ``features.json`` and ``infer.json`` into ``out_dir`` from one
    population sample and the live model version."""
    population = sample_population(data_dir, n, mix, seed)
    live = ModelLifecycle(model_root).read().routing.live
    metadata, _ = repository.load(model_root, repository.DEFAULT_MODEL_NAME, live)
    now = time.time()
    return DataFiles(
        score=write_data_file(out_dir / "score.json", score_requests(population, stamp, now)),
        features=write_data_file(
            out_dir / "features.json", feature_requests(population, stamp, now)
        ),
        infer=write_data_file(
            out_dir / "infer.json",
            infer_requests(
                model_vectors(population, data_dir, metadata, now),
                metadata.name,
                metadata.version,
                metadata.input_name,
                (metadata.output_name,),
            ),
        ),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtest.data``: writes the ghz data files (template timestamps by default,
    so the committed ghz configs can be used by hand at any time)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=Path("loadtest/data"))
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--stamp", choices=["now", "template"], default="template")
    args = parser.parse_args(argv)
    files = write_all(
        args.out, args.var_dir / "data", args.var_dir / "models", n=args.n, stamp=args.stamp
    )
    print(f"wrote {files.score}, {files.features}, {files.infer}")


if __name__ == "__main__":
    main()
