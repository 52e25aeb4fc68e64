"""Shadow scoring: a candidate scores live traffic after the answer is sent, for comparison.

The pipeline prepares a ``ShadowJob`` with each model answer while a shadow version is
routed; the servicer hands it to the ``ShadowQueue`` once the answer has gone out (the
RPC's done callback). A bounded queue and a worker task do the scoring (``ShadowScorer``,
which also records how the shadow compares with each answer); the worker lets jobs gather
for ``linger_s`` after the first, then scores every job waiting (up to ``max_batch``) in
one model call (``ShadowPolicy``), so shadowing costs one extra call per batch rather than
per answer. When the queue is full the job is dropped and counted, so shadow work can
never back up into the request path. Whatever happens to it, a job ends with a result or
None, and the answer it shadows has long been sent.

The shadow sees each transaction the way live does: with the cascade on, the shadow
version's small model approves its clear cases first and only the rest go to its model
(never on default features, where live's first stage passes too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import cast

from services.gateway.decision import Decision, decide
from services.gateway.metrics import GatewayMetrics
from services.gateway.ports import BatchModelClient, DependencyError
from services.gateway.routing import ModelRoute
from services.gateway.validate import Transaction

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShadowPolicy:
    """How much shadow scoring may take: queue, workers, batches, the model call's deadline."""

    size: int = 1000
    """Shadow jobs waiting at most; beyond it they are dropped."""
    workers: int = 1
    """Worker tasks, each scoring one batch at a time."""
    max_batch: int = 32
    """Most jobs a worker scores in one model call."""
    linger_s: float = 0.05
    """How long jobs gather before a batch is scored (fewer, larger model calls; nobody
    waits for a shadow result)."""
    timeout_s: float = 0.05
    """Deadline of a shadow model call."""


@dataclass(frozen=True, slots=True)
class ShadowResult:
    """What the shadow version said about one transaction."""

    version: str
    score: float
    decision: Decision
    latency_s: float
    first_stage: bool = False
    """Its small model approved the transaction at the cascade's first stage."""


class ShadowJob:
    """One answered transaction for the shadow version to score; resolves to its result."""

    __slots__ = (
        "_future",
        "answer_decision",
        "answer_score",
        "defaulted",
        "route",
        "store",
        "tx",
    )

    def __init__(
        self,
        route: ModelRoute,
        tx: Transaction,
        store: Mapping[str, float | None],
        answer_score: float,
        answer_decision: Decision,
        defaulted: bool = False,
    ) -> None:
        self.route = route
        self.tx = tx
        self.store = store
        self.defaulted = defaulted
        """The answer was given on default features: the shadow's first stage passes too."""
        self.answer_score = answer_score
        self.answer_decision = answer_decision
        self._future: asyncio.Future[ShadowResult | None] = (
            asyncio.get_running_loop().create_future()
        )

    @property
    def version(self) -> str:
        """The shadow version."""
        return self.route.version

    def resolve(self, result: ShadowResult | None) -> None:
        """Ends the job (None: dropped or failed); later calls are ignored."""
        if not self._future.done():
            self._future.set_result(result)

    def when_done(self, callback: Callable[[], object]) -> None:
        """Calls ``callback`` once the job has ended (scored, dropped or failed)."""
        self._future.add_done_callback(lambda _: callback())

    def result(self) -> ShadowResult | None:
        """The result if the job has ended with one, else None."""
        return self._future.result() if self._future.done() else None

    async def wait(self, timeout_s: float) -> ShadowResult | None:
        """The result, waiting at most ``timeout_s``; None if dropped, failed or still running."""
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self._future), timeout_s)
        return None


