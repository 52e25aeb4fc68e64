"""CSRF protection of the console's state-changing requests: a signed double-submit token.

Each browser gets a random value in an HttpOnly, SameSite=Strict cookie; the pages embed an
HMAC of that value under the console's key in every form (and in a header for htmx requests).
A POST is accepted only when its token is the HMAC of the cookie it carries: another site can
make a browser send the cookie, but cannot read it or the page, so it cannot produce the token;
and without the key a token cannot be made for a cookie planted from a sibling subdomain.
A cross-site ``Origin`` or ``Sec-Fetch-Site`` is refused outright as a second line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

COOKIE = "console-csrf"
"""The cookie holding the browser's random value."""
FIELD = "csrf_token"
"""The form field carrying the token."""
HEADER = "x-csrf-token"
"""The header carrying the token (htmx requests)."""
SAFE_FETCH_SITES = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` values of a request the console's own pages (or the user) made."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Csrf:
    """Mints and checks tokens under one key."""

    key: bytes

    @classmethod
    def with_key(cls, key: str | None) -> Csrf:
        """A checker under ``key``, or under a random one when None."""
        return cls(key.encode() if key else secrets.token_bytes(32))

    @staticmethod
    def new_cookie() -> str:
        """A fresh random cookie value."""
        return secrets.token_urlsafe(32)

    def token(self, cookie: str) -> str:
        """The token that goes with ``cookie``."""
        return _b64(hmac.new(self.key, cookie.encode(), hashlib.sha256).digest())

    def refusal(
        self,
        cookie: str | None,
        token: str | None,
        headers: Mapping[str, str],
        own_origin: str,
    ) -> str | None:
        """Why a state-changing request must be refused, or None when it may proceed.
        ``headers`` are the request's (lower-case names); ``own_origin`` is
        ``scheme://host[:port]`` as the browser addressed the console."""
        site = headers.get("sec-fetch-site")
        if site is not None and site not in SAFE_FETCH_SITES:
            return f"the request came from another site (Sec-Fetch-Site: {site})"
        origin = headers.get("origin")
        # "null" (a sandboxed frame, a local file) is another origin too.
        if origin is not None and origin != own_origin:
            return "the request came from another origin"
        if not cookie:
            return "the browser sent no CSRF cookie: reload the page and try again"
        if not token:
            return "the request carries no CSRF token: reload the page and try again"
        if not hmac.compare_digest(self.token(cookie), token):
            return "the CSRF token does not match: reload the page and try again"
        return None
