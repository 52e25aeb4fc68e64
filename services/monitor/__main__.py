"""Runs the monitor: ``python -m services.monitor``."""

import sys

from services.common.server import serve
from services.eventlog import EventLogSettings
from services.monitor.app import MonitorApp
from services.monitor.settings import MonitorSettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = MonitorSettings()
    app = MonitorApp(settings, EventLogSettings())
    serve(settings, app)
    sys.exit(1 if app.failed else 0)


if __name__ == "__main__":
    main()
