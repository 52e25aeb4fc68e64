"""Runs the scorer: ``python -m services.scorer``."""

from services.common.server import serve
from services.scorer.app import ScorerApp
from services.scorer.settings import ScorerSettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = ScorerSettings()
    serve(settings, ScorerApp(settings))


if __name__ == "__main__":
    main()
