"""The image sizes' counting: distributions by their RECORD, files without symbolic links."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest import image_sizes


def _distribution(site: Path, name: str, files: dict[str, int]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    for relative, size in files.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    record = [f"{relative},sha256=...,{size}" for relative, size in files.items()]
    (info / "RECORD").write_text("\n".join([*record, f"{info.name}/RECORD,,"]) + "\n")


def test_distributions_are_sized_by_their_record_largest_first(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _distribution(site, "small", {"small/__init__.py": 10})
    _distribution(site, "large", {"large/__init__.py": 100, "large/data/table.bin": 900})
    # A file no RECORD names belongs to no distribution.
    (site / "stray.py").write_bytes(b"x" * 5000)
    sizes = image_sizes.distributions(site)
    assert list(sizes) == ["large", "small"]
    assert sizes["large"] >= 1000 and sizes["small"] >= 10
    assert sizes["large"] < 1000 + 200 and sizes["small"] < 10 + 200  # plus the RECORD itself


def test_a_tree_counts_files_once_and_no_symbolic_link(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_bytes(b"x" * 300)
    (tmp_path / "two").write_bytes(b"x" * 700)
    (tmp_path / "link").symlink_to(tmp_path / "two")
    assert image_sizes.tree_bytes(tmp_path) == 1000


def test_the_markdown_lists_every_image_and_the_largest_distributions() -> None:
    result = {
        "image": "localhost/fraudmesh:0.1.0",
        "stored": {
            "localhost/fraudmesh:0.1.0": "1.3 GB",
            "localhost/fraudmesh-base:bookworm": "123 MB",
        },
        "unpacked_bytes": 1_300_000_000,
        "archive_bytes": 409_000_000,
        "distributions_bytes": {f"d{i}": 1_000_000 * (20 - i) for i in range(15)},
    }
    text = image_sizes.markdown(result)
    assert "| `localhost/fraudmesh-base:bookworm` | 123 MB |" in text
    assert "1,300 MB of files unpacked" in text and "409 MB." in text
    assert "| d0 | 20 MB |" in text and "| d9 |" in text and "| d10 |" not in text


def test_buildahs_sizes_read_as_decimal_megabytes() -> None:
    assert image_sizes.megabytes("1.29 GB") == 1290.0
    assert image_sizes.megabytes("123 MB") == 123.0
    assert image_sizes.megabytes("512 kB") == 0.512
    with pytest.raises(ValueError, match="unknown unit"):
        image_sizes.megabytes("3 parsecs")
