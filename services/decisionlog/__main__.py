"""Runs the decision sink: ``python -m services.decisionlog``."""

from services.decisionlog.app import serve
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings


def main() -> None:
    """Builds the settings from the environment and runs until SIGTERM."""
    settings = DecisionLogSettings()
    log_settings = EventLogSettings().model_copy(
        update={"file_poll_interval_ms": settings.file_poll_interval_ms}
    )
    serve(settings, log_settings)


if __name__ == "__main__":
    main()
