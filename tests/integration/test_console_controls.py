"""The fraud team's controls in the console, in a real browser, against a real mesh: a card
blocked on the Lists page is declined on its next payment through Envoy and answered by the
model again once removed there; a policy published with ``fraudmesh rules publish`` is made
live and rolled back on the Rules page, and the answers through Envoy follow; hostile forms
(no CSRF token, another origin, oversized, wrong types, bad values) are refused, naming the
field where one is wrong, and change nothing.

The mesh runs without the live loop (the controls need none of it) and the console as its own
process with the mesh's console environment, as ``fraudmesh up`` starts it.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.domain.lists import ListEntry
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, http_ok

from .conftest import Known, first_full_quality, register_logs, score_request
from .live import wait_for
from .test_console import ANALYST, PageWatch, browser  # noqa: F401  (the browser fixture)

pytestmark = pytest.mark.integration

FOLLOW_S = 10.0
"""Longest a change may take to reach the gateway: it polls every 200 ms; the rest is slack
for a loaded machine, never a figure judged."""
BIG_CNP_MINOR = 600_000
"""6,000 EUR: over the rule's 5,000 EUR."""
REASON = "confirmed fraud"
CLI = (sys.executable, "-m", "services.cli")


@pytest.fixture(scope="module")
def mesh(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    """A mesh on this module's own copy of the state."""
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir,
        live_loop=False,
        log_dir=register_logs(request, tmp_path_factory.mktemp("controls-logs")),
    )
    started = Mesh(config)
    started.start(timeout_s=120)
    try:
        first_full_quality(config.envoy_target, known)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def console(mesh: Mesh) -> Iterator[str]:
    """The console process with the mesh's console environment; its origin."""
    config = mesh.config
    log = (config.logs_path / "console.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.console"],
        env={**os.environ, **config.console_env()},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    origin = config.console_url
    try:
        wait_for(lambda: http_ok(f"{origin}/healthz"), "the console answering", timeout_s=60)
        yield origin
    finally:
        process.terminate()
        process.wait(15)
        log.close()


@pytest.fixture
def watch(browser: Any) -> Iterator[PageWatch]:  # noqa: F811
    w = PageWatch(browser)
    yield w
    w.close()


def _answer(mesh: Mesh, req: pb.ScoreRequest) -> pb.ScoreResponse | None:
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        try:
            return pb_grpc.FraudScoringStub(channel).Score(req, timeout=2.0)
        except grpc.RpcError:  # a late answer on a busy machine: the next try judges
            return None


def _until(
    mesh: Mesh, req: Callable[[], pb.ScoreRequest], wanted: Callable[[pb.ScoreResponse], bool]
) -> pb.ScoreResponse:
    """The first wanted answer through Envoy; fails with the last one after FOLLOW_S."""
    found: list[pb.ScoreResponse] = []

    def answered() -> bool:
        answer = _answer(mesh, req())
        if answer is not None:
            found.append(answer)
        return answer is not None and wanted(answer)

    try:
        wait_for(answered, "the wanted answer through Envoy", timeout_s=FOLLOW_S)
    except AssertionError:
        pytest.fail(f"no wanted answer in {FOLLOW_S} s; last: {found[-1:] or 'none'}")
    return found[-1]


def _by_model(answer: pb.ScoreResponse) -> bool:
    return answer.scored_by == pb.SCORED_BY_MODEL and not answer.model_version.startswith(
        ("lists-", "policy-")
    )


def _entries(mesh: Mesh) -> list[ListEntry]:
    store = open_lists(FeatureStoreSettings(var_dir=mesh.config.var_dir), reader=True)
    if store is None:
        return []
    try:
        return store.entries()[1]
    finally:
        store.close()


def _give_name(watch: PageWatch) -> None:
    watch.page.fill("form.analyst input[name=analyst]", ANALYST)
    watch.page.click("form.analyst button[type=submit]")
    watch.page.wait_for_load_state("networkidle")
    assert ANALYST in watch.page.inner_text("header.top .who")


