"""Runs the decision sink: ``python -m services.decisionlog``."""

from services.decisionlog.app import serve
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings


def main() -> None:
    """Builds the settings from the environment and runs until SIGTERM."""
    serve(DecisionLogSettings(), EventLogSettings())


if __name__ == "__main__":
    main()
