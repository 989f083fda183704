"""docs/deploy.md, section 3 (RabbitMQ), run literally against Debian's RabbitMQ.

The guide marks the blocks this test runs with an HTML comment right before the fenced block,
``<!-- deploy-test: NAME -->``; the test uses exactly the text of those blocks:

=============================================  ================================================
``rabbitmq.conf``                               the RabbitMQ node's whole ``rabbitmq.conf``
``rabbitmq-users``                              each line run with ``rabbitmqctl`` on that node
``/etc/amqp-policy-proxy/...`` (a path)         written to that path
``check``                                       each line run; every one must exit 0
``check-output``                                what ``check`` prints, up to its digest
``run``                                         the one command started, the proxy in the foreground
``client.py``                                   run with this Python; stdout must equal
``client-output``                               this block
=============================================  ================================================

Mechanical substitutions, applied to every block, so that the test runs on this machine without
touching its /etc, /var/log or well-known ports (nothing else is changed):

* ``/etc/amqp-policy-proxy`` and ``/var/log/amqp-policy-proxy`` -> the same paths under a
  temporary root, which starts as the Debian package leaves it: the files of
  ``examples/etc/amqp-policy-proxy/`` (what the package installs in /etc) and an empty
  ``var/log/amqp-policy-proxy/events`` (what its postinst makes);
* ``127.0.0.1:5673`` (RabbitMQ's moved listener), ``0.0.0.0:5672`` (the proxy's listener),
  ``amqp.example.com:5672`` (the proxy, as clients name it) and ``127.0.0.1:9464`` (metrics)
  -> free ports on 127.0.0.1;
* in commands: a leading ``runuser -u amqp-policy-proxy --`` is dropped (the test runs as
  whoever runs it); ``amqp-policy-proxy`` is ``python -m amqp_policy_proxy`` with this
  interpreter; ``rabbitmqctl`` runs against the test's node (:meth:`RabbitMQ.ctl`); ``rm`` runs
  as is. Any other command fails the test, so the guide cannot grow a step this test skips.

RabbitMQ is the Debian package, started by :class:`tests.support.rabbitmq.RabbitMQ` as user
``rabbitmq`` on private loopback ports and directories (needs root; skipped otherwise). About
25 s: 6-14 s for RabbitMQ to start, 2-3 s per ``rabbitmqctl``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy.md"
PACKAGE_ETC = ROOT / "examples" / "etc" / "amqp-policy-proxy"

MARKED_BLOCK = re.compile(
    r"^<!-- deploy-test: (?P<name>\S+) -->\n```[^\n]*\n(?P<text>.*?)^```$",
    re.MULTILINE | re.DOTALL)
EXPECTED_BLOCKS = {"rabbitmq.conf", "rabbitmq-users", "/etc/amqp-policy-proxy/config.toml",
                   "check", "check-output", "run", "client.py", "client-output"}
RUNUSER = ["runuser", "-u", "amqp-policy-proxy", "--"]


def guide_blocks(text: str) -> dict[str, str]:
    """The guide's marked blocks by name; each name must appear once."""
    blocks: dict[str, str] = {}
    for match in MARKED_BLOCK.finditer(text):
        name = match["name"]
        assert name not in blocks, f"docs/deploy.md marks two blocks {name!r}"
        blocks[name] = match["text"]
    return blocks


def test_the_guide_marks_every_block_this_test_runs() -> None:
    blocks = guide_blocks(GUIDE.read_text())
    assert EXPECTED_BLOCKS <= set(blocks), EXPECTED_BLOCKS - set(blocks)
    files = [name for name in blocks if name.startswith("/")]
    assert files and all(name.startswith("/etc/amqp-policy-proxy/") for name in files), files
    # every marker is followed by its fenced block (a marker the regex missed is a typo)
    assert GUIDE.read_text().count("<!-- deploy-test:") == len(blocks)


class Substitution:
    """The documented mechanical substitutions (see the module docstring)."""

    def __init__(self, root: Path, rabbit_port: int, proxy_port: int, metrics_port: int):
        self.pairs = [
            ("/etc/amqp-policy-proxy", f"{root}/etc/amqp-policy-proxy"),
            ("/var/log/amqp-policy-proxy", f"{root}/var/log/amqp-policy-proxy"),
            ("127.0.0.1:5673", f"127.0.0.1:{rabbit_port}"),
            ("0.0.0.0:5672", f"127.0.0.1:{proxy_port}"),
            ("amqp.example.com:5672", f"127.0.0.1:{proxy_port}"),
            ("127.0.0.1:9464", f"127.0.0.1:{metrics_port}"),
        ]

    def text(self, text: str) -> str:
        """``text`` with every substitution applied."""
        for old, new in self.pairs:
            text = text.replace(old, new)
        return text

    def commands(self, block: str) -> list[list[str]]:
        """The block's shell lines (comments and blank lines dropped) as argument lists."""
        commands = []
        for line in self.text(block).splitlines():
            args = shlex.split(line, comments=True)
            if args[:len(RUNUSER)] == RUNUSER:
                args = args[len(RUNUSER):]
            if args:
                commands.append(args)
        return commands


