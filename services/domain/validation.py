"""Checks of identifiers and codes that every public API applies the same way.

Each check raises ``InvalidArgument`` naming the field. Values echoed back in a message
are cut to ``ECHO_LIMIT`` characters: an attacker's 100 KB string must not travel back in
a gRPC status header.
"""

from __future__ import annotations

from services.common.errors import InvalidArgument
from services.domain import money

MAX_ID_LENGTH = 128
"""Longest accepted identifier (transaction, card, merchant, terminal)."""

ECHO_LIMIT = 32
"""Longest part of a client's value repeated in an error message."""


def shown(value: str | bytes, limit: int = ECHO_LIMIT) -> str:
    """``value`` quoted for an error message, cut to ``limit`` characters (bytes: bytes).

    ``repr`` escapes control characters, so a client's value cannot break a log line or
    smuggle a header separator either.
    """
    if len(value) <= limit:
        return repr(value)
    unit = "bytes" if isinstance(value, bytes) else "characters"
    return f"{value[:limit]!r}… ({len(value)} {unit})"


def id_problem(value: str, required: bool = True) -> str | None:
    """What is wrong with an identifier (``check_id``'s rule), or None when it is fine."""
    if not value:
        return "is required" if required else None
    if len(value) > MAX_ID_LENGTH:
        return f"is longer than {MAX_ID_LENGTH} characters"
    if not value.isprintable():
        return "contains non-printable characters"
    return None


def check_id(field: str, value: str, required: bool = True) -> None:
    """An identifier: present (when required), at most ``MAX_ID_LENGTH`` printable characters."""
    problem = id_problem(value, required)
    if problem is not None:
        raise InvalidArgument(field, problem)


def check_currency(field: str, value: str) -> None:
    """An active ISO 4217 alphabetic code, upper case."""
    if not money.is_known(value):
        raise InvalidArgument(field, f"{shown(value)} is not an ISO 4217 currency code")
