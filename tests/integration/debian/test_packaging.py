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
Should the test process die while the package is installed, a watchdog purges it.

The .deb is compressed with zstd here (``DPKG_DEB_COMPRESSOR_TYPE``; ``make deb`` keeps
dpkg's default xz, which takes 10-25 s more on this tree). Times on the 2-core test machine
with pip's cache warm: sdist + wheel 5-7 s, the .deb 25-40 s (a cold pip cache adds the
downloads and the python-qpid-proton compile, 17 s), the fresh-venv demo about 10 s, install,
demo and purge a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.support import spawn_watchdog, stop_watchdog

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "amqp-policy-proxy"
VENV = Path("/opt/venvs/amqp-policy-proxy")
ETC = Path("/etc/amqp-policy-proxy")
BIN = Path("/usr/bin/amqp-policy-proxy")
UNIT = Path("/lib/systemd/system/amqp-policy-proxy.service")
DOC = Path("/usr/share/doc/amqp-policy-proxy")
CONFIG = ETC / "config.toml"

# Build tools the package needs (scripts/install-system-deps.sh installs them).
BUILD_TOOLS = {"dpkg-buildpackage": "dpkg-dev", "dh": "debhelper",
               "dh_virtualenv": "dh-virtualenv", "systemd-analyze": "systemd"}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without PYTHONPATH/PYTHONHOME (which would make an installed
    copy import this checkout's sources instead of its own), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


def run(*args: str | Path, timeout: float = 120, env: dict[str, str] | None = None,
        **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command (no shell) in :func:`clean_env`, capturing its output as text."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL,
                          env=clean_env() if env is None else env, **kwargs)


def output(result: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr of ``result``, for assertion messages."""
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def dpkg(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``dpkg ARGS``, waiting (up to ``timeout``) while another process holds dpkg's lock."""
    deadline = time.monotonic() + timeout
    while True:
        result = run("dpkg", *args, timeout=timeout,
                     env=clean_env(DEBIAN_FRONTEND="noninteractive"))
        locked = result.returncode != 0 and "lock" in result.stderr
        if not locked or time.monotonic() > deadline:
            return result
        time.sleep(2)


def package_installed() -> bool:
    """Whether dpkg knows the package as installed (any state but not-installed)."""
    result = run("dpkg-query", "-W", "-f=${db:Status-Status}", PACKAGE)
    return result.returncode == 0 and result.stdout.strip() not in ("", "not-installed")


def why_no_deb() -> str | None:
    """Why the package cannot be built and installed here, or ``None`` when it can."""
    if shutil.which("dpkg") is None:
        return "dpkg is not installed (not a Debian system)"
    if os.geteuid() != 0:
        return "installing a Debian package with dpkg -i needs root"
    for tool, package in BUILD_TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} not found: install {package} (scripts/install-system-deps.sh)"
    if package_installed():
        return f"the {PACKAGE} package is already installed on this machine: not touching it"
    for path in (ETC, BIN, VENV):
        if path.exists() or path.is_symlink():
            return f"{path} exists without the package (a hand-made install): not touching it"
    return None


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make dist``: the sdist and, built from it, the wheel (``python -m build``)."""
    out = tmp_path_factory.mktemp("dist")
    result = run(sys.executable, "-m", "build", "--outdir", out, ROOT, timeout=600)
    assert result.returncode == 0, output(result)
    return out


def only(directory: Path, pattern: str) -> Path:
    """The one file in ``directory`` matching ``pattern``."""
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, found
    return found[0]


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


# --- the Debian package ----------------------------------------------------------------------

@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
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
