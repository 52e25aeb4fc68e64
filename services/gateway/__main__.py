"""Runs the gateway: ``python -m services.gateway``."""

from services.common.server import serve
from services.eventlog import EventLogSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.app import GatewayApp
from services.gateway.settings import GatewaySettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = GatewaySettings()
    # The online store's settings: the fraud team's lists live there, and in-process mode
    # reads the features from it too.
    store = FeatureStoreSettings()
    events = EventLogSettings() if settings.emit_events else None
    serve(settings, GatewayApp(settings, store, events=events))


if __name__ == "__main__":
    main()
