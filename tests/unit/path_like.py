"""Model names and versions that are not plain: paths, and near misses of a version number."""

from __future__ import annotations

from services.models import repository

PATH_LIKE_VERSIONS = [
    "../1",
    "1/../1",
    "./1",
    "1/",
    "/1",
    "/etc/passwd",
    "..",
    ".",
    "1\x00",
    "1\\..",
    "-1",
    "+1",
    " 1",
    "1 ",
    "01",
    "1.0",
    "1e3",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit, not a version
    "\u00b2",
    "latest",
    "9" * (repository.MAX_VERSION_DIGITS + 1),
    "1" * 100_000,
]
"""Versions that are not plain version numbers, each a path or a near miss of one."""

PATH_LIKE_NAMES = [
    "",
    "..",
    ".",
    "../fraud-lgbm",
    "fraud-lgbm/../x",
    "/etc",
    "a/b",
    "a\\b",
    "fraud-lgbm\x00",
    ".hidden",
    "-flag",
    "caf\u00e9",
    "x" * (repository.MAX_NAME_LENGTH + 1),
]
"""Model names that are not one plain folder name."""
