"""The updater process stops for a restart when its loop thread dies of a defect."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from services.eventlog import EventLogSettings
from services.featurestore.settings import FeatureStoreSettings
from services.updater import app as updater_app
from services.updater.app import UpdaterApp
from services.updater.metrics import UpdaterMetrics
from services.updater.settings import UpdaterSettings


class _Loop:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def run(self, stop: threading.Event) -> None:
        if self.error is not None:
            raise self.error


def _app(tmp_path: Path, loop: _Loop) -> UpdaterApp:
    app = UpdaterApp(
        UpdaterSettings(var_dir=tmp_path),
        FeatureStoreSettings(var_dir=tmp_path),
        EventLogSettings(var_dir=tmp_path),
        UpdaterMetrics(CollectorRegistry()),
    )
    app._loop = loop  # type: ignore[assignment]
    return app


def test_a_dead_loop_stops_the_process_and_marks_it_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(updater_app.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    app = _app(tmp_path, _Loop(RuntimeError("a defect")))
    app._run_loop()
    assert app.failed
    assert sent == [(updater_app.os.getpid(), signal.SIGTERM)]


def test_a_loop_that_ends_normally_stops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(updater_app.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    app = _app(tmp_path, _Loop(None))
    app._run_loop()
    assert not app.failed and sent == []
