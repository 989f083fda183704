"""The distributions: ``make dist`` (sdist and wheel) and ``make deb`` (dh-virtualenv).

* The wheel carries the demo policy, and ``amqp-policy-proxy demo`` runs from the wheel
  installed in a fresh virtualenv (outside this checkout).
* The sdist carries what the Debian package is built from.
* The Debian package is built from that sdist exactly as ``make deb`` does
  (``scripts/build-deb.sh``), installed with ``dpkg -i`` on this machine, and then: the
  installed ``amqp-policy-proxy check --config /etc/amqp-policy-proxy/config.toml`` and
  ``amqp-policy-proxy demo`` pass, ``systemd-analyze verify`` has nothing to say about the
  installed unit, the unit is disabled (not started on install), and ``dpkg --purge`` removes
  it all again.

The package tests need root, ``dpkg`` and the build dependencies that
``scripts/install-system-deps.sh`` installs (``make test`` runs it first); they skip, saying
why, where those are missing, and also when the package (or a hand-made
``/etc/amqp-policy-proxy``) is already on this machine, which they would otherwise overwrite.
Should the test process die while the package is installed, a watchdog purges it. The build
and the install are this directory's fixtures (``conftest.py``), shared with the deploy
guide's test (``test_deploy_guide.py``), which runs first and puts the package's files back.

The .deb is compressed with zstd here (``DPKG_DEB_COMPRESSOR_TYPE``; ``make deb`` keeps
dpkg's default xz, which takes 10-25 s more on this tree). Times on the 2-core test machine
with pip's cache warm: sdist + wheel 5-7 s, the .deb 25-40 s (a cold pip cache adds the
downloads and the python-qpid-proton compile, 17 s), the fresh-venv demo about 10 s, install,
demo and purge a few seconds.
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.debian import (
    BIN,
    CONFIG,
    DOC,
    ETC,
    PACKAGE,
    UNIT,
    VENV,
    clean_env,
    dpkg,
    only,
    output,
    package_installed,
    run,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_wheel_carries_the_demo_policy_and_the_command(dist: Path) -> None:
    wheel = only(dist, "amqp_policy_proxy-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = whl.read(entry_points).decode()
    assert "amqp_policy_proxy/demo/policy.json" in names
    assert "amqp-policy-proxy = amqp_policy_proxy.cli:main" in scripts
    # the capacity reports are code in the wheel, PySpark is only an extra
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as whl:
        requires = [line for line in whl.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist: pyspark")]
    assert requires and all("extra ==" in line for line in requires)


def test_sdist_carries_what_the_debian_package_is_built_from(dist: Path) -> None:
    sdist = only(dist, "amqp_policy_proxy-*.tar.gz")
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.removeprefix(top + "/") for name in tar.getnames()}
    for needed in ("debian/control", "debian/rules", "debian/changelog",
                   "debian/amqp-policy-proxy.install", "debian/amqp-policy-proxy.postinst",
                   "systemd/amqp-policy-proxy.service", "systemd/README.md",
                   "examples/etc/amqp-policy-proxy/config.toml",
                   "examples/etc/amqp-policy-proxy/policy.d/10-shop.json",
                   "docs/deploy.md", "src/amqp_policy_proxy/demo/policy.json", "setup.py"):
        assert needed in names, needed


def test_demo_runs_from_the_wheel_in_a_fresh_venv(dist: Path, tmp_path: Path) -> None:
    wheel = only(dist, "amqp_policy_proxy-*.whl")
    venv = tmp_path / "venv"
    result = run(sys.executable, "-m", "venv", venv)
    assert result.returncode == 0, output(result)
    result = run(venv / "bin" / "pip", "install", "-q", wheel, timeout=600)
    assert result.returncode == 0, output(result)
    # from a directory outside the checkout, so nothing of it can be found
    result = run(venv / "bin" / "amqp-policy-proxy", "demo", cwd=tmp_path,
                 env=clean_env(TMPDIR=str(tmp_path)))
    assert result.returncode == 0, output(result)
    where = run(venv / "bin" / "python", "-c",
                "import amqp_policy_proxy; print(amqp_policy_proxy.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), output(where)


def test_package_metadata(deb: Path) -> None:
    fields = run("dpkg-deb", "-f", deb, "Depends", "Recommends").stdout
    for dependency in ("libsasl2-2", "libsasl2-modules", "adduser"):
        assert dependency in fields, fields
    # the interpreter the venv links to (py3versions -d at build time)
    assert re.search(r"\bpython3\.\d+\b", fields), fields
    assert "Recommends: sasl2-bin" in fields
    conffiles = run("dpkg-deb", "--info", deb, "conffiles").stdout.split()
    assert conffiles == [str(CONFIG), f"{ETC}/policy.d/10-shop.json"]
    contents = run("dpkg-deb", "-c", deb).stdout
    assert "pyspark" not in contents          # Spark stays an optional extra


def test_lintian_finds_nothing_but_what_the_package_overrides(deb: Path) -> None:
    """The package is hermetic and lintian-clean: no RUNPATH into the builder's interpreter
    (custom-library-search-path), no embedded libyaml, and nothing else but the tags
    debian/amqp-policy-proxy.lintian-overrides justifies (the dh-virtualenv family).
    ``malformed-deb-archive`` is suppressed: only this test's zstd-compressed build has it
    (``make deb`` keeps dpkg's xz)."""
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed (scripts/install-system-deps.sh installs it)")
    result = run("lintian", "--tag-display-limit", "0", "--suppress-tags",
                 "malformed-deb-archive", deb, timeout=300)
    tags = [line for line in result.stdout.splitlines()
            if line[:2] in ("E:", "W:")]
    assert tags == [], output(result)
    assert result.returncode == 0, output(result)


def test_installed_layout(installed: Path) -> None:
    assert BIN.is_symlink() and BIN.resolve() == (VENV / "bin" / "amqp-policy-proxy").resolve()
    # every console script runs the installed interpreter, whatever the build path was
    # (pip writes a /bin/sh trampoline with the build path when that path is long)
    for script in ("amqp-policy-proxy", "pip", "netaddr"):
        first = (VENV / "bin" / script).read_text().splitlines()[0]
        assert first == f"#!{VENV}/bin/python", (script, first)
    assert UNIT.is_file()
    conffiles = run("dpkg-query", "-W", "-f=${Conffiles}", PACKAGE).stdout
    assert f"{CONFIG} " in conffiles and f"{ETC}/policy.d/10-shop.json " in conffiles
    assert "[policy]" in CONFIG.read_text() and CONFIG.read_text().startswith("#")
    for doc in ("README.md", "README.Debian", "copyright", "docs/deploy.md",
                "systemd/README.md", "dashboards/alerts.yml"):
        assert (DOC / doc).is_file(), doc
    # the system user the unit runs as, and the key directory only its group may read
    assert run("getent", "passwd", PACKAGE).returncode == 0
    tls = ETC / "tls"
    assert oct(tls.stat().st_mode & 0o777) == "0o750"
    assert run("stat", "-c", "%U:%G", tls).stdout.strip() == f"root:{PACKAGE}"
    # python-qpid-proton with Cyrus SASL inside the private venv; no PySpark there
    probe = run(VENV / "bin" / "python", "-c",
                "import importlib.util, proton; "
                "print(proton.SASL.extended(), importlib.util.find_spec('pyspark') is None)")
    assert probe.stdout.split() == ["True", "True"], output(probe)


def test_installed_check_passes_on_the_shipped_config(installed: Path) -> None:
    result = run(BIN, "check", "--config", CONFIG)
    assert result.returncode == 0, output(result)
    assert result.stdout.startswith("ok: "), output(result)


def test_installed_demo_runs(installed: Path, tmp_path: Path) -> None:
    result = run("amqp-policy-proxy", "demo", cwd=tmp_path,
                 env=clean_env(PATH="/usr/bin:/bin", TMPDIR=str(tmp_path)))
    assert result.returncode == 0, output(result)


def test_installed_unit_verifies_without_warnings(installed: Path) -> None:
    result = run("systemd-analyze", "verify", UNIT, timeout=60)
    assert result.returncode == 0, output(result)
    ours = [line for line in (result.stdout + result.stderr).splitlines()
            if "amqp-policy-proxy" in line]
    assert ours == [], output(result)


def test_service_is_not_enabled_on_install(installed: Path) -> None:
    result = run("systemctl", "is-enabled", "amqp-policy-proxy.service")
    assert result.stdout.strip() == "disabled", output(result)
    assert not Path("/etc/systemd/system/multi-user.target.wants/amqp-policy-proxy.service"
                    ).exists()


def test_purge_removes_the_package(installed: Path) -> None:
    # the last test of the module: purge explicitly, and check that nothing is left
    result = dpkg("--purge", PACKAGE)
    assert result.returncode == 0, output(result)
    assert not package_installed()
    for path in (BIN, VENV, ETC, UNIT, DOC, Path("/var/log/amqp-policy-proxy")):
        assert not (path.exists() or path.is_symlink()), path
    assert run("dpkg-statoverride", "--list", ETC / "tls").returncode != 0
