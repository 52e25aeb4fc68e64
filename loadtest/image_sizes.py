"""What the project's images weigh: each image in buildah's storage, the OCI archive, and the
largest installed distributions of the fraudmesh image.

Run after ``make images``, as root like it (buildah's vfs storage):
``python -m loadtest.image_sizes``. It reads the images ``scripts/images.sh`` left, mounts the
fraudmesh image read-only to count its files, and writes ``loadtest/results/images.md`` and
``.json``. Sizes are in decimal megabytes (10^6 bytes), the unit buildah prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

from loadtest import provenance

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "loadtest" / "results"
STEM = "images"
IMAGE = "localhost/fraudmesh"
BASE = "localhost/fraudmesh-base:bookworm"
DEPS = "localhost/fraudmesh-deps"
ARCHIVES = REPO / "build" / "images"
STORAGE_DRIVER = ARCHIVES / "storage-driver"
"""Where ``scripts/images.sh`` wrote the storage driver it built the images in."""
SITE_PACKAGES = "opt/fraudmesh/lib/python3.11/site-packages"
"""Where the image's virtual environment keeps its distributions, from the root."""
TOP = 10
"""How many of the largest distributions the results list."""


def buildah_command() -> tuple[str, ...]:
    """buildah on the storage ``scripts/images.sh`` used (overlay or vfs)."""
    try:
        driver = STORAGE_DRIVER.read_text().strip()
    except OSError:
        raise SystemExit(f"no {STORAGE_DRIVER}: run `make images` first") from None
    return ("buildah", "--storage-driver", driver)


def _buildah(*args: str) -> str:
    done = subprocess.run(
        [*buildah_command(), *args], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"buildah {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def stored_images() -> dict[str, str]:
    """Each of the project's images in buildah's storage → the size buildah reports."""
    found: dict[str, str] = {}
    for image in json.loads(_buildah("images", "--json") or "[]"):
        for name in image.get("names") or []:
            if name.startswith((IMAGE + ":", DEPS + ":", BASE)):
                found[name] = str(image["size"])
    return found


UNITS = {"B": 1e-6, "kB": 1e-3, "KB": 1e-3, "MB": 1.0, "GB": 1e3, "TB": 1e6}
"""Megabytes in one of each unit buildah prints (decimal: ``1.29 GB`` is 1,290 MB)."""


def megabytes(size: str) -> float:
    """buildah's human size (``1.29 GB``) in megabytes."""
    number, _, unit = size.strip().partition(" ")
    if unit not in UNITS:
        raise ValueError(f"a size buildah printed in an unknown unit: {size!r}")
    return round(float(number) * UNITS[unit], 3)


def tree_bytes(root: Path) -> int:
    """Apparent size of every regular file under ``root``, symbolic links not followed."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def distributions(site_packages: Path) -> dict[str, int]:
    """Each installed distribution's files in bytes, by the RECORD of its metadata folder."""
    sizes: dict[str, int] = {}
    for info in site_packages.glob("*.dist-info"):
        record = info / "RECORD"
        if not record.exists():
            continue
        name = info.name.split("-")[0]
        total = 0
        for line in record.read_text().splitlines():
            relative = line.split(",", 1)[0]
            path = site_packages / relative
            if relative and path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        sizes[name] = total
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


@contextmanager
def mounted(image: str) -> Iterator[Path]:
    """The root file system of a working container of ``image``, removed afterwards."""
    container = _buildah("from", "--quiet", "--pull-never", image).strip()
    try:
        yield Path(_buildah("mount", container).strip())
    finally:
        subprocess.run([*buildah_command(), "rm", container], capture_output=True, check=False)


def measure() -> dict[str, Any]:
    """The sizes of the images ``make images`` left."""
    release = version("fraudmesh")
    tag = f"{IMAGE}:{release}"
    stored = stored_images()
    if tag not in stored:
        raise SystemExit(f"no {tag} in buildah's storage: run `make images` first")
    archive = ARCHIVES / f"fraudmesh-{release}.oci.tar"
    with mounted(tag) as root:
        unpacked = tree_bytes(root)
        packages = distributions(root / SITE_PACKAGES)
    return {
        "image": tag,
        "stored": stored,
        "stored_mb": {name: megabytes(size) for name, size in stored.items()},
        "unpacked_bytes": unpacked,
        "archive_bytes": archive.stat().st_size if archive.exists() else None,
        "distributions_bytes": packages,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def markdown(result: dict[str, Any]) -> str:
    """The results as Markdown."""
    lines = [
        "# The project's images",
        "",
        "| image | size (buildah) |",
        "|---|---:|",
        *(f"| `{name}` | {size} |" for name, size in sorted(result["stored"].items())),
        "",
        f"`{result['image']}`: {_mb(result['unpacked_bytes'])} of files unpacked (symbolic links "
        "not counted)"
        + (
            f"; the OCI archive (compressed layers, as a registry stores them) "
            f"{_mb(result['archive_bytes'])}."
            if result["archive_bytes"] is not None
            else "; no OCI archive was found."
        ),
        "",
        f"Its {TOP} largest installed distributions:",
        "",
        "| distribution | size |",
        "|---|---:|",
    ]
    for name, size in list(result["distributions_bytes"].items())[:TOP]:
        lines.append(f"| {name} | {_mb(size)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measures and writes the results files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    result = measure()
    text = markdown(result)
    paths = provenance.write(RESULTS / STEM, result, text, provenance.record())
    print(text)
    print("written:", *paths)


if __name__ == "__main__":
    main()
