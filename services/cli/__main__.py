"""Runs the command line: ``python -m services.cli``."""

from services.cli.main import main

if __name__ == "__main__":
    main()