def _add(watch: PageWatch, kind: str, value: str) -> str:
    page = watch.page
    page.select_option("form.add-entry select[name=list]", "block")
    page.select_option("form.add-entry select[name=kind]", kind)
    page.fill("form.add-entry input[name=value]", value)
    page.fill("form.add-entry input[name=reason]", REASON)
    page.click("form.add-entry button[type=submit]")
    page.wait_for_load_state("networkidle")
    return str(page.inner_text("#done"))


def test_a_card_blocked_in_the_console_is_declined_until_removed_there(
    mesh: Mesh, console: str, watch: PageWatch, known: Known
) -> None:
    def pay() -> pb.ScoreRequest:
        return score_request(known)

    _until(mesh, pay, _by_model)
    watch.open(f"{console}/lists")
    _give_name(watch)
    assert _add(watch, "card", known.card_id) == f"added card {known.card_id} on the block list"
    row = watch.page.locator(f'table.entries tr[data-kind="card"][data-value="{known.card_id}"]')
    assert row.locator("td.actor").inner_text() == ANALYST
    declined = _until(mesh, pay, lambda a: a.decision == pb.DECISION_DECLINE)
    assert declined.reasons[0] == f"block list: card {known.card_id}: {REASON}"
    assert declined.model_version.startswith("lists-")
    # The same entry again changes nothing (the command's own add).
    generation = watch.page.inner_text("p.lead")
    assert _add(watch, "card", known.card_id).startswith("unchanged: ")
    assert watch.page.inner_text("p.lead") == generation
    watch.shot("lists")
    row = watch.page.locator(f'table.entries tr[data-kind="card"][data-value="{known.card_id}"]')
    row.locator("form.remove-entry button").click()
    watch.page.wait_for_load_state("networkidle")
    assert watch.page.inner_text("#done") == f"removed card {known.card_id} from the block list"
    assert _entries(mesh) == []
    _until(mesh, pay, _by_model)
    assert watch.errors == []
    assert [u for u in watch.requests if not u.startswith(console + "/")] == []


def _policy(merchant: str) -> str:
    return f"""
description: card-not-present limits
rules:
  - name: cnp-over-5000-at-m
    action: decline
    priority: 10
    reason: card not present over 5,000 EUR at merchant M
    scope: {{merchants: [{merchant}]}}
    when: {{channel: card_not_present, amount_eur: {{gt: 5000}}}}
  - name: watch-all-cnp
    action: review
    mode: shadow
    when: {{channel: card_not_present}}
thresholds:
  - {{merchants: [merch-99998], review: 0.2, decline: 0.6}}
"""


