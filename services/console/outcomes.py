"""The console's gRPC edge: a verdict becomes ``fraud.v1.OutcomeService/ReportOutcome`` with
source ANALYST, sent to the mesh's edge like any other outcome, so that it reaches the event log,
the decision log, the feature updater and live evaluation the same way."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from fraud.v1 import outcomes_pb2, outcomes_pb2_grpc
from services.console.verdicts import ReportFailed, Verdict, VerdictRejected

_OUTCOMES = {
    Verdict.FRAUD: outcomes_pb2.OUTCOME_FRAUD,
    Verdict.LEGITIMATE: outcomes_pb2.OUTCOME_LEGITIMATE,
}


def channel_credentials(
    ca_path: Path, cert_path: Path | None = None, key_path: Path | None = None
) -> grpc.ChannelCredentials:
    """TLS credentials that trust ``ca_path``, with a client certificate when given."""
    return grpc.ssl_channel_credentials(
        root_certificates=ca_path.read_bytes(),
        private_key=key_path.read_bytes() if key_path is not None else None,
        certificate_chain=cert_path.read_bytes() if cert_path is not None else None,
    )


class GrpcOutcomeReporter:
    """Reports verdicts over one channel to the edge (``target``)."""

    def __init__(
        self,
        target: str,
        timeout_s: float,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._target = target
        self._timeout_s = timeout_s
        self._credentials = credentials
        self._channel: grpc.aio.Channel | None = None
        self._stub: outcomes_pb2_grpc.OutcomeServiceStub | None = None

    def _connected(self) -> outcomes_pb2_grpc.OutcomeServiceStub:
        """The stub, its channel opened on first use: an aio channel belongs to the event
        loop it is created on, which is the server's, running only once it serves."""
        if self._stub is None:
            self._channel = (
                grpc.aio.secure_channel(self._target, self._credentials)
                if self._credentials is not None
                else grpc.aio.insecure_channel(self._target)
            )
            self._stub = outcomes_pb2_grpc.OutcomeServiceStub(self._channel)
        return self._stub

    async def report(
        self, transaction_id: str, verdict: Verdict, reported_by: str, token: str | None
    ) -> str:
        """Sends one outcome; returns its event id. The analyst's own token (if any) goes
        with it, so the edge authenticates the verdict as it would any client's call."""
        request = outcomes_pb2.ReportOutcomeRequest(
            transaction_id=transaction_id,
            outcome=_OUTCOMES[verdict],
            source=outcomes_pb2.OUTCOME_SOURCE_ANALYST,
            reported_by=reported_by,
        )
        request.reported_at.FromNanoseconds(time.time_ns())
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        try:
            reply = await self._connected().ReportOutcome(
                request, timeout=self._timeout_s, metadata=metadata
            )
        except grpc.aio.AioRpcError as error:
            code, details = error.code(), error.details() or ""
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise VerdictRejected(details) from None
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise ReportFailed(
                    f"the mesh refused the verdict ({code.name}): {details}"
                ) from None
            raise ReportFailed(
                f"the mesh did not confirm the verdict ({code.name}: {details}); "
                "nothing is lost by giving it again"
            ) from None
        return str(reply.event_id)

    async def close(self) -> None:
        """Closes the channel, if one was opened."""
        if self._channel is not None:
            await self._channel.close()
