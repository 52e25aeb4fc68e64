"""The scorer's model registry: every version it serves at once, loaded and unloaded at run
time, following the lifecycle file beside the models.

The registry keeps loaded what the lifecycle routes traffic to (live, canary, shadow) and
the rollback target, so a promotion or a rollback only changes which loaded version
answers. It polls the lifecycle file's identity (one ``stat``) and, when it changed,
loads and warms the versions that became needed before anything routes to them, and
unloads versions that are no longer needed once ``unload_grace_s`` has passed (gateways
that still route to one for a moment keep being answered). Versions loaded explicitly
(``RepositoryModelLoad``) outside the lifecycle stay until unloaded explicitly.

Loading runs ONNX Runtime's session creation and the warm-up in a worker thread, so the
event loop keeps answering meanwhile. Transport-free: the servicer converts protos.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import FailedPrecondition, NotFound
from services.domain.validation import shown
from services.models import repository
from services.models.lifecycle import FileKey, LifecycleState, ModelLifecycle, Routing
from services.models.onnx import OnnxModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One published version as the repository index reports it."""

    version: str
    state: str
    """READY (loaded), LOADING or UNAVAILABLE (not loaded)."""
    reason: str
    """The lifecycle state and traffic share, e.g. ``canary 20%``."""


class ModelRegistry:
    """The loaded versions of one model and which one answers requests without a version."""

    def __init__(
        self,
        model_root: Path,
        name: str,
        *,
        threads: int = 1,
        warmup_calls: int = 50,
        pinned_version: str | None = None,
        unload_grace_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.model_root = model_root
        self.lifecycle = ModelLifecycle(model_root, name)
        self._threads = threads
        self._warmup_calls = warmup_calls
        self._pinned_version = pinned_version
        self._grace_s = unload_grace_s
        self._clock = clock
        self._models: dict[str, OnnxModel] = {}
        self._explicit: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._leaving: dict[str, float] = {}
        self._file_key: FileKey | None = None
        self._state: LifecycleState | None = None
        self.routing = Routing()

    # Lookups on the request path -------------------------------------------------------

    @property
    def default_version(self) -> str | None:
        """The version that answers requests naming none: the pinned one, else live."""
        return self._pinned_version or self.routing.live

    def get(self, name: str, version: str) -> OnnxModel:
        """The loaded model for (name, version); an empty version means the default."""
        if name != self.name:
            raise NotFound(f"model {shown(name)} is not served here (serving {self.name!r})")
        wanted = version or self.default_version
        model = self._models.get(wanted) if wanted else None
        if model is None:
            loaded = ", ".join(self.loaded()) or "none"
            raise NotFound(
                f"version {shown(wanted or '')} of {self.name!r} is not loaded (loaded: {loaded}); "
                "load it with RepositoryModelLoad"
            )
        return model

    def ready(self, name: str, version: str) -> bool:
        """Whether (name, version) would be answered now."""
        try:
            self.get(name, version)
        except NotFound:
            return False
        return True

    def loaded(self) -> list[str]:
        """Loaded versions, in increasing order."""
        return sorted(self._models, key=_order)

    # Loading and unloading ---------------------------------------------------------------

    async def start(self) -> None:
        """Loads every version the lifecycle needs; the default one must load."""
        await self.refresh(force=True)
        default = self.default_version
        if default is None:
            raise FailedPrecondition(
                f"no model {self.name!r} is published under {self.model_root}: "
                "run `fraudmesh train`"
            )
        if default not in self._models:
            await self.load(default)

    async def load(self, version: str, explicit: bool = False) -> OnnxModel:
        """Loads and warms ``version`` unless loaded; concurrent calls share one load.

        A version that is not a plain version number is InvalidArgument and one that is
        not published NotFound, both decided before anything but the model's own folder
        listing is read: a client's version never becomes a path to look up.
        """
        repository.check_version("version", version)
        if version not in self._models:
            self._check_published(version)
        lock = self._locks.setdefault(version, asyncio.Lock())
        async with lock:
            model = self._models.get(version)
            if model is None:
                loop = asyncio.get_running_loop()
                started = time.perf_counter()
                try:
                    model = await loop.run_in_executor(None, self._load_sync, version)
                except FileNotFoundError as error:
                    # Published a moment ago, gone now (deleted by hand): as if never there.
                    raise self._not_published(version) from error
                self._models[version] = model
                log.info(
                    "model version loaded",
                    extra={
                        "model": self.name,
                        "version": version,
                        "seconds": round(time.perf_counter() - started, 3),
                    },
                )
            self._leaving.pop(version, None)
            if explicit and version not in self.routing.kept_loaded():
                self._explicit.add(version)
            return model

    def _check_published(self, version: str) -> None:
        """Raises NotFound unless ``version`` is in the model folder's listing."""
        if version not in repository.published_versions(self.model_root, self.name):
            raise self._not_published(version)

    def _not_published(self, version: str) -> NotFound:
        published = repository.published_versions(self.model_root, self.name)
        return NotFound(
            f"version {shown(version)} of {self.name!r} is not published "
            f"(published: {', '.join(published) or 'none'})"
        )

    def _load_sync(self, version: str) -> OnnxModel:
        metadata, folder = repository.load(self.model_root, self.name, version)
        model = OnnxModel(metadata, folder, self._threads)
        model.warm_up(self._warmup_calls)
        return model

    def unload(self, version: str) -> bool:
        """Unloads ``version`` now; refuses while the lifecycle routes traffic to it.
        Returns False when it was published but not loaded; a version that is neither is
        NotFound, and one that is not a plain version number InvalidArgument. Calls
        holding it finish normally."""
        repository.check_version("version", version)
        if version not in self._models:
            self._check_published(version)
        if version in self.routing.routed() or version == self.default_version:
            raise FailedPrecondition(
                f"version {version} of {self.name!r} carries traffic; retire it or roll "
                "back first (`fraudmesh model retire|rollback`)"
            )
        self._explicit.discard(version)
        self._leaving.pop(version, None)
        model = self._models.pop(version, None)
        if model is not None:
            log.info("model version unloaded", extra={"model": self.name, "version": version})
        return model is not None

    def unload_idle(self) -> list[str]:
        """Unloads every loaded version that carries no traffic; returns them."""
        idle = [
            v for v in self.loaded() if v not in self.routing.routed() and v != self.default_version
        ]
        for version in idle:
            self.unload(version)
        return idle

    async def refresh(self, force: bool = False) -> None:
        """Follows the lifecycle file: loads newly needed versions, and unloads versions
        no longer needed once the grace period has passed."""
        key = self.lifecycle.file_key()
        if force or key != self._file_key or self._state is None:
            loop = asyncio.get_running_loop()
            state = await loop.run_in_executor(None, self.lifecycle.read)
            self._file_key = key
            self._state = state
            self.routing = state.routing
            for version in state.routing.kept_loaded():
                if version not in self._models:
                    try:
                        await self.load(version)
                    except Exception:
                        log.exception(
                            "cannot load a version the lifecycle needs",
                            extra={"model": self.name, "version": version},
                        )
        self._expire()

    def _expire(self) -> None:
        now = self._clock()
        keep = set(self.routing.kept_loaded()) | self._explicit
        if self.default_version:
            keep.add(self.default_version)
        for version in list(self._models):
            if version in keep:
                self._leaving.pop(version, None)
                continue
            since = self._leaving.setdefault(version, now)
            if now - since >= self._grace_s:
                self._leaving.pop(version, None)
                self._models.pop(version, None)
                log.info(
                    "model version unloaded: no longer needed",
                    extra={"model": self.name, "version": version},
                )

    async def follow(self, poll_s: float) -> None:
        """Polls the lifecycle file every ``poll_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(poll_s)
            try:
                await self.refresh()
            except Exception:
                log.exception("cannot follow the lifecycle file", extra={"model": self.name})

    # The repository index ----------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every published version, loaded or not, with its lifecycle state."""
        state = self._state or self.lifecycle.read()
        published = repository.published_versions(self.model_root, self.name)
        versions = sorted(set(published) | set(self._models), key=_order)
        entries = []
        for version in versions:
            if version in self._models:
                load_state = "READY"
            elif (lock := self._locks.get(version)) is not None and lock.locked():
                load_state = "LOADING"
            else:
                load_state = "UNAVAILABLE"
            if ready_only and load_state != "READY":
                continue
            record = state.versions.get(version)
            reason = record.state.value if record else "unknown to the lifecycle"
            traffic = state.traffic(version)
            if traffic != "-":
                reason = f"{reason} {traffic}"
            entries.append(IndexEntry(version, load_state, reason))
        return entries


def _order(version: str) -> tuple[int, str]:
    return (
        (int(version), version) if version.isascii() and version.isdigit() else (1 << 62, version)
    )
