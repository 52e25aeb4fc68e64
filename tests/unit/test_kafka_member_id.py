"""The Kafka static member id: stable per consumer and topic, within Kafka's name rules."""

from __future__ import annotations

import re

from services.eventlog.kafka_log import static_member_id

_KAFKA_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def test_the_member_id_names_the_consumer_and_the_topic() -> None:
    assert static_member_id("main", "fraud-events") == "main.fraud-events"
    assert static_member_id("main", "fraud-events") != static_member_id("main", "fraud-events-2")


def test_a_long_topic_is_hashed_into_kafkas_249_characters() -> None:
    name, topic = "n" * 100, "t" * 200
    member = static_member_id(name, topic)
    assert _KAFKA_NAME.match(member)
    assert member.startswith(f"{name}.")
    assert member == static_member_id(name, topic)
    assert member != static_member_id(name, "t" * 199 + "u")