def proxy_command(args: list[str]) -> list[str]:
    """``amqp-policy-proxy ARGS`` as this interpreter's ``python -m amqp_policy_proxy ARGS``;
    ``rm`` as is; anything else is a step this test does not know."""
    if args[0] == "amqp-policy-proxy":
        return [sys.executable, "-m", "amqp_policy_proxy", *args[1:]]
    if args[0] == "rm":
        return args
    raise AssertionError(f"docs/deploy.md asks for a command this test cannot run: {args}")


def wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Wait until 127.0.0.1:``port`` accepts; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the proxy exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the proxy did not listen on 127.0.0.1:{port} in {timeout} s")


def denials(metrics_port: int) -> dict[tuple[str, str], float]:
    """``(metric, reason) -> value`` of the proxy's denial counters, scraped over HTTP."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_denied_total"):
                key = (sample.name, sample.labels.get("reason", ""))
                found[key] = found.get(key, 0.0) + sample.value
    return found


@pytest.fixture
def rabbitmq_support():
    rabbit = pytest.importorskip("tests.support.rabbitmq")
    reason = rabbit.RabbitMQ.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return rabbit


def test_rabbitmq_section_runs_as_written(rabbitmq_support, tmp_path: Path) -> None:
    blocks = guide_blocks(GUIDE.read_text())
    root = tmp_path / "root"
    # the Debian package's /etc/amqp-policy-proxy and event-log directory
    shutil.copytree(PACKAGE_ETC, root / "etc" / "amqp-policy-proxy")
    (root / "var" / "log" / "amqp-policy-proxy" / "events").mkdir(parents=True)
    rabbit_port, proxy_port, metrics_port = free_port(), free_port(), free_port()
    sub = Substitution(root, rabbit_port, proxy_port, metrics_port)

    # 3.1: RabbitMQ with the guide's rabbitmq.conf
    node = rabbitmq_support.RabbitMQ(port=rabbit_port, config=sub.text(blocks["rabbitmq.conf"]))
    node.start(timeout=120)
    proxy: subprocess.Popen[str] | None = None
    try:
        # 3.2: its vhost and user
        for args in sub.commands(blocks["rabbitmq-users"]):
            assert args[0] == "rabbitmqctl", args
            result = node.ctl(*args[1:])
            assert result.returncode == 0, (args, result.stdout, result.stderr)

        # 3.3, 3.4: the files, where the guide puts them
        for name, text in blocks.items():
            if name.startswith("/"):
                path = Path(sub.text(name))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(sub.text(text))

        # 3.5: check
        printed = ""
        for args in sub.commands(blocks["check"]):
            result = subprocess.run(proxy_command(args), capture_output=True, text=True,
                                    timeout=60, stdin=subprocess.DEVNULL)
            assert result.returncode == 0, (args, result.stdout, result.stderr)
            printed += result.stdout
        expected = blocks["check-output"].strip()
        assert printed.startswith(expected + ";"), (printed, expected)

        # ... the proxy in the foreground, as the guide starts it
        (run,) = sub.commands(blocks["run"])
        proxy = subprocess.Popen(proxy_command(run), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_listening(proxy_port, proxy)

        # ... and the guide's client, through the proxy to RabbitMQ
        client = tmp_path / "client.py"
        client.write_text(sub.text(blocks["client.py"]))
        result = subprocess.run([sys.executable, str(client)], capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path)
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert result.stdout == blocks["client-output"], result.stderr

        # the two denials the client saw are the proxy's, counted as such
        counted = denials(metrics_port)
        assert counted.get(("amqp_proxy_links_denied_total", "source"), 0) >= 1, counted
        assert counted.get(("amqp_proxy_connections_denied_total", "unknown_user"), 0) >= 1, \
            counted
    finally:
        if proxy is not None and proxy.poll() is None:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait(timeout=10)
        if proxy is not None and proxy.stdout is not None:
            proxy.stdout.close()
        node.stop()
