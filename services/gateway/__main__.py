"""Runs the gateway: ``python -m services.gateway``."""

from services.common.server import serve
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings


def main() -> None:
    """Builds the settings from the environment and serves until SIGTERM."""
    settings = GatewaySettings()
    serve(settings, GatewayService(settings))


if __name__ == "__main__":
    main()
