"""A version's own trees in the gateway's process, for the reasons of its REVIEW and DECLINE
answers (``services.models.explain`` computes them; ``pipeline.py`` asks).

The explanation runs here rather than in the scorer: the score is already in hand when the
decision is known, so an approval costs nothing and an explanation that cannot finish in
the budget is simply left out; in the scorer it would hold up the model's answer itself
(docs/cascade.md, "Reasons from the model", has the measured costs).

A version with contribution tables (``services.models.treeshap``, every version this
project trains) is explained on the event loop itself: a fixed amount of array work, about
half a millisecond, where handing it to a thread and back cost the process about as much
again. A version the tables do not cover is explained by LightGBM on one worker thread,
one input at a time (LightGBM releases the interpreter while it walks the trees), and the
pipeline waits at most what the budget leaves; a call that finds the worker still busy
goes without rather than queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.gateway.ports import DependencyError
from services.models import repository
from services.models.explain import Explanation, TreeExplainer
from services.models.repository import ModelMetadata

log = logging.getLogger(__name__)

WARMUP_CALLS = 5
"""Explanations made on loading a version, so that the first answer pays no first-call cost."""


class _Worker:
    """The one thread that explains, and whether it is busy now."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain")
        self.busy = False

    def done(self, _: object) -> None:
        self.busy = False


class LocalExplainer:
    """One version's trees, explaining on the shared worker thread."""

    def __init__(self, trees: TreeExplainer, worker: _Worker) -> None:
        self._trees = trees
        self._worker = worker

    @property
    def trees(self) -> TreeExplainer:
        """The version's trees (synchronous use)."""
        return self._trees

    async def explain(self, vector: list[float], timeout_s: float) -> Explanation:
        """The explanation of ``vector``: from the tables at once; else within ``timeout_s``,
        DependencyError ``busy`` when the worker is taken, ``timeout`` when it is late (the
        work is then abandoned)."""
        if self._trees.tabulated:
            try:
                return self._trees.explain(vector)
            except Exception as error:
                raise DependencyError("explainer", "error", str(error)) from error
        worker = self._worker
        if worker.busy:
            raise DependencyError("explainer", "busy")
        worker.busy = True
        try:
            future = worker.executor.submit(self._trees.explain, vector)
        except RuntimeError as error:
            worker.busy = False
            raise DependencyError("explainer", "error", str(error)) from error
        future.add_done_callback(worker.done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError as error:
            raise DependencyError("explainer", "timeout") from error
        except Exception as error:
            raise DependencyError("explainer", "error", str(error)) from error


class LocalExplainerProvider:
    """Loads versions' trees into this process (off the event loop) and warms them."""

    def __init__(self, model_root: Path, warmup_calls: int = WARMUP_CALLS) -> None:
        self._model_root = model_root
        self._warmup_calls = warmup_calls
        self._worker = _Worker()

    def _load(self, metadata: ModelMetadata) -> TreeExplainer | None:
        folder = self._model_root / metadata.name / metadata.version
        trees = TreeExplainer.load(folder, metadata.feature_order, lean=True)
        if trees is not None:
            row: Sequence[float] = [metadata.default_features[n] for n in metadata.feature_order]
            for _ in range(self._warmup_calls):
                trees.explain(row)
        return trees

    async def prepare(self, metadata: ModelMetadata) -> LocalExplainer | None:
        """The version's explainer, loaded and warmed; None (logged) when it keeps no booster
        text or it cannot be loaded: its answers then carry the threshold-written reasons."""
        # The version folder's name is the plain version: checked before it becomes a path.
        repository.check_name("name", metadata.name)
        repository.check_version("version", metadata.version)
        loop = asyncio.get_running_loop()
        try:
            trees = await loop.run_in_executor(self._worker.executor, self._load, metadata)
        except Exception:
            log.exception(
                "cannot load the version's trees; its answers carry threshold-written reasons",
                extra={"version": metadata.version},
            )
            return None
        if trees is None:
            log.warning(
                "the version keeps no booster text; its answers carry threshold-written reasons",
                extra={"version": metadata.version},
            )
            return None
        return LocalExplainer(trees, self._worker)

    def close(self) -> None:
        """Stops the worker thread (an explanation under way is abandoned)."""
        self._worker.executor.shutdown(wait=False, cancel_futures=True)
