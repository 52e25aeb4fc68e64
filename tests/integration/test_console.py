"""The web console in a real browser: Debian's Chromium driven by Playwright, against a mesh with
the live loop and the console (``observability``) on a copy of the prepared state.

Payments are held for review through Envoy; the queue shows them once the decision sink has
written them; a verdict given by clicking reaches ``fraudmesh decisions export`` as an ANALYST
outcome naming the analyst; forged POSTs are refused and change nothing; no page loads anything
from another origin or logs an error. With ``FRAUDMESH_CONSOLE_SCREENSHOTS=DIR`` the pages are
also saved there (``docs/console/`` holds the README's).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pandas as pd
import pyarrow.parquet as pq
import pytest
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services import client
from services.cli import demo
from services.cli.main import app
from services.common.settings import to_env
from services.console import overview
from services.console.models import read_models
from services.console.settings import ConsoleSettings
from services.console.sources import VersionQuality, build_quality, parse_metrics_page
from services.mesh import Mesh, free_port, http_ok
from services.monitor.settings import MonitorSettings
from tests.ci import unavailable

from .conftest import Known
from .live import copy_state, start_live_mesh, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""Headless, as root, and nothing of the browser's own talking to the network."""
ANALYST = "Ana Lyst"
SCREENSHOTS = os.environ.get("FRAUDMESH_CONSOLE_SCREENSHOTS")


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@pytest.fixture(scope="module")
def prometheus_port() -> int:
    """Where the module's Prometheus will listen (chosen before the mesh, which points its
    console there)."""
    return free_port()


@pytest.fixture(scope="module")
def console_mesh(
    prepared_env: Any, tmp_path_factory: pytest.TempPathFactory, prometheus_port: int
) -> Iterator[Mesh]:
    """The mesh with the live loop and the console, on its own copy of the state."""
    var_dir = copy_state(prepared_env.var_dir, tmp_path_factory.mktemp("console-var"))
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    mesh = start_live_mesh(
        var_dir,
        var_dir / "logs",
        metrics=("updater", "gateway", "monitor"),
        observability=True,
        extra_env={
            **to_env(ConsoleSettings, prometheus_url=prometheus),
            # The monitor publishes every second and gives a PSI from a test's few payments.
            **to_env(MonitorSettings, publish_interval_s=1, min_decisions=20),
        },
    )
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def prometheus(console_mesh: Mesh, prometheus_port: int) -> Iterator[str]:
    """Debian's Prometheus scraping the mesh's gateway every second; its URL."""
    if not Path(PROMETHEUS).exists():
        unavailable("prometheus is missing: `make system` installs Debian's prometheus")
    folder = console_mesh.config.var_dir / "prometheus"
    folder.mkdir(exist_ok=True)
    gateway = console_mesh.config.metrics_ports["gateway"]
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gateway\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{gateway}']}}]\n"
    )
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{prometheus_port}"
    try:
        wait_for(lambda: http_ok(f"{url}/-/ready"), "Prometheus ready", timeout_s=60)
        yield url
    finally:
        process.terminate()
        process.wait(15)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright (never a browser Playwright downloads)."""
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing: `make system` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        start = time.monotonic()
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        print(f"chromium {launched.version} launched in {time.monotonic() - start:.2f} s")
        yield launched
        launched.close()


def _url(mesh: Mesh, path: str = "/") -> str:
    return mesh.config.console_url + path


def hold_payments(
    mesh: Mesh, wanted: int, credentials: client.Credentials = client.PLAINTEXT
) -> list[str]:
    """Payments the model holds for review, sent through Envoy as the demo sends them."""
    held = demo.held_for_review(mesh.config, RichConsole(file=io.StringIO()), credentials, wanted)
    assert len(held) == wanted, f"only {len(held)} of {wanted} payments were held"
    return held


def export(mesh: Mesh, tmp_path: Path) -> pd.DataFrame:
    out = tmp_path / f"export-{uuid.uuid4().hex[:6]}.parquet"
    result = CliRunner().invoke(
        app, ["decisions", "export", "--out", str(out), "--var-dir", str(mesh.config.var_dir)]
    )
    assert result.exit_code == 0, result.output
    return pq.read_table(out).to_pandas().set_index("transaction_id")


def outcome_of(mesh: Mesh, tmp_path: Path, transaction_id: str) -> dict[str, Any] | None:
    frame = export(mesh, tmp_path)
    if transaction_id not in frame.index or pd.isna(frame.loc[transaction_id, "outcome"]):
        return None
    return dict(frame.loc[transaction_id])


@pytest.fixture(scope="module")
def held(console_mesh: Mesh) -> list[str]:
    """Payments held for review, once the console's queue lists them all."""
    ids = hold_payments(console_mesh, 4)

    def queued() -> bool:
        with urllib.request.urlopen(_url(console_mesh, "/reviews"), timeout=5) as reply:
            page = reply.read().decode()
        return all(f'data-transaction-id="{t}"' in page for t in ids)

    wait_for(queued, "the held payments in the console's queue", timeout_s=60)
    return ids


