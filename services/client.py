"""A small Python client of the public API, used by ``fraudmesh score`` and the demo.

Its channels carry the retry policy every client of the edge should use
(docs/reliability.md): a call that fails with UNAVAILABLE (the Envoy holding the connection
died, or no gateway could take it) is sent again, at most twice more, within the call's own
deadline; ``waitForReady`` lets a call made while the channel reconnects wait for the new
connection instead of failing at once.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import outcomes_pb2, outcomes_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc

SERVICE_CONFIG: dict[str, object] = {
    "methodConfig": [
        {
            "name": [{"service": "fraud.v1.FraudScoring"}, {"service": "fraud.v1.OutcomeService"}],
            # A call made while the channel reconnects (its Envoy was killed) waits for the
            # new connection, within its deadline, rather than failing at once.
            "waitForReady": True,
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.002s",
                "maxBackoff": "0.010s",
                "backoffMultiplier": 2,
                # Only UNAVAILABLE: the call did not reach a gateway, or its connection died
                # with it. Never DEADLINE_EXCEEDED (late) or RESOURCE_EXHAUSTED (shed: back off).
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
    # Retries stop while more than half of the recent calls fail: a dead edge is not
    # flooded with them.
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
}
"""gRPC service config of the client's channels: retry policy and waitForReady."""

CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    ("grpc.enable_retries", 1),
    # Finds a dead connection between calls instead of on the next one.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    # Reconnects within milliseconds of losing its Envoy (the default waits up to a second).
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 1_000),
)
"""Options of every channel the client opens (``Credentials.channel``, ``aio_channel``)."""

DECISION_NAMES = {
    pb.DECISION_APPROVE: "APPROVE",
    pb.DECISION_REVIEW: "REVIEW",
    pb.DECISION_DECLINE: "DECLINE",
}


@dataclass(frozen=True)
class Sample:
    """One transaction to send, with what a person expects of it."""

    label: str
    card_id: str
    merchant_id: str
    amount_minor: int
    currency: str = "EUR"
    card_not_present: bool = False
    timestamp_s: float | None = None
    expect: str = ""

    def request(self) -> pb.ScoreRequest:
        """The ScoreRequest for this sample, stamped now unless a time is set."""
        ts = Timestamp()
        ts.FromNanoseconds(int((self.timestamp_s or time.time()) * 1e9))
        return pb.ScoreRequest(
            transaction_id=f"demo-{uuid.uuid4().hex[:12]}",
            card_id=self.card_id,
            merchant_id=self.merchant_id,
            amount_minor=self.amount_minor,
            currency=self.currency,
            timestamp=ts,
            channel=pb.CHANNEL_CARD_NOT_PRESENT
            if self.card_not_present
            else pb.CHANNEL_CARD_PRESENT,
        )


@dataclass(frozen=True)
class Credentials:
    """How to reach a secured edge: TLS (with a CA, optionally a client certificate for
    mutual TLS) and a bearer token. The default is plaintext without a token."""

    tls: bool = False
    ca_path: Path | None = None
    """CA bundle that signed the edge's certificate; unset: the system's roots."""
    cert_path: Path | None = None
    """Client certificate (PEM) for mutual TLS."""
    key_path: Path | None = None
    """Private key of the client certificate."""
    token: str | None = field(default=None, repr=False)
    """Bearer token sent as ``authorization`` metadata; never printed."""
    server_name: str | None = None
    """Name to verify the edge's certificate against, when the target's host differs."""

    def __post_init__(self) -> None:
        if (self.cert_path is None) != (self.key_path is None):
            raise ValueError("a client certificate needs both cert_path and key_path")
        if not self.tls and (self.ca_path or self.cert_path or self.server_name):
            raise ValueError("CA, client certificate and server name need tls=True")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: the bearer token, if any."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self, target: str) -> grpc.Channel:
        """A blocking channel to ``target`` with these credentials and the retry policy."""
        if not self.tls:
            return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        return grpc.secure_channel(target, self._secure(), options=self._options())

    def aio_channel(self, target: str, *extra: tuple[str, int | str]) -> grpc.aio.Channel:
        """An asyncio channel to ``target`` with these credentials, the retry policy and
        ``extra`` options."""
        if not self.tls:
            return grpc.aio.insecure_channel(target, options=[*CHANNEL_OPTIONS, *extra])
        return grpc.aio.secure_channel(target, self._secure(), options=[*self._options(), *extra])

    def _secure(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_path.read_bytes() if self.ca_path else None,
            private_key=self.key_path.read_bytes() if self.key_path else None,
            certificate_chain=self.cert_path.read_bytes() if self.cert_path else None,
        )

    def _options(self) -> list[tuple[str, int | str]]:
        override = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return [*CHANNEL_OPTIONS, *override]


