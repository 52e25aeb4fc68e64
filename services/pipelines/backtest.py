"""The payments a backtest replays: the decision log joined with outcomes, or the imported
history the store was built from (``services.domain.backtest`` does the replay).

From the decision log, each transaction's first decision with its latest outcome and the
features it was decided on, by name (``services.decisionlog.payments``, re-exported here). From the history, the labelled transactions training reads, each with
its point-in-time store features from Feast (``training.frame.training_frame``) and the
request-time features computed as serving computes them; a store value missing there stays
missing (a rule on it does not fire), where serving would have used the version's default.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

from services.decisionlog.payments import BacktestSourceError
from services.domain import featurespec
from services.domain.backtest import FRAUD, LEGITIMATE, LoggedPayment
from services.featurestore.settings import FeatureStoreSettings
from services.pipelines.training.params import TrainingDataError

_NO_DEFAULTS: Mapping[str, float] = collections.defaultdict(lambda: math.nan)


def from_history(settings: FeatureStoreSettings) -> list[LoggedPayment]:
    """The imported transactions with their point-in-time features and labels; raises
    ``BacktestSourceError`` without a dataset, a registered feature service or labels."""
    # Feast is imported only for a backtest of the history.
    from services.pipelines.training.frame import training_frame

    try:
        frame = training_frame(settings)
    except TrainingDataError as error:
        raise BacktestSourceError(error.message) from error
    if "is_fraud" not in frame.columns:
        raise BacktestSourceError(f"the history in {settings.data_path} has no is_fraud labels")
    store_names = [n for n in featurespec.STORE_FEATURES if n in frame.columns]
    store = frame[store_names].to_dict("records")
    payments = []
    for i, row in enumerate(frame.itertuples(index=False)):
        values = featurespec.model_vector(
            store[i],
            amount_minor=int(row.amount_minor),
            currency=str(row.currency),
            timestamp_s=float(row.timestamp_s),
            card_not_present=bool(row.card_not_present),
            defaults=_NO_DEFAULTS,
            helpers=True,
        )
        terminal = getattr(row, "terminal_id", "")
        payments.append(
            LoggedPayment(
                transaction_id=str(row.transaction_id),
                card_id=str(row.card_id),
                merchant_id=str(row.merchant_id),
                terminal_id=terminal if isinstance(terminal, str) else "",
                amount_minor=int(row.amount_minor),
                currency=str(row.currency),
                card_not_present=bool(row.card_not_present),
                features=dict(zip(featurespec.SERVABLE_FEATURES, values, strict=False)),
                outcome=FRAUD if bool(row.is_fraud) else LEGITIMATE,
            )
        )
    return payments
