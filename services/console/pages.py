"""The console's HTTP edge: each handler turns a request into a call of the domain modules and
their answer into a page (or, for htmx, the part of a page that changed). Nothing else lives
here: what is read, checked or sent is decided by ``reviews``, ``verdicts``, ``csrf``,
``identity``, ``models`` and ``overview``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from services.console import csrf, identity, overview
from services.console.models import METRICS, read_models
from services.console.reviews import DecisionLogView, QueueFilter
from services.console.sources import MonitorSource, PrometheusSource, SourceUnavailable
from services.console.verdicts import (
    Given,
    OutcomeReporter,
    RecentVerdicts,
    ReportFailed,
    VerdictRejected,
    parse_verdict,
)
from services.domain.validation import id_problem

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
VENDOR_FILES = ("vendor/htmx.min.js",)
"""Assets ``make install`` puts under ``static/`` (from the pinned npm packages)."""


def _utc(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters["utc"] = _utc
    templates.env.filters["epoch_utc"] = lambda s: _utc(datetime.fromtimestamp(s, UTC))
    templates.env.globals["metric_labels"] = dict(METRICS)
    templates.env.globals["breaker_states"] = overview.BREAKER_STATES
    return templates


@dataclass
class Console:
    """What the handlers use: the domain objects and sources, built once by ``app.create``."""

    view: DecisionLogView
    reporter: OutcomeReporter
    prometheus: PrometheusSource
    monitor: MonitorSource
    csrf: csrf.Csrf
    verifier: identity.TokenVerifier | None
    model_root: Path
    model_name: str
    page_size: int
    secure_cookies: bool
    recent: RecentVerdicts

    def __post_init__(self) -> None:
        self.templates = _templates()

    # -- helpers ------------------------------------------------------------------------

    def principal(self, request: Request) -> identity.Principal | None:
        """Who makes the request: the verified token's subject, or the typed-in name (None
        when no name was given yet)."""
        verified: identity.Principal | None = getattr(request.state, "principal", None)
        if verified is not None:
            return verified
        name = request.cookies.get(identity.ANALYST_COOKIE, "")
        if name and identity.analyst_name_problem(name) is None:
            return identity.Principal(name.strip())
        return None

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """A page with the CSRF token of the browser's cookie (set when it has none)."""
        cookie = request.cookies.get(csrf.COOKIE)
        fresh = not cookie
        if not cookie:
            cookie = csrf.Csrf.new_cookie()
        response = self.templates.TemplateResponse(
            request,
            template,
            {
                "csrf_field": csrf.FIELD,
                "csrf_token": self.csrf.token(cookie),
                "principal": self.principal(request),
                "authenticated": self.verifier is not None,
                "path": request.url.path,
                **context,
            },
            status_code=status,
        )
        if fresh:
            response.set_cookie(
                csrf.COOKIE,
                cookie,
                httponly=True,
                samesite="strict",
                secure=self.secure_cookies,
                path="/",
            )
        return response

    def refused(self, request: Request, status: int, title: str, reason: str) -> Response:
        """A refusal page (or fragment for htmx) saying why."""
        if not _htmx(request):
            return self.render(request, "refused.html", {"title": title, "reason": reason}, status)
        response = self.render(
            request, "refused_notice.html", {"title": title, "reason": reason}, status
        )
        # The reason goes where the page shows notices; the form stays as it was.
        response.headers["HX-Retarget"] = "#notices"
        response.headers["HX-Reswap"] = "innerHTML"
        return response

    async def checked_form(self, request: Request) -> tuple[FormData | None, Response | None]:
        """The request's form if its CSRF token is right; else the refusal to answer with."""
        form = await request.form()
        token = form.get(csrf.FIELD) or request.headers.get(csrf.HEADER)
        own_origin = f"{request.url.scheme}://{request.url.netloc}"
        reason = self.csrf.refusal(
            request.cookies.get(csrf.COOKIE),
            token if isinstance(token, str) else None,
            {k.lower(): v for k, v in request.headers.items()},
            own_origin,
        )
        if reason is not None:
            log.warning("refused a POST to %s: %s", request.url.path, reason)
            return None, self.refused(request, 403, "Refused", reason)
        return form, None

    # -- pages --------------------------------------------------------------------------

    async def overview_page(self, request: Request) -> Response:
        """The mesh's health from Prometheus."""
        data = await overview.load(self.prometheus)
        template = "overview_figures.html" if _htmx(request) else "overview.html"
        return self.render(
            request,
            template,
            {"data": data, "figures": overview.FIGURES, "breakdowns": overview.BREAKDOWNS},
        )

    async def models_page(self, request: Request) -> Response:
        """Versions and states from the lifecycle; drift and live quality from the monitor."""
        models = await asyncio.to_thread(read_models, self.model_root, self.model_name)
        try:
            quality, quality_problem = await self.monitor.quality(), None
        except SourceUnavailable as error:
            quality, quality_problem = {}, str(error)
        return self.render(
            request,
            "models.html",
            {
                "models": models,
                "quality": quality,
                "quality_problem": quality_problem,
                "monitor_where": self.monitor.where,
            },
        )

    async def reviews_page(self, request: Request) -> Response:
        """The review queue, filtered and paged."""
        query = request.query_params
        problems: list[str] = []
        since = _parse_time(query.get("since", ""), "since", problems)
        until = _parse_time(query.get("until", ""), "until", problems)
        where = QueueFilter(
            card_id=query.get("card_id", "").strip(),
            merchant_id=query.get("merchant_id", "").strip(),
            model_version=query.get("model_version", "").strip(),
            since=since,
            until=until,
        )
        for name in ("card_id", "merchant_id", "model_version"):
            value = getattr(where, name)
            problem = id_problem(value, required=False)
            if problem is not None:
                problems.append(f"{name} {problem}")
        page_number = _page_number(query.get("page", "1"), problems)
        if problems:
            where = QueueFilter()
        offset = (page_number - 1) * self.page_size
        page = await asyncio.to_thread(
            self.view.queue, where, offset, self.page_size, self.recent.transaction_ids()
        )
        pages = max(1, -(-page.matching // self.page_size))
        return self.render(
            request,
            "reviews.html",
            {
                "page": page,
                "where": where,
                "query": {k: v for k, v in query.items() if k != "page"},
                "page_number": page_number,
                "pages": pages,
                "problems": problems,
                "recent": self._recent_list(),
                "next": str(request.url.path)
                + (f"?{request.url.query}" if request.url.query else ""),
                "since_text": query.get("since", ""),
                "until_text": query.get("until", ""),
            },
            400 if problems else 200,
        )

    def _recent_list(self) -> list[Given]:
        given = [g for t in self.recent.transaction_ids() if (g := self.recent.get(t))]
        return sorted(given, key=lambda g: g.at_s, reverse=True)[:20]

    async def decision_page(self, request: Request) -> Response:
        """Lookup by transaction id."""
        transaction_id = request.query_params.get("transaction_id", "").strip()
        problem = id_problem(transaction_id, required=False)
        decision = None
        if transaction_id and problem is None:
            decision = await asyncio.to_thread(self.view.lookup, transaction_id)
        return self.render(
            request,
            "decision.html",
            {
                "transaction_id": transaction_id,
                "problem": f"transaction_id {problem}" if problem else None,
                "decision": decision,
                "given": self.recent.get(transaction_id) if transaction_id else None,
                "lookup_days": self.view.lookup_days,
                "next": f"/decisions?{urllib.parse.urlencode({'transaction_id': transaction_id})}",
            },
            400 if problem else 200,
        )

    async def set_analyst(self, request: Request) -> Response:
        """Without authentication: remember the name this browser's verdicts are recorded
        under (a cookie; the name is the analyst's word, not a proven identity)."""
        form, refusal = await self.checked_form(request)
        if refusal is not None:
            return refusal
        assert form is not None
        if self.verifier is not None:
            return self.refused(
                request, 400, "Not needed", "the name comes from your sign-in token"
            )
        name = str(form.get("analyst", "")).strip()
        problem = identity.analyst_name_problem(name)
        if problem is not None:
            return self.refused(request, 400, "Name not taken", f"the name {problem}")
        response = RedirectResponse(_local(str(form.get("next", ""))), status_code=303)
        response.set_cookie(
            identity.ANALYST_COOKIE,
            name,
            httponly=True,
            samesite="strict",
            secure=self.secure_cookies,
            path="/",
        )
        return response

    async def verdict(self, request: Request) -> Response:
        """An analyst's verdict: reported as an outcome of source ANALYST, by who gave it."""
        form, refusal = await self.checked_form(request)
        if refusal is not None:
            return refusal
        assert form is not None
        principal = self.principal(request)
        if principal is None:
            return self.refused(
                request, 400, "Who are you?", "give your name before your first verdict"
            )
        try:
            transaction_id, verdict = parse_verdict(
                str(form.get("transaction_id", "")), str(form.get("verdict", ""))
            )
            event_id = await self.reporter.report(
                transaction_id, verdict, principal.name, principal.token
            )
        except VerdictRejected as error:
            return self.refused(request, 400, "Verdict not taken", str(error))
        except ReportFailed as error:
            return self.refused(request, 503, "Verdict not recorded", str(error))
        given = Given(transaction_id, verdict, principal.name, event_id, time.time())
        self.recent.add(given)
        log.info(
            "verdict reported",
            extra={"tx": transaction_id, "verdict": verdict.value, "event_id": event_id},
        )
        if _htmx(request):
            return self.render(request, "judged.html", {"given": given})
        return RedirectResponse(_local(str(form.get("next", ""))), status_code=303)


def _htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def _local(target: str) -> str:
    """A redirect target that stays on this console (a path), else the queue."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/reviews"


def _parse_time(text: str, name: str, problems: list[str]) -> datetime | None:
    text = text.strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        problems.append(f"{name} {text[:32]!r} is not a time (YYYY-MM-DDTHH:MM, UTC)")
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _page_number(text: str, problems: list[str]) -> int:
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 1_000_000:
        return int(text)
    problems.append(f"page {text[:32]!r} is not a page number")
    return 1


async def healthz(request: Request) -> Response:
    """Liveness and readiness: the console answers."""
    return PlainTextResponse("ok")


def routes(console: Console) -> list[Route | Mount]:
    """Every route of the console."""
    return [
        Route("/", console.overview_page, name="overview"),
        Route("/models", console.models_page, name="models"),
        Route("/reviews", console.reviews_page, name="reviews"),
        Route("/reviews/verdict", console.verdict, methods=["POST"], name="verdict"),
        Route("/analyst", console.set_analyst, methods=["POST"], name="analyst"),
        Route("/decisions", console.decision_page, name="decisions"),
        Route("/healthz", healthz, name="healthz"),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
