"""Who is using the console: the subject of a verified token, or, without authentication, the
name an analyst types in.

With ``FRAUD_EDGE_AUTH=jwt`` the console accepts exactly the tokens the edge accepts: signed by
a key of the edge's JSON Web Key Set, with its issuer and audience, unexpired. The token comes
in the ``Authorization: Bearer`` header (set by the organisation's sign-in proxy in front of the
console, or by any client). Its ``sub`` is the identity a verdict records, and the token itself
goes with the verdict to the edge, which checks it again and limits calls per subject.

Who may change what: everyone who may open the console may view every page and give
verdicts (an analyst). Changing the fraud team's controls (lists, the live policy) needs
more: with tokens, the controls role (``FRAUD_CONSOLE_CONTROLS_ROLE``) among the token's
``roles`` claim; without tokens, a console on loopback, where whoever reaches it could run
``fraudmesh lists`` and ``fraudmesh rules`` on the same machine anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jwt

from services.domain.validation import id_problem

ANALYST_COOKIE = "console-analyst"
"""Remembers the name typed in, without authentication (a convenience, not an identity)."""
ALGORITHMS = ("ES256", "RS256")
"""Signature algorithms accepted (those the edge's identity providers use)."""
ROLES_CLAIM = "roles"
"""The token claim listing the subject's roles (a list of strings)."""
MAX_ROLES = 64
"""Most roles read from one token; more are ignored."""


class Unauthenticated(Exception):
    """No valid token: the message says what was wrong, never the token."""


@dataclass(frozen=True)
class Principal:
    """The person behind a request."""

    name: str
    """Recorded as ``reported_by`` with a verdict."""
    token: str | None = None
    """The bearer token that proved it (None without authentication)."""
    verified: bool = False
    """True when ``name`` comes from a verified token, not from what was typed in."""
    roles: frozenset[str] = frozenset()
    """The verified token's roles (none without authentication)."""


def controls_refusal(
    principal: Principal | None, controls_role: str, unauthenticated_may_change: bool
) -> str | None:
    """Why ``principal`` may not change the controls, or None when they may."""
    if principal is None:
        return "give your name before your first change"
    if principal.verified:
        if controls_role in principal.roles:
            return None
        held = ", ".join(sorted(principal.roles)[:8]) or "none"
        return (
            f"changing the controls needs the role {controls_role!r} in your token's "
            f"{ROLES_CLAIM!r} claim (yours: {held}); you may view them"
        )
    if unauthenticated_may_change:
        return None
    return (
        "without sign-in the controls may be changed on a loopback console only; you may view them"
    )


def _roles(claims: dict[str, object]) -> frozenset[str]:
    """The ``roles`` claim's strings; anything else in it gives no role (view only)."""
    value = claims.get(ROLES_CLAIM)
    if not isinstance(value, list):
        return frozenset()
    return frozenset(
        r for r in value[:MAX_ROLES] if isinstance(r, str) and 0 < len(r) <= 128 and r.isprintable()
    )


def analyst_name_problem(name: str) -> str | None:
    """What is wrong with a typed-in analyst name (the outcome API's ``reported_by`` rule)."""
    return id_problem(name.strip(), required=True)


class TokenVerifier:
    """Verifies bearer tokens against a JSON Web Key Set file, an issuer and an audience."""

    def __init__(self, jwks_path: Path, issuer: str, audience: str) -> None:
        self._keys = jwt.PyJWKSet.from_dict(json.loads(jwks_path.read_text()))
        self._issuer = issuer
        self._audience = audience

    def principal(self, authorization: str | None) -> Principal:
        """The verified subject of an ``Authorization`` header; raises Unauthenticated."""
        if not authorization:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer …)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header is not a bearer token")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = next((k for k in self._keys.keys if k.key_id == kid), None)
            if key is None:
                raise Unauthenticated("the token is signed by an unknown key")
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=list(ALGORITHMS),
                audience=self._audience,
                issuer=self._issuer,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise Unauthenticated(f"the token is not valid: {error}") from None
        subject = str(claims["sub"])
        problem = id_problem(subject)
        if problem is not None:
            raise Unauthenticated(f"the token's subject {problem}")
        return Principal(subject, token=token, verified=True, roles=_roles(claims))
