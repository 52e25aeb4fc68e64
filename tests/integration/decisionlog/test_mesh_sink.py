"""The mesh runs the decision sink: it is ready with the rest, and when the mesh stops (after
the gateways) it writes what is on the mesh's event log before it exits cleanly."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from services.common.settings import to_env
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings, open_producer
from tests.integration.conftest import start_mesh
from tests.integration.decisionlog.conftest import written_ids
from tests.integration.decisionlog.sample import decision

pytestmark = pytest.mark.integration


def test_the_mesh_runs_the_sink(prepared_env: Any, tmp_path: Path) -> None:
    topic = f"mesh-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "decisions"
    env = {
        **to_env(EventLogSettings, topic=topic),
        # No flush by time before the stop: the stop itself must write the events.
        **to_env(DecisionLogSettings, root=root, flush_interval_s=300),
    }
    mesh = start_mesh(prepared_env, tmp_path / "logs", **env)
    try:
        sink = mesh.processes["decisionlog"]
        assert sink.alive()
        producer = open_producer(EventLogSettings(var_dir=prepared_env.var_dir, topic=topic))
        for i in range(50):
            producer.append(decision(i))
        producer.close()
    finally:
        mesh.stop()
    assert sink.returncode() == 0, sink.log_tail()
    assert written_ids(root) == {f"d{i}": 1 for i in range(50)}
