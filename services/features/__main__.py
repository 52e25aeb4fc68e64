"""Runs the feature service: ``python -m services.features``."""

from services.common.server import serve
from services.features.service import FeaturesService
from services.features.settings import FeaturesSettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = FeaturesSettings()
    serve(settings, FeaturesService(settings))


if __name__ == "__main__":
    main()