class PageWatch:
    """A page with every request it made and every error it logged."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, url: str) -> Any:
        response = self.page.goto(url, wait_until="networkidle")
        assert response is not None and response.status == 200, (url, response and response.status)
        return response

    def shot(self, name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watch(browser: Any) -> Iterator[PageWatch]:
    w = PageWatch(browser)
    yield w
    w.close()


def _give_name(watch: PageWatch) -> None:
    page = watch.page
    page.fill("form.analyst input[name=analyst]", ANALYST)
    page.click("form.analyst button[type=submit]")
    page.wait_for_load_state("networkidle")
    assert ANALYST in page.inner_text("header.top .who")


def test_each_page_loads_without_errors_or_requests_elsewhere(
    console_mesh: Mesh, held: list[str], watch: PageWatch
) -> None:
    origin = console_mesh.config.console_url
    watch.open(_url(console_mesh, "/"))
    assert watch.page.locator("#figures").count() == 1
    watch.open(_url(console_mesh, "/models"))
    live = console_mesh.config.var_dir / "models" / "fraud-lgbm"
    assert watch.page.locator("table.versions tr.state-live").count() == 1, live
    watch.open(_url(console_mesh, "/reviews"))
    _give_name(watch)
    for tid in held:
        assert watch.page.locator(f'article[data-transaction-id="{tid}"]').count() == 1
    first = watch.page.locator(f'article[data-transaction-id="{held[0]}"]')
    first.locator("details.features summary").click()
    assert first.locator("details.features tbody tr").count() > 10
    watch.shot("reviews")
    watch.open(_url(console_mesh, f"/decisions?transaction_id={held[0]}"))
    assert "REVIEW" in watch.page.inner_text("article dd.decision-review")
    watch.shot("decision")
    # htmx refreshes the overview on its own: let it, and see it stays quiet.
    watch.open(_url(console_mesh, "/"))
    watch.page.wait_for_timeout(6000)
    assert watch.errors == []
    assert len(watch.requests) >= 8
    elsewhere = [u for u in watch.requests if not u.startswith(origin + "/")]
    assert elsewhere == [], elsewhere


def test_marking_a_held_payment_as_fraud_lands_an_analyst_outcome(
    console_mesh: Mesh, held: list[str], watch: PageWatch, tmp_path: Path
) -> None:
    tid = held[1]
    watch.open(_url(console_mesh, "/reviews"))
    _give_name(watch)
    article = watch.page.locator(f'article[data-transaction-id="{tid}"]')
    article.locator("button.fraud").click()
    judged = watch.page.locator("article.judged")
    judged.wait_for(timeout=10_000)
    assert tid in judged.inner_text() and "FRAUD" in judged.inner_text()
    outcome: dict[str, Any] = {}

    def landed() -> bool:
        nonlocal outcome
        outcome = outcome_of(console_mesh, tmp_path, tid) or {}
        return bool(outcome)

    wait_for(landed, "the verdict in fraudmesh decisions export", timeout_s=60)
    assert outcome["decision"] == "review"
    assert outcome["outcome"] == "fraud"
    assert outcome["outcome_source"] == "analyst"
    assert outcome["outcome_reported_by"] == ANALYST
    # Settled: the queue no longer offers it, also after the console forgets its own verdicts.
    watch.open(_url(console_mesh, "/reviews"))
    assert watch.page.locator(f'article[data-transaction-id="{tid}"]').count() == 0
    assert watch.errors == []
    elsewhere = [u for u in watch.requests if not u.startswith(console_mesh.config.console_url)]
    assert elsewhere == []


def _monitor_now(mesh: Mesh) -> dict[str, VersionQuality]:
    url = f"http://{mesh.config.host}:{mesh.config.metrics_ports['monitor']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        return build_quality(parse_metrics_page(reply.read().decode()))


def _shown(q: VersionQuality) -> dict[str, str]:
    """What the Models page shows of ``q``, as the page formats it."""
    shown = {"score": f"{q.psi['score']:.3f}"} if "score" in q.psi else {}
    for maturity, c in q.live.items():
        for kind, figures in (("precision", c.precision), ("recall", c.recall)):
            for threshold in ("review", "decline"):
                value = figures.get(threshold)
                shown[f"{maturity} {kind}-{threshold}"] = "-" if value is None else f"{value:.3f}"
        ap = c.average_precision
        shown[f"{maturity} average-precision"] = "-" if ap is None else f"{ap:.3f}"
        shown[f"{maturity} frauds"] = "-" if c.frauds is None else f"{c.frauds:.0f}"
    return shown


def test_the_models_page_shows_what_the_monitor_measures(
    console_mesh: Mesh, held: list[str], watch: PageWatch, known: Known
) -> None:
    """Drift and live quality on the page are the monitor's own figures: read from its
    metrics page before and after the page, equal when the two reads agree."""
    # Enough decisions in the monitor's window for a PSI (the module sets its minimum to 20).
    sample = client.Sample("models", known.card_id, known.merchant_id, known.amount_minor)
    answered = 0
    with grpc.insecure_channel(console_mesh.config.envoy_target) as channel:
        stub = pb_grpc.FraudScoringStub(channel)
        for _ in range(90):  # a late answer on a busy machine is not what this test is about
            with contextlib.suppress(grpc.RpcError):
                stub.Score(sample.request(), timeout=2.0)
                answered += 1
            if answered == 30:
                break
    assert answered == 30, answered
    live = next(
        v.version
        for v in read_models(console_mesh.config.var_dir / "models", "fraud-lgbm").versions
        if v.state == "live"
    )
    wait_for(
        lambda: "score" in _monitor_now(console_mesh).get(live, VersionQuality(live)).psi,
        "the monitor's score PSI for the live version",
        timeout_s=60,
    )
    for _ in range(10):
        before = _shown(_monitor_now(console_mesh)[live])
        watch.open(_url(console_mesh, "/models"))
        section = watch.page.locator(f'section.quality[data-version="{live}"]')
        page = {"score": section.locator('tr[data-feature="score"] td.num').inner_text()}
        for row in section.locator("table.live tr[data-maturity]").all():
            maturity = row.get_attribute("data-maturity")
            if maturity == "reference":
                continue
            for cell in row.locator("td[data-figure]").all():
                page[f"{maturity} {cell.get_attribute('data-figure')}"] = cell.inner_text()
            page[f"{maturity} frauds"] = row.locator("td.frauds").inner_text()
        if before == _shown(_monitor_now(console_mesh)[live]):
            break
    assert page == before
    features = section.locator("table.drift tr[data-feature]").count()
    assert features > 10, features
    assert section.locator("table.live tr[data-maturity=reference]").count() == 1
    watch.shot("models")
    assert watch.errors == []


def _post(url: str, fields: dict[str, str], headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        url, data=urllib.parse.urlencode(fields).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


class _Attacker(http.server.BaseHTTPRequestHandler):
    """Another origin: a page whose form posts a verdict to the console as soon as it loads."""

    target = ""
    transaction_id = ""

    def do_GET(self) -> None:
        body = (
            f'<form id="f" method="post" action="{self.target}/reviews/verdict">'
            f'<input name="transaction_id" value="{self.transaction_id}">'
            '<input name="verdict" value="legitimate"></form>'
            '<script>document.getElementById("f").submit()</script>'
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_forged_posts_are_refused_and_change_nothing(
    console_mesh: Mesh, held: list[str], browser: Any, tmp_path: Path
) -> None:
    forged, barrier = held[2], held[3]
    context = browser.new_context()
    page = context.new_page()
    page.goto(_url(console_mesh, "/reviews"), wait_until="networkidle")
    page.fill("form.analyst input[name=analyst]", ANALYST)
    page.click("form.analyst button[type=submit]")
    page.wait_for_load_state("networkidle")
    cookies = "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())
    verdict = _url(console_mesh, "/reviews/verdict")
    fields = {"transaction_id": forged, "verdict": "legitimate"}
    # The browser's own cookies, no token: what a forged cross-site form would carry.
    assert _post(verdict, fields, {"cookie": cookies}) == 403
    # A token that belongs to another cookie.
    assert _post(verdict, {**fields, "csrf_token": "x" * 43}, {"cookie": cookies}) == 403
    # The page's real token, sent from another origin.
    token = page.get_attribute('form.verdict input[name="csrf_token"]', "value")
    assert token
    assert (
        _post(
            verdict,
            {**fields, "csrf_token": token},
            {"cookie": cookies, "origin": "http://127.0.0.1:1"},
        )
        == 403
    )
    # A page on another origin that makes this browser submit a form to the console.
    _Attacker.target, _Attacker.transaction_id = console_mesh.config.console_url, forged
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with page.expect_response(lambda r: r.url == verdict) as answered:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        assert answered.value.status == 403
    finally:
        server.shutdown()
    # The real thing on another held payment: once its outcome has landed, the forged one
    # (sent earlier on the same log) would have too.
    page.goto(_url(console_mesh, "/reviews"), wait_until="networkidle")
    page.locator(f'article[data-transaction-id="{barrier}"] button.legitimate').click()
    page.locator("article.judged").wait_for(timeout=10_000)
    wait_for(
        lambda: outcome_of(console_mesh, tmp_path, barrier) is not None,
        "the real verdict in the export",
        timeout_s=60,
    )
    assert outcome_of(console_mesh, tmp_path, forged) is None
    page.goto(_url(console_mesh, "/reviews"), wait_until="networkidle")
    assert page.locator(f'article[data-transaction-id="{forged}"]').count() == 1
    context.close()


def test_the_demo_names_the_console_and_its_held_payments_wait_there(
    console_mesh: Mesh, watch: PageWatch, tmp_path: Path
) -> None:
    started = time.time()
    out = RichConsole(record=True, width=200)
    demo.run(console_mesh.config, out)
    text = out.export_text()
    assert f"{console_mesh.config.console_url}/reviews" in text
    # The demo names every payment it held; each must reach the decision log as a review.
    ours = re.findall(r"REVIEW\s+(demo-[0-9a-f]+)", text)
    assert ours, "the demo held no payment for review"

    def exported() -> bool:
        frame = export(console_mesh, tmp_path)
        recent = frame[frame["decided_at"] >= pd.Timestamp(started, unit="s", tz="UTC")]
        held = set(recent.index[recent["decision"] == "review"])
        return set(ours) <= held

    wait_for(exported, "the demo's held payments in the decision log", timeout_s=60)
    page_text = ""

    def listed() -> bool:
        nonlocal page_text
        watch.open(_url(console_mesh, "/reviews"))
        page_text = watch.page.content()
        return all(f'data-transaction-id="{t}"' in page_text for t in ours)

    wait_for(listed, "the demo's held payments in the queue", timeout_s=30)
    assert watch.errors == []


def _prometheus_value(url: str, promql: str, at: str | None = None) -> float | None:
    query = urllib.parse.urlencode({"query": promql} | ({"time": at} if at else {}))
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as reply:
        result = json.load(reply)["data"]["result"]
    values = [float(r["value"][1]) for r in result]
    return values[0] if values and values[0] == values[0] else None


def _overview_and_prometheus(
    mesh: Mesh, watch: PageWatch, prometheus: str
) -> tuple[dict[str, float], dict[str, float | None]]:
    """The overview's figures as shown, and Prometheus's answer to each at the page's instant."""
    watch.open(_url(mesh, "/"))
    shown: dict[str, float] = {}
    for figure in overview.FIGURES:
        text = watch.page.inner_text(f'[data-figure="{figure.key}"] .value')
        shown[figure.key] = float(text.split()[0])
    at = watch.page.get_attribute("#figures", "data-at")
    assert at
    return shown, {f.key: _prometheus_value(prometheus, f.promql, at) for f in overview.FIGURES}


