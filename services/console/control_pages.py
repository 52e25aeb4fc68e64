"""The HTTP edge of the fraud team's controls: the Rules page (the live policy, its rules and
per-merchant thresholds, every version and change; publish, backtest, promote and roll back) and the Lists page
(every entry; add and remove).

Every change is a POST with the page's CSRF token (``Console.checked_form``), made by someone
who may change the controls (``identity.controls_refusal``), through the same functions the
``fraudmesh rules`` and ``fraudmesh lists`` commands use (``controls``). What is read, checked
or changed is decided there; this module turns requests into calls and answers into pages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from services.common.errors import FailedPrecondition, FraudmeshError, InvalidArgument, NotFound
from services.console import csrf, identity
from services.console.controls import (
    BACKTEST_DAYS,
    MAX_BACKTEST_DAYS,
    MAX_POLICY_CHARS,
    Controls,
    ControlsUnavailable,
    EntriesFilter,
    NewEntry,
    RulesView,
    form_text,
    parse_entry_form,
    parse_entry_key,
)
from services.console.models import read_models
from services.console.pages import Console
from services.domain import policy as policy_domain
from services.domain.lists import ListKind, ListName, parse_kind, parse_list
from services.models.policies import CorruptPolicyState

log = logging.getLogger(__name__)

LIST_KINDS = tuple(k.value for k in ListKind)
"""The kinds the add form offers."""
LIST_NAMES = tuple(n.value for n in ListName)
"""The lists the add form offers."""


def _status(error: Exception) -> int:
    """The HTTP status of a refused change: bad input, a conflict, or a store away."""
    if isinstance(error, ControlsUnavailable | CorruptPolicyState | OSError):
        return 503
    if isinstance(error, InvalidArgument | NotFound | policy_domain.PolicyError):
        return 400
    if isinstance(error, FailedPrecondition):
        return 409
    return 500


def _message(error: Exception) -> str:
    return error.message if isinstance(error, FraudmeshError) else str(error)


@dataclass
class ControlPages:
    """The Rules and Lists pages over one console and its controls."""

    console: Console
    controls: Controls
    controls_role: str
    unauthenticated_may_change: bool
    """Without tokens, whether whoever reaches the console may change (loopback only)."""
    page_size: int

    def change_refusal(self, request: Request) -> str | None:
        """Why this request's principal may not change the controls (None: they may)."""
        return identity.controls_refusal(
            self.console.principal(request), self.controls_role, self.unauthenticated_may_change
        )

    async def _change_form(self, request: Request) -> tuple[FormData | None, Response | None]:
        """The form of a change, once its CSRF token and its sender's role are right."""
        form, refusal = await self.console.checked_form(request)
        if refusal is not None:
            return None, refusal
        reason = self.change_refusal(request)
        if reason is not None:
            status = 400 if self.console.principal(request) is None else 403
            log.warning("refused a change at %s: %s", request.url.path, reason)
            return None, self.console.refused(request, status, "Not changed", reason)
        return form, None

    def _actor(self, request: Request) -> str:
        principal = self.console.principal(request)
        assert principal is not None  # _change_form refused a request without one
        return principal.name

    # -- rules --------------------------------------------------------------------------

    async def rules_page(self, request: Request) -> Response:
        """The live policy (or ``?version=N``), its rules and thresholds, every version."""
        version = request.query_params.get("version", "").strip() or None
        status, problem = 200, None
        try:
            view = await asyncio.to_thread(self.controls.rules, version)
        except (FraudmeshError, OSError) as error:
            status, problem = _status(error), _message(error)
            view = await self._live_view() if version else RulesView(None, None)
        models = await asyncio.to_thread(
            read_models, self.console.model_root, self.console.model_name, 0
        )
        serving = [v for v in models.versions if v.state in ("live", "canary")]
        return self.console.render(
            request,
            "rules.html",
            {
                "view": view,
                "problem": problem,
                "serving": serving,
                "change_refusal": self.change_refusal(request),
                "next": "/rules",
            },
            status,
        )

    async def _live_view(self) -> RulesView:
        """The live version's view after a bad ``?version=``; empty when that fails too."""
        try:
            return await asyncio.to_thread(self.controls.rules, None)
        except (FraudmeshError, OSError):
            return RulesView(None, None)

    async def publish(self, request: Request) -> Response:
        """Stores a policy written in the page as the next version, a candidate, as
        ``fraudmesh rules publish`` does; a policy that does not check is refused naming the
        rule and the field, and nothing is stored."""
        form, refusal = await self._change_form(request)
        if refusal is not None:
            return refusal
        assert form is not None
        try:
            text = form_text(form, "policy", max_chars=MAX_POLICY_CHARS)
            version = await asyncio.to_thread(self.controls.publish, text, self._actor(request))
        except (FraudmeshError, policy_domain.PolicyError, OSError) as error:
            return self.console.refused(request, _status(error), "Not published", _message(error))
        log.info("policy published", extra={"version": version, "by": self._actor(request)})
        return RedirectResponse(f"/rules?version={version}", status_code=303)

    async def backtest_page(self, request: Request) -> Response:
        """What a published version would have done to the decision log's payments of the
        last ``?days=`` (30 by default), by their outcomes: per rule and for the whole policy,
        as ``fraudmesh rules backtest`` reports it. It reads and changes nothing else."""
        version = request.query_params.get("version", "").strip()
        days_text = request.query_params.get("days", str(BACKTEST_DAYS)).strip()
        status, problem, report = 200, None, None
        try:
            if not version:
                raise InvalidArgument("version", "is required")
            if not (days_text.isascii() and days_text.isdigit()) or not (
                1 <= int(days_text) <= MAX_BACKTEST_DAYS
            ):
                raise InvalidArgument("days", f"must be a whole number 1..{MAX_BACKTEST_DAYS}")
            days = int(days_text)
            now = datetime.now(UTC)
            report = await asyncio.to_thread(self.controls.backtest, version, days, now)
        except (FraudmeshError, policy_domain.PolicyError, OSError) as error:
            status, problem = _status(error), _message(error)
        return self.console.render(
            request,
            "backtest.html",
            {
                "version": version[:32],
                "days": days_text[:8],
                "report": report,
                "problem": problem,
                "next": "/rules",
            },
            status,
        )

    async def promote(self, request: Request) -> Response:
        """Makes a version live, as ``fraudmesh rules promote`` does."""
        form, refusal = await self._change_form(request)
        if refusal is not None:
            return refusal
        assert form is not None
        try:
            version = form_text(form, "version")
            await asyncio.to_thread(self.controls.promote, version, self._actor(request))
        except (FraudmeshError, policy_domain.PolicyError, OSError) as error:
            return self.console.refused(request, _status(error), "Not promoted", _message(error))
        log.info("policy promoted", extra={"version": version, "by": self._actor(request)})
        return RedirectResponse("/rules", status_code=303)

    async def rollback(self, request: Request) -> Response:
        """Makes live again what was live before, as ``fraudmesh rules rollback`` does."""
        _, refusal = await self._change_form(request)
        if refusal is not None:
            return refusal
        try:
            live = await asyncio.to_thread(self.controls.rollback, self._actor(request))
        except (FraudmeshError, OSError) as error:
            return self.console.refused(request, _status(error), "Not rolled back", _message(error))
        log.info("policy rolled back", extra={"version": live, "by": self._actor(request)})
        return RedirectResponse("/rules", status_code=303)

    # -- lists --------------------------------------------------------------------------

    def _filter(self, request: Request, problems: list[str]) -> tuple[EntriesFilter, int]:
        query = request.query_params
        where = EntriesFilter()
        try:
            text = query.get("value", "").strip()
            if len(text) > 128:
                raise InvalidArgument("value", "is longer than 128 characters")
            where = EntriesFilter(
                list=parse_list(query["list"]) if query.get("list") else None,
                kind=parse_kind(query["kind"]) if query.get("kind") else None,
                value=text,
            )
        except InvalidArgument as error:
            problems.append(error.message)
        page = query.get("page", "1")
        if page.isascii() and page.isdigit() and 1 <= int(page) <= 1_000_000:
            return where, int(page)
        problems.append(f"page {page[:32]!r} is not a page number")
        return where, 1

    async def lists_page(self, request: Request) -> Response:
        """Every list's entries, filtered and paged, newest first."""
        problems: list[str] = []
        where, page_number = self._filter(request, problems)
        return await self._lists(request, where, page_number, problems, 400 if problems else 200)

    async def _lists(
        self,
        request: Request,
        where: EntriesFilter,
        page_number: int,
        problems: list[str],
        status: int,
        notice: str | None = None,
        given: dict[str, str] | None = None,
    ) -> Response:
        offset = (page_number - 1) * self.page_size
        try:
            page = await asyncio.to_thread(self.controls.entries, where, offset, self.page_size)
        except ControlsUnavailable as error:
            page, status = None, 503
            problems = [*problems, error.message]
        matching = page.matching if page else 0
        query = {k: v for k, v in request.query_params.items() if k != "page"}
        return self.console.render(
            request,
            "lists.html",
            {
                "page": page,
                "where": where,
                "query": query if request.method == "GET" else {},
                "page_number": page_number,
                "pages": max(1, -(-matching // self.page_size)),
                "problems": problems,
                "notice": notice,
                "given": given or {},
                "kinds": LIST_KINDS,
                "names": LIST_NAMES,
                "now": time.time(),
                "change_refusal": self.change_refusal(request),
                "next": "/lists",
            },
            status,
        )

    async def add_entry(self, request: Request) -> Response:
        """Puts an entry on a list, as ``fraudmesh lists add`` does (idempotent)."""
        form, refusal = await self._change_form(request)
        if refusal is not None:
            return refusal
        assert form is not None
        given = {k: v[:200] for k, v in form.items() if isinstance(v, str) and k != csrf.FIELD}
        try:
            new: NewEntry = parse_entry_form(form)
            changed = await asyncio.to_thread(
                self.controls.add, new, self._actor(request), time.time()
            )
        except (InvalidArgument, ControlsUnavailable) as error:
            status = _status(error)
            return await self._lists(
                request, EntriesFilter(), 1, [error.message], status, None, given
            )
        what = f"{new.kind.value} {new.value} on the {new.list.value} list"
        log.info("list entry added", extra={"entry": what, "changed": changed})
        notice = f"added {what}" if changed else f"unchanged: {what} already, as given"
        return await self._lists(request, EntriesFilter(), 1, [], 200, notice)

    async def remove_entry(self, request: Request) -> Response:
        """Takes an entry off its list, as ``fraudmesh lists remove`` does."""
        form, refusal = await self._change_form(request)
        if refusal is not None:
            return refusal
        assert form is not None
        try:
            name, kind, value = parse_entry_key(form)
            removed = await asyncio.to_thread(
                self.controls.remove, name, kind, value, self._actor(request)
            )
        except (InvalidArgument, ControlsUnavailable) as error:
            return await self._lists(request, EntriesFilter(), 1, [error.message], _status(error))
        what = f"{kind.value} {value} from the {name.value} list"
        if not removed:
            problem = f"{kind.value} {value} is not on the {name.value} list"
            return await self._lists(request, EntriesFilter(), 1, [problem], 409)
        log.info("list entry removed", extra={"entry": what})
        return await self._lists(request, EntriesFilter(), 1, [], 200, f"removed {what}")


def routes(pages: ControlPages) -> list[Route]:
    """The controls' routes."""
    return [
        Route("/rules", pages.rules_page, name="rules"),
        Route("/rules/backtest", pages.backtest_page, name="rules-backtest"),
        Route("/rules/publish", pages.publish, methods=["POST"], name="rules-publish"),
        Route("/rules/promote", pages.promote, methods=["POST"], name="rules-promote"),
        Route("/rules/rollback", pages.rollback, methods=["POST"], name="rules-rollback"),
        Route("/lists", pages.lists_page, name="lists"),
        Route("/lists/add", pages.add_entry, methods=["POST"], name="lists-add"),
        Route("/lists/remove", pages.remove_entry, methods=["POST"], name="lists-remove"),
    ]
