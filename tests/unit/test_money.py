"""Money: minor units of ISO 4217 currencies and the fixed EUR rates."""

from __future__ import annotations

import pytest

from services.domain import money


@pytest.mark.parametrize(
    ("amount_minor", "currency", "eur"),
    [
        (1234, "EUR", 12.34),
        (1000, "USD", 9.2),
        (1000, "GBP", 11.7),
        (2500, "CHF", 26.25),
        (10_000, "SEK", 8.7),
        (1000, "JPY", 6.1),  # no minor unit
        (1000, "KWD", 3.0),  # three decimals
        (1234, "NGN", 12.34),  # valid ISO 4217, no rate: fallback rate 1.0, ISO exponent
        (1234, "JOD", 1.234),  # fallback rate, ISO exponent 3
        (1234, "XXZ", 12.34),  # unknown everywhere: fallback exponent 2
    ],
)
def test_amount_eur(amount_minor: int, currency: str, eur: float) -> None:
    assert money.amount_eur(amount_minor, currency) == pytest.approx(eur)


def test_every_rate_is_for_an_iso_currency() -> None:
    assert set(money.EUR_PER_UNIT) <= set(money.EXPONENT)
    for code in ("EUR", "USD", "GBP", "CHF", "SEK", "JPY"):
        assert code in money.EUR_PER_UNIT


def test_minor_units() -> None:
    assert money.minor_per_major("EUR") == 100.0
    assert money.minor_per_major("JPY") == 1.0
    assert money.minor_per_major("KWD") == 1000.0
    assert money.minor_per_major("XXZ") == 100.0
    assert money.is_known("EUR")
    assert not money.is_known("eur")
    assert not money.is_known("XXZ")
