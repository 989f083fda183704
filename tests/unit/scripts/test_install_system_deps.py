"""scripts/install-system-deps.sh waits for another apt-get's lock instead of failing at once
(a fake apt-get on PATH that fails like a held lock twice, then succeeds)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the script uses sudo when not root")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "install-system-deps.sh"


def _fakes(tmp_path: Path, failures: int) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$*" in *update*)
  n=$(grep -c update {calls})
  if [ "$n" -le {failures} ]; then
    echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100
  fi;;
esac
exit 0
""")
    (bin_dir / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")  # nothing is installed
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir, calls


def _run(tmp_path: Path, failures: int, wait: int) -> subprocess.CompletedProcess[str]:
    bin_dir, _ = _fakes(tmp_path, failures)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APT_LOCK_WAIT": str(wait),
           "APT_RETRY_SLEEP": "0.1"}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_held_lock_is_waited_for_and_every_apt_get_bounds_its_wait(tmp_path: Path) -> None:
    result = _run(tmp_path, failures=2, wait=30)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("trying again") == 2
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[-2:] for c in calls[:3]] == [["update", "-qq"]] * 3
    assert all("DPkg::Lock::Timeout=30" in c for c in calls)
    assert "install" in calls[-1]


def test_a_lock_held_longer_than_the_bound_fails_with_a_reason(tmp_path: Path) -> None:
    result = _run(tmp_path, failures=1000, wait=1)
    assert result.returncode == 1
    assert "another apt holds its lock for more than 1s" in result.stderr
