"""Runs the console: ``python -m services.console``."""

from services.common.edge_security import EdgeSettings
from services.console.app import serve
from services.console.settings import ConsoleSettings


def main() -> None:
    """Builds the settings from the environment (``FRAUD_CONSOLE_*``, and ``FRAUD_EDGE_*`` for
    TLS and tokens) and serves until SIGTERM."""
    serve(ConsoleSettings(), EdgeSettings())


if __name__ == "__main__":
    main()
