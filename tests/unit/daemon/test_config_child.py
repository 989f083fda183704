"""daemon/config_child.py: `run` validates its configuration in a child, so the daemon never
loads pydantic; what crosses back (the config, or every problem) is what an in-process
validation gives. Each case runs in a fresh interpreter: this one has loaded pydantic already,
which makes validate_apart validate in-process (nothing to save)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

POLICY = ('[["vhost", {"hostname": "$default", "groups": {"$default": '
          '{"users": "*", "remoteHosts": "*"}}}]]')


def _python(code: str, tmp_path: Path) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter in ``tmp_path``; it prints one JSON object."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _config(tmp_path: Path, body: str) -> Path:
    (tmp_path / "p.json").write_text(POLICY)
    path = tmp_path / "proxy.toml"
    path.write_text(body)
    return path


GOOD = """
[[listener]]
address = "127.0.0.1:0"

[[upstream]]
address = "127.0.0.1:5672"
kind = "qdrouterd"

[policy]
path = "p.json"
max_connections = 77

[logging]
level = "info"
"""


def test_the_config_crosses_back_equal_and_the_schema_stays_out(tmp_path: Path) -> None:
    """The child's DaemonConfig equals the one validated here; the parent never imports
    pydantic, and the work happened in another process."""
    path = _config(tmp_path, GOOD)
    got = _python(f"""
        import json, os, sys
        from amqp_policy_proxy.daemon.config_child import validate_apart

        def load(path):
            from amqp_policy_proxy.daemon.config import load_daemon_config
            return os.getpid(), load_daemon_config(path)

        pid, config = validate_apart(load, {str(path)!r})
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core'))
        from amqp_policy_proxy.daemon.config import load_daemon_config
        print(json.dumps({{"child": pid != os.getpid(), "loaded": loaded,
                          "equal": config == load_daemon_config({str(path)!r}),
                          "max": config.policy.max_connections,
                          "kind": config.upstreams[0].kind}}))
    """, tmp_path)
    assert got == {"child": True, "loaded": [], "equal": True, "max": 77, "kind": "qdrouterd"}


def test_every_problem_crosses_back_as_the_same_config_error(tmp_path: Path) -> None:
    """A bad file: the parent raises ConfigError with exactly the in-process issues."""
    path = _config(tmp_path, GOOD.replace('kind = "qdrouterd"', 'kind = "qdr"')
                   .replace("max_connections = 77", 'max_connections = "77"'))
    got = _python(f"""
        import json
        from amqp_policy_proxy.daemon.config_child import validate_apart
        from amqp_policy_proxy.daemon.settings import ConfigError

        def load(path):
            from amqp_policy_proxy.daemon.config import load_daemon_config
            return load_daemon_config(path)

        try:
            validate_apart(load, {str(path)!r})
        except ConfigError as exc:
            apart = exc.issues
        try:
            load({str(path)!r})
        except ConfigError as exc:
            here = exc.issues
        print(json.dumps({{"apart": apart, "here": here}}))
    """, tmp_path)
    assert got["apart"] == got["here"]
    issues = got["apart"]
    assert isinstance(issues, list) and len(issues) == 2
    assert any("upstream[0].kind" in i for i in issues)
    assert any("policy.max_connections" in i for i in issues)


def test_a_child_that_dies_is_a_config_error_with_its_status(tmp_path: Path) -> None:
    """Killed before answering (as the OOM killer would): a ConfigError naming the signal."""
    got = _python("""
        import json, os, signal
        from amqp_policy_proxy.daemon.config_child import validate_apart
        from amqp_policy_proxy.daemon.settings import ConfigError

        def die():
            os.kill(os.getpid(), signal.SIGKILL)

        try:
            validate_apart(die)
        except ConfigError as exc:
            print(json.dumps({"issues": exc.issues}))
    """, tmp_path)
    assert got["issues"] == ["the configuration could not be validated: the checking process "
                             "was killed by signal 9 without an answer"]


def test_with_other_threads_running_it_validates_in_process(tmp_path: Path) -> None:
    """A fork copies other threads' locks, not the threads: then no child."""
    got = _python("""
        import json, os, threading
        from amqp_policy_proxy.daemon.config_child import validate_apart
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        pid = validate_apart(os.getpid)
        stop.set()
        print(json.dumps({"here": pid == os.getpid()}))
    """, tmp_path)
    assert got == {"here": True}


def _maps_once_started(argv: list[str], cwd: Path) -> str:
    """Start the daemon, wait (30 s at most) for its start line, return its /proc maps; stop
    it."""
    log = cwd / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while " started: listening on " not in log.read_text():
            assert proc.poll() is None, f"the daemon exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"no start line: {log.read_text()}"
            time.sleep(0.05)
        return Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_running_daemon_has_not_loaded_the_schema(tmp_path: Path) -> None:
    """`run --config` through the CLI: listening, and pydantic's extension is not mapped."""
    path = _config(tmp_path, GOOD.replace("127.0.0.1:5672", "127.0.0.1:1"))
    maps = _maps_once_started([sys.executable, "-m", "amqp_policy_proxy", "run", "--config",
                               str(path)], tmp_path)
    assert "pydantic_core" not in maps


def test_a_bad_config_still_exits_2_with_file_key_and_reason(tmp_path: Path) -> None:
    """Through the child, `run` prints the same `file: key.path: reason` lines, no
    traceback, and exits 2."""
    path = _config(tmp_path, GOOD.replace('level = "info"', 'level = "loud"'))
    out = subprocess.run([sys.executable, "-m", "amqp_policy_proxy", "run", "--config",
                          str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    assert f"error: {path}: logging.level: must be " in out.stderr
    assert "Traceback" not in out.stderr
