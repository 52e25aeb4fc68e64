"""``make images`` end to end: the image builds without a Docker engine and passes its smoke test.

Runs ``scripts/images.sh`` (debootstrap base, the dependencies' image, buildah build,
in-image smoke test of the scorer on this session's model and of the decision sink, and that
no load-test suite is inside) as ``make images`` does. It needs root, as debootstrap and
buildah's storage do (without root it skips on a developer's machine and fails under CI),
and reaches Debian's package mirror for the base root filesystem; the base and the
dependencies' image are kept in buildah's storage, so later runs build only the project's
layer.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.ci import unavailable
from tests.conftest import PreparedEnv

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_make_images_builds_and_the_scorer_serves_inside(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        unavailable("the image test needs root: debootstrap and buildah's vfs storage need it")
    # Asked for only now, so that a machine without root does not build it for nothing.
    prepared_env: PreparedEnv = request.getfixturevalue("prepared_env")
    log = tmp_path / "images.log"
    with log.open("w") as out:
        result = subprocess.run(
            ["bash", "scripts/images.sh"],
            cwd=REPO,
            env={**os.environ, "VAR_DIR": str(prepared_env.var_dir)},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1700,
            check=False,
        )
    text = log.read_text(errors="replace")
    assert result.returncode == 0, text[-6000:]
    assert "smoke test passed" in text
    assert "scorer SERVING on its gRPC health check" in text
    assert "decision sink SERVING on its gRPC health check" in text
    assert "no load-test suite: no loadtest module" in text
    archives = list((REPO / "build" / "images").glob("fraudmesh-*.oci.tar"))
    assert archives and all(a.stat().st_size > 0 for a in archives)