def test_a_policy_is_made_live_and_rolled_back_in_the_console(
    mesh: Mesh, console: str, watch: PageWatch, known: Known, tmp_path: Path
) -> None:
    def big_cnp() -> pb.ScoreRequest:
        return score_request(known, channel=pb.CHANNEL_CARD_NOT_PRESENT, amount_minor=BIG_CNP_MINOR)

    _until(mesh, big_cnp, _by_model)
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(known.merchant_id))
    published = subprocess.run(
        [*CLI, "rules", "publish", str(path), "--var-dir", str(mesh.config.var_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert published.returncode == 0, published.stderr
    version = published.stdout.split("policy v", 1)[1].split()[0]
    watch.open(f"{console}/rules")
    _give_name(watch)
    candidate = watch.page.locator(f'table.policy-versions tr[data-version="{version}"]')
    assert candidate.get_attribute("data-state") == "candidate"
    candidate.locator("form.promote button").click()
    watch.page.wait_for_load_state("networkidle")
    shown = watch.page.locator("#shown")
    assert shown.get_attribute("data-live") == version
    rule = shown.locator('table.rules tr[data-rule="cnp-over-5000-at-m"]')
    cells = [c.strip() for c in rule.locator("td").all_inner_texts()]
    assert cells[:4] == ["cnp-over-5000-at-m", "live", "10", f"merchants in {known.merchant_id}"]
    assert "channel = card_not_present" in cells[4] and "amount_eur > 5000" in cells[4]
    assert cells[5] == "decline"
    assert shown.locator('table.rules tr[data-rule="watch-all-cnp"]').get_attribute(
        "data-mode"
    ) == ("shadow")
    assert shown.locator('table.thresholds tr[data-merchants="merch-99998"]').count() == 1
    watch.shot("rules")
    decided = _until(mesh, big_cnp, lambda a: a.model_version == f"policy-{version}")
    assert decided.decision == pb.DECISION_DECLINE
    assert decided.reasons[0] == (
        "rule cnp-over-5000-at-m: card not present over 5,000 EUR at merchant M"
    )
    watch.page.click("form.rollback button")
    watch.page.wait_for_load_state("networkidle")
    rolled = watch.page.locator(f'table.policy-versions tr[data-version="{version}"]')
    assert rolled.get_attribute("data-state") == "rolled back"
    changes = watch.page.locator("table.policy-history tr[data-action]").all_inner_texts()
    assert changes[0].split("\t")[1:] == ["rollback", "no policy", ANALYST]
    assert changes[1].split("\t")[1:] == ["promote", f"v{version}", ANALYST]
    _until(mesh, big_cnp, _by_model)
    assert watch.errors == []


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def _declared_only(url: str, length: int, headers: dict[str, str]) -> tuple[int, str]:
    """The console's answer to a POST that declares ``length`` bytes and sends none yet."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.putrequest("POST", parts.path)
        for name, value in {**headers, "content-length": str(length)}.items():
            connection.putheader(name, value)
        connection.endheaders()
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    finally:
        connection.close()


def test_hostile_forms_are_refused_and_change_nothing(
    mesh: Mesh, console: str, watch: PageWatch, known: Known
) -> None:
    watch.open(f"{console}/lists")
    _give_name(watch)
    cookies = "; ".join(f"{c['name']}={c['value']}" for c in watch.context.cookies())
    token = watch.page.get_attribute('form.add-entry input[name="csrf_token"]', "value")
    assert token
    url = f"{console}/lists/add"
    good = {"list": "block", "kind": "card", "value": known.card_id, "reason": REASON}
    plain = {"cookie": cookies, "content-type": "application/x-www-form-urlencoded"}

    def post(fields: dict[str, str], **headers: str) -> tuple[int, str]:
        body = urllib.parse.urlencode(fields).encode()
        return _post(url, body, {**plain, **headers})

    before = _entries(mesh)
    assert post(good)[0] == 403  # the browser's cookies, no token
    assert post({**good, "csrf_token": "x" * 43})[0] == 403
    assert post({**good, "csrf_token": token}, origin="http://127.0.0.1:1")[0] == 403
    # A 1 MB body, declared: refused on its length, before any of it is read (sending it all
    # would race the console closing the connection on its answer).
    status, text = _declared_only(url, 1_000_000, plain)
    assert status == 413 and "larger than" in text
    refused = {
        "kind": {"kind": "bank"},
        "value": {"kind": "card_prefix", "value": "41"},
        "expires": {"expires": "2001-01-01T00:00"},
        "reason": {"reason": "x" * 201},
    }
    for field, wrong in refused.items():
        status, text = post({**good, "csrf_token": token, **wrong})
        assert status == 400, (field, status)
        assert f"{field}: " in text, field
    boundary = "b0undary"
    parts = "".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in {**good, "csrf_token": token}.items()
        if k != "value"
    )
    parts += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="value"; filename="v"\r\n'
        f"Content-Type: text/plain\r\n\r\n{known.card_id}\r\n--{boundary}--\r\n"
    )
    status, text = _post(
        url,
        parts.encode(),
        {"cookie": cookies, "content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert status == 400 and "value: must be text" in text
    assert _entries(mesh) == before
    assert _by_model(_until(mesh, lambda: score_request(known), _by_model))
