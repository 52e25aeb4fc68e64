"""Reading a policy file for the ``fraudmesh rules`` commands: bounded, UTF-8, one-line errors."""

from __future__ import annotations

from pathlib import Path

from services.cli.exits import BAD_INPUT, fail
from services.domain import policy as policy_domain


def read_policy_file(path: Path, action: str) -> str:
    """The file's text, refused in one line when unreadable, too large or not UTF-8."""
    try:
        with path.open("rb") as handle:
            data = handle.read(policy_domain.MAX_POLICY_BYTES + 1)
    except OSError as error:
        fail(f"{action} rejected", f"cannot read {path}: {error.strerror or error}", BAD_INPUT)
    if len(data) > policy_domain.MAX_POLICY_BYTES:
        fail(
            f"{action} rejected",
            f"{path}: policy is larger than {policy_domain.MAX_POLICY_BYTES} bytes",
            BAD_INPUT,
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{action} rejected", f"{path}: not UTF-8 text", BAD_INPUT)
