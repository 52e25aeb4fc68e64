"""The console's Rules and Lists pages through the whole ASGI application, on a policy folder
and a SQLite online store in a temporary folder: what they show, who may change what, and
hostile forms (no CSRF token, oversized, wrong types, bad values) refused naming the field
with nothing changed."""

from __future__ import annotations

import asyncio
import html
import re
import time
import urllib.parse
import uuid
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest

from fraud.v1 import events_pb2, outcomes_pb2
from services.cli import certs
from services.common.edge_security import DEV_FILES, EdgeSettings
from services.console import controls, identity
from services.console.app import MAX_BODY_BYTES, create
from services.console.settings import ConsoleSettings
from services.decisionlog import payments as logged
from services.domain import backtest, featurespec
from services.domain import policy as policy_domain
from services.domain.lists import ListEntry, ListKind, ListName
from services.eventlog import EventLogSettings, Record, open_consumer
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.models.policies import PolicyStore

from .test_decisionlog import decision, outcome, write_flush

POLICY = """
description: card-not-present limits
rules:
  - name: low-first
    action: review
    when: {currency: [EUR, GBP, USD, CHF, SEK, NOK, DKK, PLN]}
  - name: cnp-over-5000
    action: decline
    priority: 10
    reason: card not present over 5,000 EUR
    scope: {merchants: [merch-00001]}
    when: {channel: card_not_present, amount_eur: {gt: 5000, lte: 90000}}
  - name: watch
    action: review
    mode: shadow
    when: {features: {card_txn_count_1h: {gte: 5}}}
thresholds:
  - {merchants: [merch-00002, merch-00003], review: 0.1, decline: 0.4}
"""


class Client:
    """Requests through the ASGI application, keeping cookies as a browser does."""

    def __init__(self, app: Any, headers: dict[str, str] | None = None) -> None:
        self.app = app
        self.cookies: dict[str, str] = {}
        self.headers = headers or {}

    def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        path, _, query = path.partition("?")
        sent_headers = {"host": "127.0.0.1:8090", **self.headers, **(headers or {})}
        if self.cookies:
            sent_headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if body:
            sent_headers.setdefault("content-type", "application/x-www-form-urlencoded")
            sent_headers["content-length"] = str(len(body))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in sent_headers.items()],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8090),
        }
        sent: list[dict[str, Any]] = []
        chunks = [body[i : i + 16384] for i in range(0, len(body), 16384)] or [b""]

        async def receive() -> dict[str, Any]:
            if chunks:
                chunk = chunks.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        start = sent[0]
        got = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        for key, value in start["headers"]:
            if key.lower() == b"set-cookie":
                cookie = SimpleCookie(value.decode())
                self.cookies.update({k: m.value for k, m in cookie.items()})
        text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], got, text.decode()

    def get(self, path: str) -> tuple[int, str]:
        status, _, text = self.call("GET", path)
        return status, text

    def token(self, path: str = "/lists") -> str:
        page = self.get(path)[1]
        # Every page carries it for htmx, also one without a form.
        found = re.search(r'"x-csrf-token": "([^"]+)"', page)
        assert found, page[:500]
        return found.group(1)

    def post(self, path: str, fields: dict[str, str], csrf: bool = True) -> tuple[int, str]:
        if csrf:
            fields = {"csrf_token": self.token(), **fields}
        status, _, text = self.call("POST", path, urllib.parse.urlencode(fields).encode())
        return status, text


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def _app(folder: Path, host: str = "127.0.0.1", edge: EdgeSettings | None = None) -> Any:
    settings = ConsoleSettings(
        var_dir=folder, prometheus_url=None, host=host, allow_unauthenticated_remote=True
    )
    store = FeatureStoreSettings(var_dir=folder)
    return create(settings, edge or EdgeSettings(var_dir=folder), store=store)


def _changes(folder: Path) -> list[tuple[Record, events_pb2.ListChangeEvent]]:
    """The list changes audited on the state folder's event log."""
    settings = EventLogSettings(var_dir=folder, groups=())
    found = []
    with open_consumer(settings, f"audit-{uuid.uuid4().hex[:8]}") as consumer:
        while records := consumer.poll(100, 0.2):
            found += [(r, r.envelope().list_change) for r in records]
    return found


