"""Runs the live feature updater: ``python -m services.updater``."""

from services.common.server import serve
from services.eventlog import EventLogSettings
from services.featurestore.settings import FeatureStoreSettings
from services.updater.app import UpdaterApp
from services.updater.settings import UpdaterSettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = UpdaterSettings()
    serve(settings, UpdaterApp(settings, FeatureStoreSettings(), EventLogSettings()))


if __name__ == "__main__":
    main()
