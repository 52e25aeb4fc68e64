"""Money: ISO 4217 currencies, their minor units, and the fixed EUR rates features use.

Amounts travel as integers in minor units of their currency (``amount_minor``); features
and plausibility limits compare them in EUR through the frozen rate table here, so that
training, serving and the live updater convert every amount the same way.
"""

from __future__ import annotations

# Active ISO 4217 alphabetic codes with two minor-unit digits.
_TWO = (
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BOV BRL BSD BTN "
    "BWP BYN BZD CAD CDF CHE CHF CHW CNY COP COU CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB "
    "EUR FJD FKP GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF IDR ILS INR IRR JMD KES KGS "
    "KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN "
    "MXV MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB SAR SBD "
    "SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD TWD TZS "
    "UAH USD USN UZS VED VES WST XCD XCG YER ZAR ZMW ZWG"
).split()
_ZERO = "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF".split()
_THREE = "BHD IQD JOD KWD LYD OMR TND".split()
_FOUR = "CLF UYW".split()

EXPONENT: dict[str, int] = {
    **dict.fromkeys(_TWO, 2),
    **dict.fromkeys(_ZERO, 0),
    **dict.fromkeys(_THREE, 3),
    **dict.fromkeys(_FOUR, 4),
}
"""Minor-unit exponent of every active ISO 4217 currency code."""


def is_known(code: str) -> bool:
    """True when ``code`` is an active ISO 4217 alphabetic code (upper case)."""
    return code in EXPONENT


EUR_PER_UNIT: dict[str, float] = {
    "EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.05, "SEK": 0.087, "NOK": 0.086,
    "DKK": 0.134, "PLN": 0.232, "CZK": 0.040, "HUF": 0.0025, "RON": 0.201, "CAD": 0.68,
    "AUD": 0.61, "NZD": 0.56, "BRL": 0.17, "MXN": 0.050, "CNY": 0.127, "HKD": 0.118,
    "SGD": 0.69, "INR": 0.011, "THB": 0.026, "TRY": 0.027, "ZAR": 0.050, "AED": 0.25,
    "JPY": 0.0061, "KRW": 0.00067, "ISK": 0.0066, "KWD": 3.0, "BHD": 2.44,
}  # fmt: skip
"""Fixed conversion rates: EUR per major unit. Frozen so that features never move with markets."""

FALLBACK_EUR_PER_UNIT = 1.0
"""Rate for a valid currency missing from ``EUR_PER_UNIT``: a neutral guess, not a conversion."""

FALLBACK_EXPONENT = 2
"""Exponent for a code that is not an active ISO 4217 currency (the most common exponent)."""

# Minor units per major unit, precomputed so the request path does no exponentiation.
_MINOR_PER_MAJOR: dict[str, float] = {code: float(10**exp) for code, exp in EXPONENT.items()}
_FALLBACK_MINOR_PER_MAJOR = float(10**FALLBACK_EXPONENT)


def minor_per_major(currency: str) -> float:
    """Minor units in one major unit of ``currency`` (100.0 for EUR, 1.0 for JPY)."""
    return _MINOR_PER_MAJOR.get(currency, _FALLBACK_MINOR_PER_MAJOR)


def eur_per_unit(currency: str) -> float:
    """EUR value of one major unit of ``currency``; ``FALLBACK_EUR_PER_UNIT`` if unknown."""
    return EUR_PER_UNIT.get(currency, FALLBACK_EUR_PER_UNIT)


def amount_eur(amount_minor: int, currency: str) -> float:
    """Converts an amount in minor units of ``currency`` to EUR with the fixed rate table."""
    return (
        amount_minor
        / _MINOR_PER_MAJOR.get(currency, _FALLBACK_MINOR_PER_MAJOR)
        * EUR_PER_UNIT.get(currency, FALLBACK_EUR_PER_UNIT)
    )