def _named(app: Any) -> Client:
    """A browser that gave its analyst name."""
    client = Client(app)
    status, _ = client.post("/analyst", {"analyst": "Ana Lyst", "next": "/lists"})
    assert status == 303
    return client


def _entries(folder: Path) -> list[ListEntry]:
    store = open_lists(FeatureStoreSettings(var_dir=folder), reader=True)
    if store is None:
        return []
    try:
        return store.entries()[1]
    finally:
        store.close()


# -- the Rules page ----------------------------------------------------------------------------


def test_the_rules_page_shows_the_live_policy_its_thresholds_and_history(folder: Path) -> None:
    store = PolicyStore(folder / "policy")
    store.publish(POLICY)
    store.promote("1", "ops@bank")
    store.publish("rules: []\n")
    store.promote("2", "ops@bank")
    store.rollback("ana@bank")
    store.publish("rules: []\n")
    client = _named(_app(folder))
    status, page = client.get("/rules")
    assert status == 200
    assert 'data-live="1" data-shown="1"' in page
    rows = re.findall(r'<tr data-rule="([^"]+)" data-mode="([^"]+)"', page)
    # Asked by priority, highest first, then as written.
    assert rows == [("cnp-over-5000", "live"), ("low-first", "live"), ("watch", "shadow")]
    assert (
        "<li>channel = card_not_present</li><li>amount_eur &gt; 5000 and &lt;= 90000</li>" in page
    )
    assert "merchants in merch-00001" in page and "all merchants" in page
    assert "currency in EUR, GBP, USD, CHF, SEK, NOK (+2 more)" in page
    assert "<li>feature card_txn_count_1h &gt;= 5</li>" in page
    assert "card not present over 5,000 EUR" in page and "review by rule low-first" in page
    assert '<tr data-merchants="merch-00002,merch-00003">' in page
    assert '0.100</td><td class="num">0.400' in page
    states = dict(re.findall(r'<tr data-version="(\d+)" data-state="([^"]+)"', page))
    assert states == {"1": "live", "2": "rolled back", "3": "candidate"}
    actions = re.findall(
        r'<tr data-action="(\w+)"><td>[^<]*</td><td>\w+</td><td>[^<]*</td><td>([^<]*)<', page
    )
    # Newest first: the last publish, then the rollback and who made it.
    assert [a for a, _ in actions[:2]] == ["publish", "rollback"]
    assert actions[1][1] == "ana@bank" and ("promote", "ops@bank") in actions
    assert "Roll back to no policy" in page
    other = client.get("/rules?version=3")[1]
    assert 'data-live="1" data-shown="3"' in other and "This version has no rules." in other


def test_without_a_policy_or_with_a_bad_version_the_rules_page_says_so(folder: Path) -> None:
    client = Client(_app(folder))
    status, page = client.get("/rules")
    assert status == 200 and "No policy is live: the model decides every payment." in page
    status, page = client.get("/rules?version=7")
    assert status == 400 and "no policy version 7" in page
    status, page = client.get("/rules?version=" + "x" * 5000)
    assert status == 400 and "is not a policy version number" in page
    PolicyStore(folder / "policy").publish(POLICY)
    PolicyStore(folder / "policy").promote("1")
    status, page = client.get("/rules?version=7")
    # The live version stays in view beside the problem.
    assert (
        status == 400 and "no policy version 7" in page and 'data-live="1" data-shown="1"' in page
    )
    (folder / "policy" / "state.json").write_text("{not json")
    status, page = client.get("/rules")
    assert status == 503 and "is not a policy state" in page and "No policy is live" not in page


