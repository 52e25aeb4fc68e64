"""The console's lifecycle: build the domain objects and sources from the settings, wrap the
routes in the security layers, serve HTTP (HTTPS with the edge's certificate) until SIGTERM."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse

from services.common import logs
from services.common.edge_security import DEV_FILES, EdgeSettings
from services.console import control_pages, csrf, identity, outcomes, pages
from services.console.controls import Controls
from services.console.reviews import DecisionLogView
from services.console.settings import ConsoleSettings, is_loopback
from services.console.sources import (
    HttpPrometheus,
    MetricsPageMonitor,
    MonitorSource,
    NoMonitor,
    NoPrometheus,
    PrometheusMonitor,
    PrometheusSource,
)
from services.console.verdicts import OutcomeReporter, RecentVerdicts
from services.eventlog import EventLogSettings
from services.featurestore.settings import FeatureStoreSettings
from services.models.policies import PolicyStore

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
"""Everything from the console's own origin, nothing inline, never framed: the browser
fetches nothing elsewhere, and an injected script or a framing page gets nowhere."""
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with
    # its own form posts, which the CSRF check must refuse as it would a sandboxed frame.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
MAX_BODY_BYTES = 64 * 1024
"""Largest request body taken: every form of the console is a few hundred bytes."""
PUBLIC_PATHS = ("/healthz", "/static/")
"""Served without a token: the probe, and the stylesheet and script (nothing personal)."""


class SecurityHeaders:
    """Adds the security headers to every response; pages with decisions are not cached."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += SECURITY_HEADERS
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyLimit:
    """Refuses a request whose body is larger than ``limit`` with 413 before the application
    reads it (a form is parsed whole, so an unbounded one would be held whole in memory)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        # Read (a declared length can be wrong, a chunked body has none) up to the limit.
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = PlainTextResponse(
            f"413: the request body is larger than {self.limit} bytes\n", status_code=413
        )
        await response(scope, receive, send)


def host_name(header: str) -> str:
    """The name in a Host header, without its port and an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class AllowedHosts:
    """Answers only requests addressed to one of the console's own names: a page served
    from another name that resolves to the console (DNS rebinding) is same-origin to the
    browser, so the CSRF check alone would let it act as the console. The probe path is
    exempt (the kubelet addresses the pod by its IP)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or "*" in self.allowed or path == "/healthz":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        name = host_name(headers.get(b"host", b"").decode("latin-1"))
        if name in self.allowed:
            await self.app(scope, receive, send)
            return
        response = PlainTextResponse(
            f"421: this console does not answer for host {name[:100]!r}; reach it by one of "
            "its own names (FRAUD_CONSOLE_ALLOWED_HOSTS)\n",
            status_code=421,
        )
        await response(scope, receive, send)


class RequireToken:
    """With ``FRAUD_EDGE_AUTH=jwt``: every request but the public paths needs a token the edge
    would accept; its subject is the request's principal."""

    def __init__(self, app: ASGIApp, verifier: identity.TokenVerifier) -> None:
        self.app = app
        self.verifier = verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or path.startswith(PUBLIC_PATHS):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            principal = self.verifier.principal(headers.get("authorization"))
        except identity.Unauthenticated as error:
            response = PlainTextResponse(
                f"401: {error}\n", status_code=401, headers={"WWW-Authenticate": "Bearer"}
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def _reporter(settings: ConsoleSettings, edge: EdgeSettings) -> OutcomeReporter:
    """The channel verdicts take: to the edge, over TLS (with the client certificate for
    mutual TLS) when the edge requires it."""
    credentials = None
    if edge.tls:
        tls = settings.var_dir / "tls"
        credentials = outcomes.channel_credentials(
            settings.edge_ca_path or tls / DEV_FILES["ca"],
            (settings.edge_client_cert_path or tls / DEV_FILES["client_cert"])
            if edge.mtls
            else None,
            (settings.edge_client_key_path or tls / DEV_FILES["client_key"]) if edge.mtls else None,
        )
    return outcomes.GrpcOutcomeReporter(
        settings.outcome_target, settings.outcome_timeout_s, credentials
    )


def check_exposure(settings: ConsoleSettings, edge: EdgeSettings) -> None:
    """Refuses to serve decisions unauthenticated beyond loopback unless told to."""
    if is_loopback(settings.host) or edge.auth == "jwt" or settings.allow_unauthenticated_remote:
        return
    raise SystemExit(
        f"console: refusing to serve {settings.host} without authentication; set "
        "FRAUD_EDGE_AUTH=jwt (tokens as at the edge), keep FRAUD_CONSOLE_HOST on loopback, "
        "or set FRAUD_CONSOLE_ALLOW_UNAUTHENTICATED_REMOTE=true"
    )


def _sources(settings: ConsoleSettings) -> tuple[PrometheusSource, MonitorSource]:
    """Where the overview's figures and the monitor's gauges come from."""
    prometheus: PrometheusSource = (
        HttpPrometheus(settings.prometheus_url, settings.source_timeout_s)
        if settings.prometheus_url
        else NoPrometheus()
    )
    monitor: MonitorSource = NoMonitor()
    if settings.monitor_url:
        monitor = MetricsPageMonitor(settings.monitor_url, settings.source_timeout_s)
    elif settings.prometheus_url:
        monitor = PrometheusMonitor(prometheus)
    return prometheus, monitor


def create(
    settings: ConsoleSettings,
    edge: EdgeSettings,
    reporter: OutcomeReporter | None = None,
    store: FeatureStoreSettings | None = None,
) -> Starlette:
    """The console application on these settings (``reporter``: another outcome channel;
    ``store``: another online store for the lists)."""
    verifier = (
        identity.TokenVerifier(edge.jwks_file, edge.jwt_issuer, edge.jwt_audience)
        if edge.auth == "jwt"
        else None
    )
    prometheus, monitor = _sources(settings)
    reporter = reporter or _reporter(settings, edge)
    console = pages.Console(
        view=DecisionLogView(
            settings.decisions_path,
            queue_days=settings.queue_days,
            max_rows=settings.queue_max_rows,
            lookup_days=settings.lookup_days,
        ),
        reporter=reporter,
        prometheus=prometheus,
        monitor=monitor,
        csrf=csrf.Csrf.with_key(
            settings.csrf_secret.get_secret_value() if settings.csrf_secret else None
        ),
        verifier=verifier,
        model_root=settings.models_path,
        model_name=settings.model_name,
        page_size=settings.page_size,
        secure_cookies=edge.tls,
        recent=RecentVerdicts(),
    )
    missing = [f for f in pages.VENDOR_FILES if not (pages.STATIC / f).is_file()]
    if missing:
        log.warning("assets missing (run `make install`): %s; pages work without them", missing)
    console.templates.env.globals["htmx"] = not missing

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await reporter.close()

    middleware = [
        Middleware(SecurityHeaders),
        Middleware(AllowedHosts, allowed=settings.allowed_host_names),
    ]
    if verifier is not None:
        middleware.append(Middleware(RequireToken, verifier=verifier))
    middleware.append(Middleware(BodyLimit))
    controls = _control_pages(settings, console, store or _store_settings(settings))
    return Starlette(
        routes=[*pages.routes(console), *control_pages.routes(controls)],
        middleware=middleware,
        lifespan=lifespan,
    )


def _control_pages(
    settings: ConsoleSettings, console: pages.Console, store: FeatureStoreSettings
) -> control_pages.ControlPages:
    """The Rules and Lists pages over the policy folder and the lists' online store."""
    return control_pages.ControlPages(
        console=console,
        controls=Controls(
            PolicyStore(settings.policy_path),
            store,
            EventLogSettings(var_dir=settings.var_dir),
            decisions_root=settings.decisions_path,
        ),
        controls_role=settings.controls_role,
        # Without tokens only on loopback, where the same person could run the commands.
        unauthenticated_may_change=is_loopback(settings.host),
        page_size=settings.entries_page_size,
    )


def _store_settings(settings: ConsoleSettings) -> FeatureStoreSettings:
    """The online store the lists live in: the features' settings (``FRAUD_FEATURES_*``, as
    the gateways read them), in the console's state folder unless they name their own."""
    found = FeatureStoreSettings()
    if "var_dir" in found.model_fields_set:
        return found
    return FeatureStoreSettings(var_dir=settings.var_dir)


def serve(settings: ConsoleSettings, edge: EdgeSettings) -> None:
    """Serves the console until SIGTERM or Ctrl-C (uvicorn finishes requests in flight)."""
    logs.configure("console", settings.log_level)
    check_exposure(settings, edge)
    app = create(settings, edge)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=str(edge.cert_file) if edge.tls else None,
        ssl_keyfile=str(edge.key_file) if edge.tls else None,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    log.info("console on %s://%s:%d", "https" if edge.tls else "http", settings.host, settings.port)
    uvicorn.Server(config).run()
