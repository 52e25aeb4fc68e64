"""Runs the gateway: ``python -m services.gateway``."""

from services.common.server import serve
from services.eventlog import EventLogSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.app import GatewayApp
from services.gateway.settings import GatewaySettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = GatewaySettings()
    # In-process mode opens the feature store itself, with the store's own settings.
    store = FeatureStoreSettings() if settings.in_process else None
    events = EventLogSettings() if settings.emit_events else None
    serve(settings, GatewayApp(settings, store, events=events))


if __name__ == "__main__":
    main()
