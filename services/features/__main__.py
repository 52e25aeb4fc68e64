"""Runs the feature service: ``python -m services.features``."""

from services.common.server import serve
from services.features.app import FeaturesApp
from services.features.settings import FeaturesSettings
from services.featurestore.settings import FeatureStoreSettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = FeaturesSettings()
    serve(settings, FeaturesApp(settings, FeatureStoreSettings()))


if __name__ == "__main__":
    main()
