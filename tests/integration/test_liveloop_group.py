"""Updaters as a partitioned Kafka group: a simulated day replayed through a 6-partition
topic gives the online rows the batch tables give, for every card, merchant and terminal,
whether one, two or three members share the partitions, when one of two is killed (-9)
mid-stream and the group moves its partitions to the other, and when a second member joins
mid-stream and takes partitions over with their states: nothing lost, nothing counted
twice."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.common.settings import to_env
from services.eventlog import EventLogSettings, open_producer
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Process, free_port, grpc_serving
from services.updater.partitions import Kind, state_file
from services.updater.settings import UpdaterSettings
from tests.integration.eventlog.conftest import kafka_broker  # noqa: F401 - the broker fixture

from .live import Replay, copy_state, metric, replay_day, wait_equal, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 6


@pytest.fixture(scope="module")
def replay(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Replay:
    # Each partition's clock is its own merchants' newest payment (Replay.in_partitions).
    day = replay_day(prepared_env, tmp_path_factory.mktemp("group-replay-var"))
    return day.in_partitions(PARTITIONS)


@dataclass
class Group:
    """A state folder, a fresh topic and group, and the members started on them."""

    var_dir: Path
    log: EventLogSettings
    group: str = field(default_factory=lambda: f"updaters-{uuid.uuid4().hex[:8]}")
    members: list[Member] = field(default_factory=list)

    def start(self, n: int) -> None:
        for _ in range(n):
            member = Member(self, len(self.members))
            self.members.append(member)
            member.process.start()
        for member in self.members[-n:]:
            member.process.wait_ready(180)

    def await_shares(self) -> None:
        """Until every live member owns partitions of both topics, and together all of them."""

        def shared() -> bool:
            live = [m for m in self.members if m.alive]
            owned = [
                [metric(m.metrics, catalogue.UPDATER_PARTITIONS, kind=k.value) for k in Kind]
                for m in live
            ]
            return all(min(o) > 0 for o in owned) and all(
                sum(o[i] for o in owned) == PARTITIONS for i in range(len(Kind))
            )

        wait_for(shared, "the partitions shared among the members", timeout_s=60)

    def records(self) -> float:
        return sum(metric(m.metrics, catalogue.UPDATER_RECORDS) for m in self.members if m.alive)


class Member:
    """``python -m services.updater`` as one member of the group."""

    def __init__(self, group: Group, index: int) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.alive = True
        log = group.log
        env = {
            **to_env(
                UpdaterSettings,
                port=self.port,
                metrics_port=self.metrics_port,
                var_dir=group.var_dir,
                group=group.group,
                partitioned=True,
                log_json=False,
            ),
            **to_env(FeatureStoreSettings, var_dir=group.var_dir, store="sqlite"),
            **to_env(
                EventLogSettings,
                var_dir=group.var_dir,
                backend="kafka",
                kafka_bootstrap=log.kafka_bootstrap,
                kafka_partitions=PARTITIONS,
                kafka_session_timeout_ms=6000,
                topic=log.topic,
                consumer_name=f"updater-{index}",
            ),
        }
        self.process = Process(
            f"updater-{index}",
            [sys.executable, "-m", "services.updater"],
            ready=lambda: grpc_serving(f"127.0.0.1:{self.port}"),
            env=env,
            log_path=group.var_dir / "logs" / f"updater-{index}.log",
        )

    @property
    def metrics(self) -> str:
        return scrape.url("127.0.0.1", self.metrics_port)

    def kill(self) -> None:
        """SIGKILL: no revoke, no last checkpoint."""
        assert self.process.popen is not None
        self.process.popen.kill()
        self.process.popen.wait(30)
        self.alive = False


@pytest.fixture
def group(replay: Replay, tmp_path: Path, kafka_broker: Any) -> Iterator[Group]:  # noqa: F811
    var_dir = copy_state(replay.var_dir, tmp_path / "var")
    log = EventLogSettings(
        var_dir=var_dir,
        backend="kafka",
        kafka_bootstrap=kafka_broker.bootstrap,
        kafka_partitions=PARTITIONS,
        topic=f"t-{uuid.uuid4().hex[:12]}",
        send_timeout_s=5.0,
    )
    g = Group(var_dir, log)
    yield g
    for member in g.members:
        if member.alive:
            member.process.stop()


def _produce(group: Group, replay: Replay, pace: bool = False) -> None:
    producer = open_producer(group.log)
    for i, envelope in enumerate(replay.events):
        producer.append(envelope)
        if pace and i % 10 == 9:
            time.sleep(0.05)  # about 200 events a second
    assert producer.flush(60)
    producer.close()


@pytest.mark.parametrize("members", [1, 2, 3])
def test_any_number_of_members_gives_the_batch_rows(
    replay: Replay, group: Group, members: int
) -> None:
    group.start(members)
    group.await_shares()
    _produce(group, replay)
    wait_equal(group.var_dir, replay)
    # Each partition of both topics had its own state file, each written by one member.
    for kind in Kind:
        for partition in range(PARTITIONS):
            assert state_file(group.log.var_dir / "updater" / group.group, kind, partition).exists()
    assert all(metric(m.metrics, catalogue.UPDATER_RECORDS) > 0 for m in group.members)


def test_kill_9_of_one_member_loses_nothing_and_counts_nothing_twice(
    replay: Replay, group: Group
) -> None:
    group.start(2)
    group.await_shares()
    thread = threading.Thread(target=_produce, args=(group, replay, True))
    thread.start()
    try:
        third = len(replay.events) / 3
        wait_for(
            lambda: (
                metric(group.members[1].metrics, catalogue.UPDATER_RECORDS) > 0
                and metric(group.members[1].metrics, catalogue.UPDATER_CHECKPOINT.count) >= 1
                and group.records() >= third
            ),
            "a third of the stream applied, both members checkpointed",
        )
        group.members[1].kill()
        # The survivor takes over the dead member's partitions after its session expires.
        group.await_shares()
        print(f"partitions moved with the stream {'flowing' if thread.is_alive() else 'ended'}")
    finally:
        thread.join()
    wait_equal(group.var_dir, replay)


def test_a_member_joining_mid_stream_takes_partitions_with_their_state(
    replay: Replay, group: Group
) -> None:
    """Scaling out: the first member gives up partitions in an orderly rebalance (rows
    written, forwards flushed, states snapshotted), the second resumes them from there and
    applies the rest of the day onto them."""
    half = len(replay.events) // 2
    group.start(1)
    group.await_shares()
    _produce(group, replace(replay, events=replay.events[:half]))
    wait_for(
        lambda: (
            group.records() >= half
            and metric(group.members[0].metrics, catalogue.UPDATER_CHECKPOINT.count) >= 1
        ),
        "the first half applied and checkpointed by one member",
    )
    group.start(1)
    group.await_shares()
    _produce(group, replace(replay, events=replay.events[half:]))
    wait_equal(group.var_dir, replay)
    assert metric(group.members[1].metrics, catalogue.UPDATER_RECORDS) > 0
