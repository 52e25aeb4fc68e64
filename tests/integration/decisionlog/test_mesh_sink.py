"""The mesh runs the decision sink: it is ready with the rest, and when the mesh stops (after
the gateways) it writes what is on the mesh's event log before it exits cleanly. On Redis it
runs two sinks in one group, which write one log; on the file log it refuses a second."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from services.common.settings import to_env
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings, open_producer
from services.mesh import Mesh, MeshConfig
from tests.integration.conftest import start_mesh
from tests.integration.decisionlog.conftest import wait_written, written_ids
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


def test_the_mesh_runs_two_sinks_on_redis(prepared_env: Any, tmp_path: Path) -> None:
    topic = f"mesh-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "decisions"
    env = {**to_env(EventLogSettings, topic=topic), **to_env(DecisionLogSettings, root=root)}
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir,
        store="redis",
        log_dir=tmp_path / "logs",
        extra_env=env,
        decisionlog_replicas=2,
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=120)
    try:
        sinks = [mesh.processes[name] for name in ("decisionlog", "decisionlog-2")]
        assert all(sink.alive() for sink in sinks)
        producer = open_producer(
            EventLogSettings(
                backend="redis", redis_url=f"redis://{config.host}:{config.redis_port}", topic=topic
            )
        )
        for i in range(200):
            producer.append(decision(i))
        producer.close()
        wait_written(root, {f"d{i}" for i in range(200)})
    finally:
        mesh.stop()
    assert [sink.returncode() for sink in sinks] == [0, 0], sinks[1].log_tail()
    assert written_ids(root) == {f"d{i}": 1 for i in range(200)}


def test_the_file_log_runs_one_sink(prepared_env: Any, tmp_path: Path) -> None:
    config = MeshConfig.on_free_ports(var_dir=prepared_env.var_dir, decisionlog_replicas=2)
    with pytest.raises(ValueError, match="Kafka or Redis Streams"):
        Mesh(config)
