"""Server options: size limits always, the connection age limit only when the settings ask."""

from __future__ import annotations

from services.common.server import SERVER_OPTIONS, server_options
from services.scorer.settings import ScorerSettings


def test_connections_stay_open_by_default() -> None:
    options = server_options(ScorerSettings())
    assert set(SERVER_OPTIONS) <= set(options)
    assert "grpc.max_connection_age_ms" not in dict(options)


def test_a_connection_age_closes_connections_gracefully() -> None:
    options = dict(server_options(ScorerSettings(max_connection_age_s=60)))
    assert options["grpc.max_connection_age_ms"] == 60_000
    assert options["grpc.max_connection_age_grace_ms"] > 0
