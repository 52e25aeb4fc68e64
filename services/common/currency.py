"""ISO 4217 currency codes and their minor-unit exponents."""

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