def _as_shown(shown: dict[str, float], direct: dict[str, float | None]) -> bool:
    return all(
        direct[f.key] is not None
        and shown[f.key] == pytest.approx(direct[f.key] * f.scale, abs=0.051)  # type: ignore[operator]
        for f in overview.FIGURES
    )


def test_the_overview_shows_what_prometheus_answers(
    console_mesh: Mesh, prometheus: str, watch: PageWatch, known: Known
) -> None:
    stop = threading.Event()
    failures: list[str] = []

    def traffic() -> None:  # a steady 20 payments a second, so the rates hold still
        sample = client.Sample("steady", known.card_id, known.merchant_id, known.amount_minor)
        with grpc.insecure_channel(console_mesh.config.envoy_target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            while not stop.is_set():
                try:
                    stub.Score(sample.request(), timeout=1.0)
                except grpc.RpcError as error:  # kept for the failure message
                    failures.append(f"{error.code().name}: {error.details()}")
                stop.wait(0.05)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        throughput = next(f for f in overview.FIGURES if f.key == "throughput")
        try:
            wait_for(
                lambda: (_prometheus_value(prometheus, throughput.promql) or 0) > 2,
                "traffic in Prometheus",
                timeout_s=60,
            )
        except AssertionError:
            with urllib.request.urlopen(f"{prometheus}/api/v1/targets", timeout=5) as reply:
                targets = reply.read().decode()[:1000]
            raise AssertionError(f"targets: {targets}; traffic errors: {failures[:3]}") from None
        # Every figure on the page was evaluated at one instant, which the page names. A scrape
        # stamped just before that instant but stored just after the page's query moves the
        # same query at the same instant a little: then the page is read once more.
        for _ in range(3):
            shown, direct = _overview_and_prometheus(console_mesh, watch, prometheus)
            if _as_shown(shown, direct):
                break
        breakers = watch.page.inner_text('[data-breakdown="breakers"]')
        watch.shot("overview")
    finally:
        stop.set()
        sender.join(5)
    for figure in overview.FIGURES:
        value = direct[figure.key]
        assert value is not None, figure.key
        # As shown: one decimal, two for milliseconds.
        assert shown[figure.key] == pytest.approx(value * figure.scale, abs=0.051), figure.key
    assert "features" in breakers and "closed" in breakers
    assert watch.errors == []


def test_without_prometheus_or_the_monitor_the_pages_say_so(
    browser: Any, watch: PageWatch, tmp_path: Path
) -> None:
    """A console whose sources are down shows each page with a notice saying which source is
    away, and no figure of its own making."""
    port, away = free_port(), free_port()
    env = {
        **os.environ,
        **to_env(
            ConsoleSettings,
            port=port,
            var_dir=tmp_path,
            prometheus_url=f"http://127.0.0.1:{away}",
            monitor_url=f"http://127.0.0.1:{away}/metrics",
            outcome_target=f"127.0.0.1:{away}",
        ),
    }
    log = (tmp_path / "console.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.console"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    origin = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_ok(f"{origin}/healthz"), "the console answering", timeout_s=30)
        watch.open(origin + "/")
        notice = watch.page.inner_text("#figures .notice")
        assert f"Prometheus at http://127.0.0.1:{away} is not reachable" in notice
        assert watch.page.locator("#figures .figure").count() == 0
        watch.open(origin + "/models")
        absent = watch.page.inner_text("#quality-absent")
        assert f"the monitor at http://127.0.0.1:{away}/metrics is not reachable" in absent
        assert watch.page.locator("section.quality").count() == 0
        assert watch.errors == []
        assert [u for u in watch.requests if not u.startswith(origin + "/")] == []
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def test_a_request_for_a_foreign_host_is_refused(console_mesh: Mesh) -> None:
    # A DNS-rebinding page: the browser connects to the console's address but names its own
    # host. The console refuses it; addressed by its own name, the same request is answered.
    config = console_mesh.config
    answers = {}
    for host in ("rebound.attacker.example", f"{config.host}:{config.console_port}"):
        connection = http.client.HTTPConnection(config.host, config.console_port, timeout=10)
        try:
            connection.request("GET", "/", headers={"Host": host})
            reply = connection.getresponse()
            answers[host] = (reply.status, reply.read().decode())
        finally:
            connection.close()
    status, body = answers["rebound.attacker.example"]
    assert status == 421 and "does not answer for host" in body
    assert answers[f"{config.host}:{config.console_port}"][0] == 200
