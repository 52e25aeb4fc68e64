"""Redis Streams specifics: trimming that never drops unconsumed entries, claiming the pending
entries of a consumer that is gone."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from loadtest.brokers import RedisServer
from services.eventlog import EventLogMetrics, open_consumer, open_producer
from tests.integration.eventlog.conftest import drain, settings_factory
from tests.integration.eventlog.sample import decision, event_id

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def test_redis_trimming_never_drops_unconsumed_entries(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> None:
    make = settings_factory(request, "redis", tmp_path)
    settings = make()
    settings = make(
        topic=settings.topic,
        groups=(f"{settings.topic}-fast", f"{settings.topic}-slow"),
        redis_max_len=100,
        redis_trim_interval_s=0,
    )
    fast_group, slow_group = settings.groups
    client = redis.Redis.from_url(settings.redis_url)
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    for i in range(500):
        producer.append(decision(i))
    producer.close()

    with open_consumer(settings, fast_group) as fast:
        assert len(drain(fast, 500)) == 500
        fast.commit()
    assert client.xlen(settings.topic) == 500, "slow has not read anything: nothing trimmed"

    with open_consumer(settings, slow_group) as slow:
        first = drain(slow, 300)
        slow.commit()
        assert client.xlen(settings.topic) == 200, "trimmed up to what slow acknowledged"
        pending = slow.poll(100, 1.0)
        assert len(pending) == 100
        with open_consumer(settings, fast_group) as fast:
            fast.commit()  # a trimming pass while slow has 100 delivered, unacknowledged
        assert client.xlen(settings.topic) == 200, "pending entries are not trimmed"
    # slow crashed without acknowledging: a restart gets its pending entries again
    with open_consumer(settings, slow_group) as slow:
        rest = drain(slow, 200)
        slow.commit()
    ids = [event_id(r) for r in first + rest]
    assert ids == [f"e{i}" for i in range(500)]
    assert client.xlen(settings.topic) == 0
    client.close()


def test_pending_entries_of_a_consumer_that_is_gone_are_claimed(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> None:
    make = settings_factory(request, "redis", tmp_path)
    settings = make(redis_claim_idle_ms=200)
    group = f"{settings.topic}-g"
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    for i in range(100):
        producer.append(decision(i))
    producer.close()
    with open_consumer(settings, group, consumer_name="gone") as gone:
        taken = drain(gone, 30)  # delivered to "gone", never acknowledged
    assert len(taken) == 30
    with open_consumer(settings, group, consumer_name="heir") as heir:
        # the 70 never delivered, and the 30 of "gone" once idle for 200 ms
        got = drain(heir, 100, timeout_s=30)
        heir.commit()
    assert sorted(event_id(r) for r in got) == sorted(f"e{i}" for i in range(100))
    client = redis.Redis.from_url(settings.redis_url)
    assert client.xpending(settings.topic, group)["pending"] == 0
    client.close()
