"""The Python client's retry policy against a real gRPC server: UNAVAILABLE is retried within
the deadline, other errors are not, and a call waits for a reconnecting channel."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services import client
from services.mesh import free_port


class Flaky(pb_grpc.FraudScoringServicer):
    """Answers each call after failing its first ``failures`` attempts with ``code``."""

    def __init__(self) -> None:
        self.failures = 0
        self.code = grpc.StatusCode.UNAVAILABLE
        self.pushback: str | None = None
        self.attempts = 0
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def Score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreResponse:
        with self.lock:
            self.attempts += 1
            self.arrivals.append(time.monotonic())
            fail = self.attempts <= self.failures
        if fail:
            if self.pushback is not None:
                context.set_trailing_metadata(((client.PUSHBACK_HEADER, self.pushback),))
            context.abort(self.code, "try again")
        return pb.ScoreResponse(transaction_id=request.transaction_id)


def _server(servicer: Flaky, port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_FraudScoringServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@pytest.fixture
def flaky() -> Iterator[tuple[Flaky, str]]:
    servicer, port = Flaky(), free_port()
    server = _server(servicer, port)
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def _request() -> pb.ScoreRequest:
    return client.Sample("retry", "card-1", "merch-00001", 100).request()


def test_unavailable_is_retried_within_the_deadline(flaky: tuple[Flaky, str]) -> None:
    servicer, target = flaky
    servicer.failures = 2
    response = client.score(target, _request(), timeout_s=2.0)
    assert response.transaction_id
    assert servicer.attempts == 3


def test_at_most_three_attempts(flaky: tuple[Flaky, str]) -> None:
    servicer, target = flaky
    servicer.failures = 10
    with pytest.raises(grpc.RpcError) as error:
        client.score(target, _request(), timeout_s=2.0)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert servicer.attempts == 3


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT]
)
def test_other_errors_are_not_retried(flaky: tuple[Flaky, str], code: grpc.StatusCode) -> None:
    servicer, target = flaky
    servicer.failures, servicer.code = 1, code
    with pytest.raises(grpc.RpcError) as error:
        client.score(target, _request(), timeout_s=2.0)
    assert error.value.code() == code  # type: ignore[attr-defined]
    assert servicer.attempts == 1


@pytest.mark.parametrize(
    "pushback,timeout_s,attempts",
    [
        ("150", 2.0, 2),  # says when, and the deadline leaves room: sent again after it
        ("1500", 1.0, 1),  # past the deadline: refused at once, for the caller's fallback
        ("-1", 2.0, 1),  # negative: do not retry
        ("soon", 2.0, 1),  # malformed: do not retry
    ],
)
def test_a_refusal_with_a_pushback_is_sent_again_after_it_when_there_is_time(
    flaky: tuple[Flaky, str], pushback: str, timeout_s: float, attempts: int
) -> None:
    servicer, target = flaky
    servicer.failures, servicer.code = 1, grpc.StatusCode.RESOURCE_EXHAUSTED
    servicer.pushback = pushback
    if attempts == 1:
        with pytest.raises(grpc.RpcError) as error:
            client.score(target, _request(), timeout_s=timeout_s)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    else:
        assert client.score(target, _request(), timeout_s=timeout_s).transaction_id
        assert servicer.arrivals[1] - servicer.arrivals[0] >= 0.15
    assert servicer.attempts == attempts


def test_a_call_waits_for_a_server_that_comes_back() -> None:
    port = free_port()
    servicer = Flaky()
    first = _server(servicer, port)
    target = f"127.0.0.1:{port}"
    with client.PLAINTEXT.channel(target) as channel:
        stub = pb_grpc.FraudScoringStub(channel)
        assert stub.Score(_request(), timeout=2.0).transaction_id
        first.stop(None)
        # The server is gone: without waitForReady this call would fail at once.
        restarted: list[grpc.Server] = []
        timer = threading.Timer(0.3, lambda: restarted.append(_server(servicer, port)))
        timer.start()
        try:
            assert stub.Score(_request(), timeout=5.0).transaction_id
        finally:
            timer.join()
            for server in restarted:
                server.stop(None)