PLAINTEXT = Credentials()
"""No TLS, no token: the mesh's default edge."""


def score(
    target: str,
    request: pb.ScoreRequest,
    timeout_s: float = 0.042,
    credentials: Credentials = PLAINTEXT,
) -> pb.ScoreResponse:
    """Sends one Score call; raises grpc.RpcError on a non-OK status.

    A call the edge refuses at its limit (RESOURCE_EXHAUSTED) carries how long to wait
    before sending again (``grpc-retry-pushback-ms``): when the call's own timeout leaves
    time for that wait and another try, it is sent once more after it; otherwise the refusal
    is raised at once, so that the caller answers by its own fallback within its budget.
    """
    with credentials.channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=5)
        stub = pb_grpc.FraudScoringStub(channel)
        started = time.monotonic()
        try:
            return stub.Score(request, timeout=timeout_s, metadata=credentials.metadata())
        except grpc.RpcError as error:
            wait_s = pushback_s(error)
            left_s = timeout_s - (time.monotonic() - started)
            if wait_s is None or wait_s >= left_s:
                raise
        time.sleep(wait_s)
        return stub.Score(request, timeout=left_s - wait_s, metadata=credentials.metadata())


PUSHBACK_HEADER = "grpc-retry-pushback-ms"
"""Trailing metadata of a refusal: milliseconds to wait before sending again (gRFC A6)."""


def pushback_s(error: grpc.RpcError) -> float | None:
    """How long a RESOURCE_EXHAUSTED refusal asks the client to wait, in seconds; None when
    it is another status or says nothing (a malformed or negative value means: do not
    retry)."""
    if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    values = [v for k, v in (error.trailing_metadata() or ()) if k == PUSHBACK_HEADER]
    if len(values) != 1 or not isinstance(values[0], str) or not values[0].isdigit():
        return None
    return int(values[0]) / 1000.0


def report_outcome(
    target: str,
    transaction_id: str,
    outcome: outcomes_pb2.Outcome = outcomes_pb2.OUTCOME_FRAUD,
    source: outcomes_pb2.OutcomeSource = outcomes_pb2.OUTCOME_SOURCE_ANALYST,
    reported_at_s: float | None = None,
    timeout_s: float = 5.0,
    credentials: Credentials = PLAINTEXT,
) -> outcomes_pb2.ReportOutcomeResponse:
    """Reports what a decided transaction turned out to be; raises grpc.RpcError if refused."""
    request = outcomes_pb2.ReportOutcomeRequest(
        transaction_id=transaction_id, outcome=outcome, source=source
    )
    request.reported_at.FromNanoseconds(int((reported_at_s or time.time()) * 1e9))
    with credentials.channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=5)
        return outcomes_pb2_grpc.OutcomeServiceStub(channel).ReportOutcome(
            request, timeout=timeout_s, metadata=credentials.metadata()
        )


def scored_by(response: pb.ScoreResponse) -> str:
    """``model`` or ``rules``."""
    return pb.ScoredBy.Name(response.scored_by).removeprefix("SCORED_BY_").lower()


def feature_source(response: pb.ScoreResponse) -> str:
    """``online``, ``partial`` or ``default``."""
    return pb.FeatureSource.Name(response.feature_source).removeprefix("FEATURE_SOURCE_").lower()


def describe(response: pb.ScoreResponse) -> str:
    """A readable multi-line summary of a ScoreResponse."""
    lines = [
        f"{DECISION_NAMES.get(response.decision, 'UNSPECIFIED')}  score={response.score:.4f}  "
        f"by={scored_by(response)}  features={feature_source(response)}  "
        f"model={response.model_version}  {response.elapsed_ms:.2f} ms",
    ]
    lines += [f"  - {reason}" for reason in response.reasons]
    return "\n".join(lines)