def test_promote_and_rollback_from_the_console_record_who(folder: Path) -> None:
    store = PolicyStore(folder / "policy")
    store.publish(POLICY)
    client = _named(_app(folder))
    token = client.token("/rules")
    status, _ = client.post("/rules/promote", {"version": "1", "csrf_token": token}, csrf=False)
    assert status == 303 and store.read_state().live == "1"
    status, page = client.post("/rules/promote", {"version": "1", "csrf_token": token}, csrf=False)
    assert status == 409 and "already live" in page
    status, page = client.post("/rules/promote", {"version": "9", "csrf_token": token}, csrf=False)
    assert status == 400 and "no policy version 9" in page
    status, _ = client.post("/rules/rollback", {"csrf_token": token}, csrf=False)
    assert status == 303 and store.read_state().live is None
    status, page = client.post("/rules/rollback", {"csrf_token": token}, csrf=False)
    assert status == 409 and "nothing to roll back to" in page
    history = store.read_state().history
    assert [(c.action, c.actor) for c in history[1:]] == [
        ("promote", "Ana Lyst"),
        ("rollback", "Ana Lyst"),
    ]


def test_a_policy_written_in_the_console_is_published_as_a_candidate_or_refused_naming_field(
    folder: Path,
) -> None:
    store = PolicyStore(folder / "policy")
    client = _named(_app(folder))
    token = client.token("/rules")
    assert 'action="/rules/publish"' in client.get("/rules")[1]
    bad = POLICY.replace("{gt: 5000, lte: 90000}", "{gt: five thousand}")
    status, page = client.post("/rules/publish", {"policy": bad, "csrf_token": token}, csrf=False)
    assert status == 400
    assert "rule &#39;cnp-over-5000&#39;, field &#39;when.amount_eur.gt&#39;" in page, page[-800:]
    assert store.published() == []
    status, headers, _ = client.call(
        "POST",
        "/rules/publish",
        urllib.parse.urlencode({"policy": POLICY, "csrf_token": token}).encode(),
    )
    assert status == 303 and headers["location"] == "/rules?version=1"
    assert store.published() == ["1"] and store.read_state().live is None
    assert store.text("1") == POLICY.strip()
    assert [(c.action, c.version, c.actor) for c in store.read_state().history] == [
        ("publish", "1", "Ana Lyst")
    ]
    page = client.get("/rules?version=1")[1]
    assert 'data-version="1" data-state="candidate"' in page
    # Oversized or missing: refused naming the field, nothing stored.
    status, page = client.post("/rules/publish", {"csrf_token": token}, csrf=False)
    assert status == 400 and "policy" in page and store.published() == ["1"]
    # Beyond loopback without tokens: view only, no form, and a post is refused.
    viewer = _named(_app(folder, host="0.0.0.0"))
    assert 'action="/rules/publish"' not in viewer.get("/rules")[1]
    status, _ = viewer.post("/rules/publish", {"policy": POLICY})
    assert status == 403 and store.published() == ["1"]


def test_a_published_version_is_backtested_over_the_decision_log_as_the_command_does(
    folder: Path,
) -> None:
    """The page's figures are those of ``services.domain.backtest`` over the same payments
    (what ``fraudmesh rules backtest`` prints); payments older than the window are left out."""
    now = datetime.now(UTC)
    vector = [0.0] * len(featurespec.MODEL_FEATURES)
    envelopes = [decision(f"e{i}", f"t{i}", features=vector, at=now) for i in range(3)]
    big = envelopes[0].decision
    big.card_not_present, big.amount_minor, big.merchant_id = True, 700_000, "merch-00001"
    old = decision("e9", "t9", features=vector, at=now - timedelta(days=40))
    old.decision.card_not_present, old.decision.amount_minor = True, 700_000
    old.decision.merchant_id = "merch-00001"
    envelopes += [old, outcome("o0", "t0", reported=now), outcome("o9", "t9", reported=now)]
    envelopes.append(outcome("o1", "t1", outcomes_pb2.OUTCOME_LEGITIMATE, reported=now))
    write_flush(folder / "decisions", 1, envelopes)
    store = PolicyStore(folder / "policy")
    store.publish(POLICY)
    client = _named(_app(folder))
    assert 'href="/rules/backtest?version=1"' in client.get("/rules")[1]
    status, page = client.get("/rules/backtest?version=1&days=30")
    assert status == 200, page[-600:]
    payments, _ = logged.from_log(folder / "decisions", since=now - timedelta(days=30))
    expected = backtest.backtest(policy_domain.load(POLICY, "1"), payments)
    assert expected.payments == 3 and f'data-payments="{expected.payments}"' in page
    for rule in expected.rules:
        f = rule.figures
        row = f'data-rule="{rule.name}" data-fires="{f.fires.count}" data-frauds="{f.frauds.count}"'
        assert row in page, (rule.name, page[-1500:])
    cnp = next(r for r in expected.rules if r.name == "cnp-over-5000")
    assert (cnp.figures.fires.count, cnp.figures.frauds.count) == (1, 1)
    # Bad requests name the field; an unknown version, or a log without outcomes, say so.
    for query, status_wanted, said in [
        ("", 400, "version"),
        ("version=1&days=0", 400, "days"),
        ("version=1&days=x", 400, "days"),
        ("version=7", 400, "no policy version 7"),
        ("version=1&days=1&x=1", 200, "payments"),
    ]:
        status, page = client.get(f"/rules/backtest?{query}")
        assert status == status_wanted and said in page, (query, status, page[-400:])
    empty = folder / "empty"
    (empty / "decisions").mkdir(parents=True)
    PolicyStore(empty / "policy").publish(POLICY)
    status, page = _named(_app(empty)).get("/rules/backtest?version=1")
    assert status == 409 and "holds no decision" in page


