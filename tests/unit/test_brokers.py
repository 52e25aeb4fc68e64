"""The test brokers' pure helpers."""

from __future__ import annotations

import base64
import uuid

import pytest

from loadtest import brokers


def test_a_kraft_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 puts 0b111110 (62, '-' in URL-safe base64) in the first six bits.
    assert base64.urlsafe_b64encode(b"\xf8" + bytes(15)).decode().startswith("-")
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x04" + bytes(15))])
    monkeypatch.setattr(brokers.uuid, "uuid4", lambda: next(draws))
    cluster_id = brokers.kraft_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(b"\x04" + bytes(15)).decode().rstrip("=")
    assert len(cluster_id) == 22
