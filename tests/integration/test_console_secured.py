"""The console behind the edge's TLS and tokens (``fraudmesh up --tls --auth jwt``): HTTPS with the
edge's certificate, no page without a token the edge would accept, and a verdict recorded under
the token's subject, sent to the edge with the analyst's own token."""

from __future__ import annotations

import http.cookiejar
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services import client
from services.cli import certs
from services.common.edge_security import DEV_FILES, EdgeSettings
from services.domain.lists import ListEntry
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh

from .live import copy_state, start_live_mesh, wait_for
from .test_console import hold_payments, outcome_of

pytestmark = pytest.mark.integration

SUBJECT = "ana@bank.example"


@pytest.fixture(scope="module")
def secured(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh whose edge takes TLS only and tokens, with the console, on its own state."""
    var_dir = copy_state(prepared_env.var_dir, tmp_path_factory.mktemp("secured-var"))
    certs.write_dev_credentials(var_dir / "tls")
    edge = EdgeSettings(var_dir=var_dir, tls=True, auth="jwt")
    mesh = start_live_mesh(var_dir, var_dir / "logs", observability=True, edge=edge)
    yield mesh
    mesh.stop()


def _token(mesh: Mesh, subject: str = SUBJECT, roles: tuple[str, ...] = ()) -> str:
    return certs.mint_token(
        mesh.config.var_dir / "tls" / DEV_FILES["jwt_key"], subject, roles=roles
    )


class Browser:
    """An HTTPS client that trusts the development CA and keeps cookies, like a browser."""

    def __init__(self, mesh: Mesh, token: str | None) -> None:
        context = ssl.create_default_context(cafile=mesh.config.var_dir / "tls" / DEV_FILES["ca"])
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=context),
            urllib.request.HTTPCookieProcessor(self.jar),
        )
        self.base = mesh.config.console_url
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str) -> tuple[int, str]:
        request = urllib.request.Request(self.base + path, headers=self.headers)
        try:
            with self.opener.open(request, timeout=10) as reply:
                return int(reply.status), reply.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()

    def post(self, path: str, fields: dict[str, str]) -> int:
        headers = {**self.headers, "origin": self.base}
        request = urllib.request.Request(
            self.base + path, data=urllib.parse.urlencode(fields).encode(), headers=headers
        )
        try:
            with self.opener.open(request, timeout=10) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as error:
            return int(error.code)


def test_the_console_serves_https_only_to_valid_tokens(secured: Mesh) -> None:
    assert secured.config.console_url.startswith("https://")
    assert Browser(secured, None).get("/reviews")[0] == 401
    assert Browser(secured, "not-a-token").get("/reviews")[0] == 401
    status, page = Browser(secured, _token(secured)).get("/reviews")
    assert status == 200 and SUBJECT in page and "(signed in)" in page
    plain = secured.config.console_url.replace("https://", "http://")
    with pytest.raises(OSError):  # no plaintext HTTP beside the TLS listener
        urllib.request.urlopen(plain + "/healthz", timeout=5)


def test_a_verdict_is_recorded_under_the_tokens_subject(secured: Mesh, tmp_path: Path) -> None:
    credentials = client.Credentials(
        tls=True,
        ca_path=secured.config.var_dir / "tls" / DEV_FILES["ca"],
        token=_token(secured, "payments-client"),
    )
    (tid,) = hold_payments(secured, 1, credentials)
    browser = Browser(secured, _token(secured))
    wait_for(
        lambda: f'data-transaction-id="{tid}"' in browser.get("/reviews")[1],
        "the held payment in the queue",
        timeout_s=60,
    )
    _, page = browser.get("/reviews")
    token = page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    fields = {"transaction_id": tid, "verdict": "fraud", "csrf_token": token}
    assert browser.post("/reviews/verdict", fields) == 200  # after the 303 to the queue
    found: dict[str, Any] = {}

    def landed() -> bool:
        found.update(outcome_of(secured, tmp_path, tid) or {})
        return bool(found)

    wait_for(landed, "the verdict in the export", timeout_s=60)
    assert (found["outcome"], found["outcome_source"]) == ("fraud", "analyst")
    assert found["outcome_reported_by"] == SUBJECT


def _entries(mesh: Mesh) -> list[ListEntry]:
    store = open_lists(FeatureStoreSettings(var_dir=mesh.config.var_dir), reader=True)
    if store is None:
        return []
    try:
        return store.entries()[1]
    finally:
        store.close()


def test_only_the_controls_role_changes_the_lists(secured: Mesh) -> None:
    entry = {"list": "block", "kind": "card", "value": "card-role-check", "reason": "stolen"}
    analyst = Browser(secured, _token(secured))
    status, page = analyst.get("/lists")
    assert status == 200 and 'action="/lists/add"' not in page and 'id="view-only"' in page
    token = page.split('"x-csrf-token": "', 1)[1].split('"', 1)[0]
    assert analyst.post("/lists/add", {**entry, "csrf_token": token}) == 403
    assert all(e.value != entry["value"] for e in _entries(secured))
    lead = Browser(secured, _token(secured, "lead@bank.example", ("fraud-controls",)))
    _, page = lead.get("/lists")
    token = page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    assert lead.post("/lists/add", {**entry, "csrf_token": token}) == 200
    added = [e for e in _entries(secured) if e.value == entry["value"]]
    assert [(e.actor, e.reason) for e in added] == [("lead@bank.example", "stolen")]