# -- the Lists page ----------------------------------------------------------------------------


def test_an_entry_added_is_shown_with_who_added_it_and_adding_again_changes_nothing(
    folder: Path,
) -> None:
    client = _named(_app(folder))
    fields = {"list": "block", "kind": "card", "value": "card-0001", "reason": "stolen"}
    status, page = client.post("/lists/add", fields)
    assert status == 200 and "added card card-0001 on the block list" in page
    (entry,) = _entries(folder)
    assert (entry.kind, entry.value, entry.list, entry.reason, entry.actor) == (
        ListKind.CARD,
        "card-0001",
        ListName.BLOCK,
        "stolen",
        "Ana Lyst",
    )
    status, page = client.post("/lists/add", fields)
    assert status == 200 and "unchanged: card card-0001 on the block list already" in page
    assert _entries(folder) == [entry]
    row = re.search(
        r'<tr data-list="block" data-kind="card" data-value="card-0001".*?</tr>', page, re.S
    )
    assert (
        row and "stolen" in row.group(0) and "Ana Lyst" in row.group(0) and "never" in row.group(0)
    )
    status, page = client.post(
        "/lists/remove", {"list": "block", "kind": "card", "value": "card-0001"}
    )
    assert status == 200 and "removed card card-0001 from the block list" in page
    assert _entries(folder) == []
    status, page = client.post(
        "/lists/remove", {"list": "block", "kind": "card", "value": "card-0001"}
    )
    assert status == 409 and "card card-0001 is not on the block list" in page
    # Audited on the event log as `fraudmesh lists` audits: the add, not the repeated add,
    # the remove, not the failed one; each by the console's user.
    changes = [c for _, c in _changes(folder)]
    assert [c.change for c in changes] == [
        events_pb2.LIST_CHANGE_ADD,
        events_pb2.LIST_CHANGE_REMOVE,
    ]
    assert {(c.value, c.actor) for c in changes} == {("card-0001", "Ana Lyst")}
    assert changes[0].generation < changes[1].generation


