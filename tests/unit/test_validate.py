"""Input validation names the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.gateway.validate import Limits, validate

NOW = 1_800_000_000.0


def _tx(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "transaction_id": "t-1",
        "card_id": "card-1",
        "merchant_id": "m-1",
        "amount_minor": 1250,
        "currency": "EUR",
        "timestamp_s": NOW,
        "terminal_id": "",
        "card_not_present": False,
        "now_s": NOW,
        "limits": Limits(),
    }
    fields.update(overrides)
    return fields


def test_valid_transaction_passes() -> None:
    tx = validate(**_tx())
    assert tx.amount_minor == 1250
    assert tx.currency == "EUR"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"transaction_id": ""}, "transaction_id"),
        ({"card_id": ""}, "card_id"),
        ({"merchant_id": ""}, "merchant_id"),
        ({"card_id": "x" * 129}, "card_id"),
        ({"merchant_id": "bad\nid"}, "merchant_id"),
        ({"terminal_id": "t" * 200}, "terminal_id"),
        ({"amount_minor": -5}, "amount_minor"),
        ({"amount_minor": 10**14}, "amount_minor"),
        ({"currency": "XYZ"}, "currency"),
        ({"currency": "eur"}, "currency"),
        ({"currency": ""}, "currency"),
        ({"timestamp_s": None}, "timestamp"),
        ({"timestamp_s": NOW + 3600}, "timestamp"),
        ({"timestamp_s": NOW - 30 * 86_400}, "timestamp"),
    ],
)
def test_invalid_field_is_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate(**_tx(**overrides))
    assert caught.value.field == field
    assert caught.value.code == "INVALID_ARGUMENT"
    assert str(caught.value).startswith(field)


def test_a_zero_amount_is_an_account_verification_not_an_error() -> None:
    assert validate(**_tx(amount_minor=0)).amount_minor == 0
    with pytest.raises(InvalidArgument, match="must not be negative"):
        validate(**_tx(amount_minor=-1))


def test_small_clock_skew_is_tolerated() -> None:
    validate(**_tx(timestamp_s=NOW + 60))


def test_amount_limit_uses_currency_exponent() -> None:
    # 1,000,000 JPY is ~6,000 EUR: plausible; the same digits in EUR cents are 10,000 EUR.
    validate(**_tx(amount_minor=1_000_000, currency="JPY"))
    with pytest.raises(InvalidArgument):
        validate(**_tx(amount_minor=200_000_000, currency="EUR"))
