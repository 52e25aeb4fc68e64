"""Settings of the feature service process (env prefix ``FRAUD_FEATURES_``).

Where the store lives and how fresh values must be are the feature store's own settings
(``services.featurestore.settings.FeatureStoreSettings``, same prefix), which every
process that opens the store shares; this class holds what only the service needs.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings


class FeaturesSettings(ServerSettings):
    """The feature service's port and how it runs its reads."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_FEATURES_", extra="ignore", frozen=True)

    port: int = Field(
        default=50052, ge=0, le=65535, description="gRPC port of fraud.v1.FeatureService."
    )
    max_request_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request message: a GetFeaturesRequest is two ids and a time.",
    )
    read_in_thread: bool = Field(
        False,
        description="Run each online read in a worker thread instead of on the event loop: "
        "protects health checks from a store that hangs, at the cost of a thread hop per "
        "read (docs/performance.md).",
    )
    read_threads: int = Field(
        default=1,
        ge=1,
        description="Worker threads for the blocking Feast reads; the reader serializes "
        "reads, so more threads only queue behind one another.",
    )