def test_entries_are_filtered_paged_and_expired_ones_marked(folder: Path) -> None:
    store = open_lists(FeatureStoreSettings(var_dir=folder))
    assert store is not None
    now = time.time()
    for i in range(150):
        store.add(
            ListEntry(
                ListKind.MERCHANT, f"merch-{i:05d}", ListName.ALLOW, "vip", None, now + i, "a"
            )
        )
    store.add(
        ListEntry(ListKind.CARD_PREFIX, "411111", ListName.BLOCK, "bin", now - 5, now - 10, "b")
    )
    store.close()
    client = Client(_app(folder))
    status, page = client.get("/lists?kind=card_prefix")
    assert status == 200 and page.count("<tr data-list=") == 1 and "expired</span>" in page
    first = client.get("/lists")[1]
    assert first.count("<tr data-list=") == 100 and "page 1 of 2" in first
    assert 'data-value="merch-00149"' in first  # newest first
    second = client.get("/lists?page=2")[1]
    assert second.count("<tr data-list=") == 51 and 'data-value="merch-00000"' in second
    assert client.get("/lists?value=merch-0001")[1].count("<tr data-list=") == 10
    for bad, field in (("kind=bogus", "kind"), ("list=grey", "list"), ("page=0", "page")):
        status, page = client.get(f"/lists?{bad}")
        assert status == 400 and f"{field}" in page and 'role="alert"' in page


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"kind": "bogus"}, "kind: 'bogus' is not a kind: one of card, card_prefix"),
        ({"list": "grey"}, "list: 'grey' is not a list: block or allow"),
        ({"kind": "card_prefix", "value": "41"}, "value: a card prefix has 4 to 12"),
        ({"kind": "card_prefix", "value": "4" * 13}, "value: a card prefix has 4 to 12"),
        ({"value": "x" * 129}, "value"),
        ({"value": "x" * 5000}, "value: is longer than 1024 characters"),
        ({"value": ""}, "value: is required"),
        ({"reason": ""}, "reason: is required"),
        ({"reason": "r" * 201}, "reason: must be 1 to 200 printable characters"),
        ({"expires": "2001-01-01T00:00"}, "expires: must be in the future"),
        ({"expires": "tomorrow"}, "expires: 'tomorrow' is not a time"),
        ({"expires": "9999-12-31T23:59+99:00"}, "expires"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_field_and_nothing_changes(
    folder: Path, fields: dict[str, str], named: str
) -> None:
    client = _named(_app(folder))
    good = {"list": "block", "kind": "card", "value": "card-0001", "reason": "stolen"}
    status, page = client.post("/lists/add", {**good, **fields})
    assert status == 400, page[:300]
    assert named in html.unescape(page)
    assert _entries(folder) == []


def test_hostile_posts_are_refused_and_change_nothing(folder: Path) -> None:
    app = _app(folder)
    client = _named(app)
    good = {"list": "block", "kind": "card", "value": "card-0001", "reason": "stolen"}
    # No CSRF token; another cookie's token; another origin.
    assert client.post("/lists/add", good, csrf=False)[0] == 403
    assert client.post("/lists/add", {**good, "csrf_token": "x" * 43}, csrf=False)[0] == 403
    token = client.token()
    body = urllib.parse.urlencode({**good, "csrf_token": token}).encode()
    assert client.call("POST", "/lists/add", body, {"origin": "http://evil.example"})[0] == 403
    assert client.post("/rules/rollback", {}, csrf=False)[0] == 403
    # Oversized: declared, and streamed in chunks under a false small length.
    huge = urllib.parse.urlencode(
        {**good, "reason": "r" * (MAX_BODY_BYTES + 1), "csrf_token": token}
    )
    status, _, text = client.call("POST", "/lists/add", huge.encode())
    assert status == 413 and f"larger than {MAX_BODY_BYTES} bytes" in text
    status, _, _ = client.call("POST", "/lists/add", huge.encode(), {"content-length": "10"})
    assert status == 413
    # A file where text belongs.
    boundary = "b0undary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in {**good, "csrf_token": token}.items()
        if k != "value"
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="value"; filename="v.txt"\r\n'
        f"Content-Type: text/plain\r\n\r\ncard-0001\r\n--{boundary}--\r\n"
    )
    multipart = "".join(parts).encode()
    status, _, text = client.call(
        "POST",
        "/lists/add",
        multipart,
        {"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert status == 400 and "value: must be text" in text
    # Without a name given, a loopback console takes no change.
    status, page = Client(app).post("/lists/add", good)
    assert status == 400 and "give your name before your first change" in page
    assert _entries(folder) == []


def test_without_tokens_beyond_loopback_the_controls_are_view_only(folder: Path) -> None:
    client = _named(_app(folder, host="0.0.0.0"))
    status, page = client.get("/lists")
    assert status == 200 and 'id="view-only"' in page and 'action="/lists/add"' not in page
    good = {"list": "block", "kind": "card", "value": "card-0001", "reason": "stolen"}
    status, page = client.post("/lists/add", good)
    assert status == 403 and "loopback console only" in page
    assert _entries(folder) == []


# -- roles with tokens -------------------------------------------------------------------------


def test_with_tokens_an_analyst_views_and_only_the_controls_role_changes(folder: Path) -> None:
    tls = folder / "tls"
    certs.write_dev_credentials(tls)
    edge = EdgeSettings(var_dir=folder, auth="jwt")
    app = _app(folder, edge=edge)
    key = tls / DEV_FILES["jwt_key"]
    analyst = Client(app, {"authorization": "Bearer " + certs.mint_token(key, "ana@bank")})
    status, page = analyst.get("/lists")
    assert status == 200 and "fraud-controls" in page and 'action="/lists/add"' not in page
    good = {"list": "block", "kind": "card", "value": "card-0001", "reason": "stolen"}
    status, page = analyst.post("/lists/add", good)
    assert status == 403 and "needs the role 'fraud-controls'" in html.unescape(page)
    PolicyStore(folder / "policy").publish(POLICY)
    status, page = analyst.post("/rules/promote", {"version": "1"})
    assert status == 403 and PolicyStore(folder / "policy").read_state().live is None
    assert analyst.post("/rules/publish", {"policy": POLICY})[0] == 403
    assert PolicyStore(folder / "policy").published() == ["1"]
    assert _entries(folder) == []
    token = certs.mint_token(key, "lead@bank", roles=("fraud-controls",))
    lead = Client(app, {"authorization": f"Bearer {token}"})
    assert 'action="/lists/add"' in lead.get("/lists")[1]
    status, _ = lead.post("/lists/add", good)
    assert status == 200 and [e.actor for e in _entries(folder)] == ["lead@bank"]
    assert lead.post("/rules/promote", {"version": "1"})[0] == 303
    assert PolicyStore(folder / "policy").read_state().history[-1].actor == "lead@bank"


@pytest.mark.parametrize(
    ("claim", "roles"),
    [
        (["fraud-controls", "x"], {"fraud-controls", "x"}),
        ("fraud-controls", set()),  # a string, not a list: no role
        ([1, None, "ok"], {"ok"}),
        (None, set()),
    ],
)
def test_roles_come_from_the_roles_claim_only_as_a_list_of_strings(
    folder: Path, claim: object, roles: set[str]
) -> None:
    import jwt as pyjwt

    tls = folder / "tls"
    certs.write_dev_credentials(tls)
    token = certs.mint_token(tls / DEV_FILES["jwt_key"], "a")
    claims = pyjwt.decode(token, options={"verify_signature": False})
    if claim is not None:
        claims["roles"] = claim
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((tls / DEV_FILES["jwt_key"]).read_bytes(), None)
    header = pyjwt.get_unverified_header(token)
    signed = pyjwt.encode(claims, key, algorithm="ES256", headers={"kid": header["kid"]})  # type: ignore[arg-type]
    verifier = identity.TokenVerifier(tls / DEV_FILES["jwks"], "fraudmesh-dev", "fraudmesh")
    assert verifier.principal(f"Bearer {signed}").roles == roles


def test_conditions_are_described_one_per_line() -> None:
    spec = policy_domain.parse(POLICY)
    assert controls.describe_when(policy_domain.When()) == ("always",)
    assert controls.describe_when(spec.rules[1].when) == (
        "channel = card_not_present",
        "amount_eur > 5000 and <= 90000",
    )


def test_fraudmesh_token_puts_each_role_in_the_roles_claim(folder: Path) -> None:
    import jwt as pyjwt
    from typer.testing import CliRunner

    from services.cli.main import app as cli

    certs.write_dev_credentials(folder / "tls")
    result = CliRunner().invoke(
        cli,
        ["token", "--subject", "lead@bank", "--role", "fraud-controls", "--var-dir", str(folder)],
    )
    assert result.exit_code == 0, result.output
    verifier = identity.TokenVerifier(
        folder / "tls" / DEV_FILES["jwks"], "fraudmesh-dev", "fraudmesh"
    )
    principal = verifier.principal(f"Bearer {result.stdout.strip()}")
    assert (principal.name, principal.roles) == ("lead@bank", frozenset({"fraud-controls"}))
    plain = CliRunner().invoke(cli, ["token", "--subject", "a", "--var-dir", str(folder)])
    claims = pyjwt.decode(plain.stdout.strip(), options={"verify_signature": False})
    assert "roles" not in claims
