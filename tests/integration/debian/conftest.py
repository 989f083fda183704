"""The Debian package, built once for this directory and installed for its tests.

This directory is one pytest-xdist scope (``tests/conftest.py``): its modules run on one
worker, in file order, and the fixtures below are package-scoped, so the .deb is built and
installed once for the packaging tests and the deploy guide. ``installed`` purges the package
at the end whatever happens (and a watchdog purges it should the test process die).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import spawn_watchdog, stop_watchdog
from tests.support.debian import (
    PACKAGE,
    ROOT,
    clean_env,
    dpkg,
    only,
    output,
    package_installed,
    run,
    why_no_deb,
)


@pytest.fixture(scope="package")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make dist``: the sdist and, built from it, the wheel (``python -m build``)."""
    out = tmp_path_factory.mktemp("dist")
    result = run(sys.executable, "-m", "build", "--outdir", out, ROOT, timeout=600)
    assert result.returncode == 0, output(result)
    return out


# --- the Debian package ----------------------------------------------------------------------

@pytest.fixture(scope="package")
def deb(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make deb``: the .deb built from the sdist by scripts/build-deb.sh."""
    reason = why_no_deb()
    if reason is not None:
        pytest.skip(reason)
    sdist = only(dist, "amqp_policy_proxy-*.tar.gz")
    work = tmp_path_factory.mktemp("deb")
    # zstd instead of dpkg-deb's default xz: 0.4 s instead of 10-25 s for the ~57 MB tree
    result = run(ROOT / "scripts" / "build-deb.sh", sdist, work / "out", work / "build",
                 timeout=900, env=clean_env(DPKG_DEB_COMPRESSOR_TYPE="zstd"))
    assert result.returncode == 0, output(result)
    built = Path(result.stdout.strip().splitlines()[-1])
    assert built.is_file(), output(result)
    return built


@pytest.fixture(scope="package")
def installed(deb: Path):
    """The package installed with ``dpkg -i``; purged afterwards whatever happens."""
    watchdog = spawn_watchdog(f"dpkg --purge {PACKAGE} >/dev/null 2>&1")
    try:
        result = dpkg("-i", deb)
        assert result.returncode == 0, output(result)
        yield deb
    finally:
        if package_installed():
            dpkg("--purge", PACKAGE)
        stop_watchdog(watchdog)


