"""The published versions the monitor judges traffic by: metadata and reference, read once.

A version folder never changes once published, so what was read stays true. A version that
is not (or not yet) in the repository, the rules fallback's ``rules-…`` for one, has no
reference: its traffic is counted without drift figures, and the repository is asked again
after ``retry_s`` in case the version was published meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.eventlog.events import feature_schema_id
from services.models import reference as references
from services.models import repository
from services.monitor.tally import Layout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Known:
    """What the monitor knows of one version."""

    metadata: repository.ModelMetadata | None
    layout: Layout


class ReferenceBook:
    """Versions' metadata and references from the model repository, cached."""

    def __init__(
        self,
        model_root: Path,
        model_name: str,
        retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_root = model_root
        self.model_name = model_name
        self.retry_s = retry_s
        self._clock = clock
        self._known: dict[str, Known] = {}
        self._missing: dict[str, float] = {}
        self.orders: dict[str, tuple[str, ...]] = {}
        """Feature orders by schema fingerprint (``DecisionEvent.feature_schema``)."""

    def get(self, version: str) -> Known:
        """The version's metadata and layout (without a reference when it has none)."""
        known = self._known.get(version)
        if known is not None:
            return known
        if repository.version_problem(version) is not None:
            # Not a published version's number (the rules fallback's ``rules-…``): no
            # folder to read, and an event's text never becomes a path.
            return Known(None, Layout.of(None))
        failed_at = self._missing.get(version)
        if failed_at is not None and self._clock() - failed_at < self.retry_s:
            return Known(None, Layout.of(None))
        try:
            metadata, folder = repository.load(self.model_root, self.model_name, version)
            reference = references.load(folder)
        except (repository.ModelNotFoundError, ValueError, OSError) as error:
            if failed_at is None:
                log.info("no reference for version %s: %s", version, error)
            self._missing[version] = self._clock()
            return Known(None, Layout.of(None))
        if reference is None:
            log.warning("version %s has no reference: its traffic has no drift figures", version)
        known = Known(metadata, Layout.of(reference))
        self._known[version] = known
        self._missing.pop(version, None)
        order = tuple(metadata.feature_order)
        self.orders[feature_schema_id(order)] = order
        return known