class ShadowQueue:
    """A bounded queue of shadow jobs and the worker tasks that score them."""

    def __init__(
        self,
        score: Callable[[list[ShadowJob]], Awaitable[None]],
        on_drop: Callable[[], None],
        policy: ShadowPolicy = ShadowPolicy(),
    ) -> None:
        self._score = score
        self._on_drop = on_drop
        self._queue: asyncio.Queue[ShadowJob] = asyncio.Queue(maxsize=policy.size)
        self._workers = policy.workers
        self._max_batch = policy.max_batch
        self._linger_s = policy.linger_s
        self._tasks: list[asyncio.Task[None]] = []

    def submit(self, job: ShadowJob) -> bool:
        """Queues ``job``; when the queue is full drops it (counted) and returns False."""
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._on_drop()
            job.resolve(None)
            return False
        return True

    @property
    def pending(self) -> int:
        """Jobs waiting in the queue."""
        return self._queue.qsize()

    def start(self) -> None:
        """Starts the worker tasks on the running loop."""
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    async def _work(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            if self._linger_s > 0 and self._queue.qsize() + 1 < self._max_batch:
                # Nobody waits for a shadow result: let a batch gather first.
                await asyncio.sleep(self._linger_s)
            while len(jobs) < self._max_batch and not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            try:
                await self._score(jobs)
            except Exception:
                log.exception("shadow scoring failed", extra={"jobs": len(jobs)})
            finally:
                for job in jobs:
                    job.resolve(None)
                    self._queue.task_done()

    async def close(self) -> None:
        """Stops the workers; queued jobs resolve to None."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        while not self._queue.empty():
            self._queue.get_nowait().resolve(None)


class ShadowScorer:
    """Scores shadow jobs, one model call per shadow version when its client takes batches,
    and records how the shadow compares with each answer."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        policy: ShadowPolicy = ShadowPolicy(),
        *,
        cascade: bool = False,
    ) -> None:
        self.metrics = metrics
        self.timeout_s = policy.timeout_s
        self.cascade = cascade
        """Whether the shadow's small model approves clear cases first, as live's does."""

    async def score(self, jobs: list[ShadowJob]) -> None:
        """Scores ``jobs`` and resolves each with its result (None when the call failed)."""
        by_route: dict[int, list[ShadowJob]] = {}
        for job in jobs:
            by_route.setdefault(id(job.route), []).append(job)
        for group in by_route.values():
            await self._score_group(group[0].route, group)

    async def _score_group(self, route: ModelRoute, jobs: list[ShadowJob]) -> None:
        vectors = [route.vector(job.tx, job.store) for job in jobs]
        m = self.metrics
        t = route.thresholds
        rest = list(range(len(jobs)))
        small = route.small
        if self.cascade and small is not None:
            rest = []
            for i, vector in enumerate(vectors):
                if jobs[i].defaulted:
                    # As live: no clear approval on default features.
                    rest.append(i)
                    continue
                started = time.perf_counter()
                try:
                    score = small.score(vector)
                except Exception:
                    m.shadow_errors.labels(route.version, "small_model").inc()
                    rest.append(i)
                    continue
                if score >= route.clear_approve:
                    rest.append(i)
                    continue
                latency = time.perf_counter() - started
                self._resolve(route, jobs[i], score, Decision.APPROVE, latency, first_stage=True)
        if not rest:
            return
        client = route.client
        batch = getattr(client, "score_batch", None)
        started = time.perf_counter()
        try:
            if batch is not None and len(rest) > 1:
                scores = await cast(BatchModelClient, client).score_batch(
                    [vectors[i] for i in rest], self.timeout_s
                )
            else:
                scores = [await client.score(vectors[i], self.timeout_s) for i in rest]
        except DependencyError as error:
            m.shadow_errors.labels(route.version, error.reason).inc(len(rest))
            for i in rest:
                jobs[i].resolve(None)
            return
        latency = time.perf_counter() - started
        for i, score in zip(rest, scores, strict=True):
            self._resolve(route, jobs[i], score, decide(score, t.review, t.decline), latency)

    def _resolve(
        self,
        route: ModelRoute,
        job: ShadowJob,
        score: float,
        decision: Decision,
        latency: float,
        *,
        first_stage: bool = False,
    ) -> None:
        """Records how the shadow compares with the answer and ends the job with its result."""
        m = self.metrics
        m.shadow_latency.labels(route.version).observe(latency)
        m.shadow_score_diff.labels(route.version).observe(score - job.answer_score)
        m.shadow_decisions.labels(route.version, job.answer_decision.value, decision.value).inc()
        job.resolve(ShadowResult(route.version, score, decision, latency, first_stage))
