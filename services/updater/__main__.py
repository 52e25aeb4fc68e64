"""Runs the live feature updater: ``python -m services.updater``."""

import sys

from services.common.server import serve
from services.eventlog import EventLogSettings
from services.featurestore.settings import FeatureStoreSettings
from services.updater.app import UpdaterApp
from services.updater.settings import UpdaterSettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = UpdaterSettings()
    app = UpdaterApp(settings, FeatureStoreSettings(), EventLogSettings())
    serve(settings, app)
    sys.exit(1 if app.failed else 0)


if __name__ == "__main__":
    main()
