"""The one error tree: every domain error knows the gRPC status it maps to.

Domain modules raise these without importing grpc; the error interceptor in
``services.common.interceptor`` is the single place that turns them into statuses.
"""

from __future__ import annotations


class FraudmeshError(Exception):
    """Base of every error a client may see; ``code`` is a grpc.StatusCode name."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(FraudmeshError):
    """The request is malformed; ``field`` names the offending field."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


class NotFound(FraudmeshError):
    """A named thing (model, version) does not exist."""

    code = "NOT_FOUND"


class Unavailable(FraudmeshError):
    """The service cannot answer now (not ready, draining, dependency down)."""

    code = "UNAVAILABLE"


class ResourceExhausted(FraudmeshError):
    """The service is at its concurrency limit and sheds this call."""

    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(FraudmeshError):
    """The call's budget ran out before an answer could be formed."""

    code = "DEADLINE_EXCEEDED"


class FailedPrecondition(FraudmeshError):
    """The system is not in a state to serve the call (e.g. no model published)."""

    code = "FAILED_PRECONDITION"
