"""docs/deploy.md, sections 2 (qdrouterd) and 3 (RabbitMQ), run literally on the installed package.

The guide marks the blocks this test runs with an HTML comment right before the fenced block,
``<!-- deploy-test: SECTION NAME -->`` (SECTION is ``qdrouterd`` or ``rabbitmq``); the test uses
exactly the text of those blocks:

=============================================  ================================================
``/etc/...`` (a path)                           written to that path (the router's files under
                                                a scratch root, see below)
``rabbitmq.conf``                               the RabbitMQ node's whole ``rabbitmq.conf``
``users``                                       each line run (``rabbitmqctl`` on the test's
                                                node; shell lines as root)
``check``                                       each line run as root; every one must exit 0
``check-output``                                what ``check`` prints, up to its digest
``run``                                         each line run; the last one, the proxy in the
                                                foreground, stays running
``status``                                      run as root; must exit 0 and show the upstream
                                                ``up``
``client.py``                                   run with this Python; stdout must equal
``client-output``                               this block
=============================================  ================================================

The proxy is the Debian package built from this checkout and installed by this directory's
fixtures (``conftest.py``): ``/usr/bin/amqp-policy-proxy``, the package's
``/etc/amqp-policy-proxy``, ``/var/log/amqp-policy-proxy`` and its system user. Every command
runs as written, ``runuser -u amqp-policy-proxy --`` included, as root (the package tests need
root). What the test changes in the package's files it puts back afterwards (the packaging
tests that follow check the shipped state), and it removes ``/run/amqp-policy-proxy``.

Mechanical substitutions, so that the test does not touch this machine's router or well-known
ports (nothing else is changed): the router's own files (``/etc/qpid-dispatch``,
``/etc/sasl2``, ``/var/lib/qdrouterd``) go under a scratch directory; ``127.0.0.1:5673`` and
``port: 5673`` (the moved router or broker listener), ``0.0.0.0:5672`` (the proxy's listener),
``amqp.example.com:5672`` (the proxy, as clients name it) and ``127.0.0.1:9464`` (metrics)
become free ports on 127.0.0.1. The router is this machine's qdrouterd 1.19 build
(:func:`tests.support.qdrouterd.router_command`) started on the guide's ``qdrouterd.conf`` in
place of ``systemctl restart qdrouterd``; RabbitMQ is the Debian package started by
:class:`tests.support.rabbitmq.RabbitMQ` on the guide's ``rabbitmq.conf``. A command outside
:data:`KNOWN_COMMANDS` fails the test, so the guide cannot grow a step this test skips.

About 15 s for the qdrouterd section and 25 s for RabbitMQ (6-14 s for the node to start,
2-3 s per ``rabbitmqctl``), on top of the package build the directory shares.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import spawn_watchdog, stop_watchdog
from tests.support.debian import ETC, ROOT, clean_env
from tests.support.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GUIDE = ROOT / "docs" / "deploy.md"
EVENTS = Path("/var/log/amqp-policy-proxy/events")
RUNTIME_DIR = Path("/run/amqp-policy-proxy")

MARKED_BLOCK = re.compile(
    r"^<!-- deploy-test: (?P<section>\S+) (?P<name>\S+) -->\n```[^\n]*\n(?P<text>.*?)^```$",
    re.MULTILINE | re.DOTALL)
COMMON_BLOCKS = {"users", "/etc/amqp-policy-proxy/policy.d/20-shop.json",
                 "/etc/amqp-policy-proxy/config.toml", "check", "check-output", "run", "status",
                 "client.py", "client-output"}
EXPECTED_BLOCKS = {
    "qdrouterd": COMMON_BLOCKS | {"/etc/qpid-dispatch/qdrouterd.conf", "/etc/sasl2/qdrouterd.conf"},
    "rabbitmq": COMMON_BLOCKS | {"rabbitmq.conf"},
}
#: The first word of every command the guide may give in a marked block.
KNOWN_COMMANDS = {"amqp-policy-proxy", "runuser", "install", "rm", "echo", "saslpasswd2",
                  "rabbitmqctl"}
#: The router's own paths, moved under the scratch root.
ROUTER_PATHS = ("/etc/qpid-dispatch", "/etc/sasl2", "/var/lib/qdrouterd")
#: The package's paths, used as they are.
PACKAGE_PATHS = ("/etc/amqp-policy-proxy/",)


def guide_blocks(text: str) -> dict[str, dict[str, str]]:
    """The guide's marked blocks: section -> name -> text; each pair must appear once."""
    blocks: dict[str, dict[str, str]] = {}
    for match in MARKED_BLOCK.finditer(text):
        section, name = match["section"], match["name"]
        assert name not in blocks.get(section, {}), f"docs/deploy.md marks two {section} {name}"
        blocks.setdefault(section, {})[name] = match["text"]
    return blocks


def commands_of(line: str) -> list[str]:
    """The command words of a shell line: the first word of each part of a pipeline
    (``echo x | saslpasswd2 ...`` -> ``["echo", "saslpasswd2"]``); ``[]`` for a comment."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|;&")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[str] = []
    expect = True
    for token in lexer:
        if token in ("|", "||", "&&", ";", "&"):
            expect = True
        elif expect:
            commands.append(token)
            expect = False
    return commands


def test_commands_of_reads_pipelines_and_quotes() -> None:
    assert commands_of("echo 's' | saslpasswd2 -p -c u") == ["echo", "saslpasswd2"]
    assert commands_of("rabbitmqctl set_permissions '^(a|b)$'") == ["rabbitmqctl"]
    assert commands_of("# a comment") == [] and commands_of("") == []


def test_the_guide_marks_every_block_this_test_runs() -> None:
    text = GUIDE.read_text()
    blocks = guide_blocks(text)
    assert set(blocks) == set(EXPECTED_BLOCKS), set(blocks)
    for section, expected in EXPECTED_BLOCKS.items():
        assert set(blocks[section]) == expected, (section, set(blocks[section]) ^ expected)
    # every marker is followed by its fenced block (a marker the regex missed is a typo)
    assert text.count("<!-- deploy-test:") == sum(len(b) for b in blocks.values())
    # the commands are ones this test knows how to run
    for section in blocks.values():
        for name in ("users", "check", "run", "status"):
            for line in section[name].splitlines():
                assert set(commands_of(line)) <= KNOWN_COMMANDS, (name, line)


class Substitution:
    """The documented mechanical substitutions (see the module docstring)."""

    def __init__(self, scratch: Path, upstream_port: int, proxy_port: int, metrics_port: int):
        self.pairs = [(path, f"{scratch}{path}") for path in ROUTER_PATHS] + [
            ("127.0.0.1:5673", f"127.0.0.1:{upstream_port}"),
            ("port: 5673", f"port: {upstream_port}"),
            ("0.0.0.0:5672", f"127.0.0.1:{proxy_port}"),
            ("amqp.example.com:5672", f"127.0.0.1:{proxy_port}"),
            ("127.0.0.1:9464", f"127.0.0.1:{metrics_port}"),
        ]

    def text(self, text: str) -> str:
        """``text`` with every substitution applied."""
        for old, new in self.pairs:
            text = text.replace(old, new)
        return text

    def lines(self, block: str) -> list[str]:
        """The block's command lines (comment and blank lines dropped), substituted."""
        out = []
        for line in self.text(block).splitlines():
            if commands := commands_of(line):
                assert set(commands) <= KNOWN_COMMANDS, \
                    f"docs/deploy.md asks for a command this test cannot run: {line}"
                out.append(line)
        return out


def env() -> dict[str, str]:
    """The environment of the guide's commands: this one without PYTHONPATH (the installed
    package imports its own code), with the system's sbin directories on PATH."""
    return clean_env(PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def shell(line: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one of the guide's command lines with bash, as root, as an operator would."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env())


def wait_listening(port: int, proc: subprocess.Popen[str], what: str,
                   timeout: float = 30.0) -> None:
    """Wait until 127.0.0.1:``port`` accepts; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"{what} exited with {proc.returncode}:\n{out}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{what} did not listen on 127.0.0.1:{port} in {timeout} s")


def stop(proc: subprocess.Popen[str] | None) -> None:
    """SIGTERM (the proxy drains and exits), SIGKILL after 30 s."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


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
def package_files(installed: Path) -> Iterator[None]:
    """The installed package's files as the package left them, put back after the test:
    /etc/amqp-policy-proxy (contents restored in place, so owners and modes stay; files the
    test added removed), the event-log directory emptied, /run/amqp-policy-proxy removed."""
    before = {p: p.read_bytes() for p in ETC.rglob("*") if p.is_file() and not p.is_symlink()}
    events = set(EVENTS.rglob("*"))
    try:
        yield
    finally:
        for path in sorted(ETC.rglob("*"), reverse=True):
            if path.is_file() and path not in before:
                path.unlink()
        for path, data in before.items():
            if not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
        for path in sorted(set(EVENTS.rglob("*")) - events, reverse=True):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A scratch root for the router's own files, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="amqp-policy-proxy-guide-"))
    watchdog = spawn_watchdog(f"rm -rf {shlex.quote(str(path))}")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        stop_watchdog(watchdog)


def write_files(blocks: dict[str, str], sub: Substitution) -> None:
    """Write every block named by a path to that (substituted) path."""
    for name, text in blocks.items():
        if name.startswith("/"):
            assert name.startswith(PACKAGE_PATHS + ROUTER_PATHS), name
            path = Path(sub.text(name))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(sub.text(text))


def run_proxy_steps(blocks: dict[str, str], sub: Substitution, proxy_port: int,
                    metrics_port: int, tmp_path: Path, upstream: str) -> None:
    """The guide's check, run, status and client steps (the same in both sections), then the
    proxy's own record of what the client saw: its denial counters and event-log records."""
    printed = ""
    for line in sub.lines(blocks["check"]):
        result = shell(line)
        assert result.returncode == 0, (line, result.stdout, result.stderr)
        printed += result.stdout
    expected = blocks["check-output"].strip()
    assert printed.startswith(expected + ";"), (printed, expected)

    *setup, foreground = sub.lines(blocks["run"])
    for line in setup:
        result = shell(line)
        assert result.returncode == 0, (line, result.stdout, result.stderr)
    assert shlex.split(foreground)[:3] == ["runuser", "-u", "amqp-policy-proxy"], foreground
    proxy = subprocess.Popen(shlex.split(foreground), stdin=subprocess.DEVNULL, env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(proxy_port, proxy, "the proxy")
        # the proxy runs as the service user, not as root
        owner = subprocess.run(["ps", "-o", "uid=", "--ppid", str(proxy.pid)],
                               capture_output=True, text=True).stdout.split()
        assert owner == [str(pwd.getpwnam("amqp-policy-proxy").pw_uid)], owner

        (status,) = sub.lines(blocks["status"])
        deadline = time.monotonic() + 15
        while True:   # the upstream probe runs on start; its first answer may take a moment
            result = shell(status)
            assert result.returncode == 0, (result.stdout, result.stderr)
            row = [line for line in result.stdout.splitlines() if upstream in line]
            if row and " up" in row[0] or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert row and " up" in row[0], result.stdout

        client = tmp_path / "client.py"
        client.write_text(sub.text(blocks["client.py"]))
        result = subprocess.run([sys.executable, str(client)], capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path)
        assert result.returncode == 0, (result.stdout, result.stderr)
        assert result.stdout == blocks["client-output"], result.stderr

        # the two denials the client saw are the proxy's, counted as such ...
        counted = denials(metrics_port)
        assert counted.get(("amqp_proxy_links_denied_total", "source"), 0) >= 1, counted
        assert counted.get(("amqp_proxy_connections_denied_total", "unknown_user"), 0) >= 1, \
            counted
    finally:
        stop(proxy)
    # ... and on record, written by the service user where the package put the event log
    records = [p for p in EVENTS.rglob("*") if p.is_file() and p.stat().st_size > 0]
    assert records, list(EVENTS.rglob("*"))
    assert all(p.owner() == "amqp-policy-proxy" for p in records), records


def test_qdrouterd_section_runs_as_written(package_files: None, scratch: Path,
                                           tmp_path: Path) -> None:
    qdr = pytest.importorskip("tests.support.qdrouterd")
    reason = qdr.unavailable_reason()
    if reason is not None:
        if os.environ.get("AMQP_PROXY_REQUIRE_QDR") == "1":
            pytest.fail(f"the deploy guide's qdrouterd section needs a router but {reason}")
        pytest.skip(reason)
    blocks = guide_blocks(GUIDE.read_text())["qdrouterd"]
    router_port, proxy_port, metrics_port = free_port(), free_port(), free_port()
    sub = Substitution(scratch, router_port, proxy_port, metrics_port)

    # 2.1, 2.2: the router's files and users, then the router on its config
    write_files({k: v for k, v in blocks.items() if k.startswith(ROUTER_PATHS)}, sub)
    for line in sub.lines(blocks["users"]):
        result = shell(line)
        assert result.returncode == 0, (line, result.stdout, result.stderr)
    argv, router_env = qdr.router_command(Path(sub.text("/etc/qpid-dispatch/qdrouterd.conf")))
    router = subprocess.Popen(argv, env=router_env, cwd=scratch, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = spawn_watchdog(f"kill -9 {router.pid} 2>/dev/null")
    try:
        wait_listening(router_port, router, "qdrouterd")
        # 2.3, 2.4: the policy and the proxy's configuration, where the guide puts them
        write_files({k: v for k, v in blocks.items() if k.startswith(PACKAGE_PATHS)}, sub)
        # 2.5
        run_proxy_steps(blocks, sub, proxy_port, metrics_port, tmp_path,
                        upstream=f"127.0.0.1:{router_port}")
    finally:
        stop(router)
        stop_watchdog(watchdog)


@pytest.fixture
def rabbitmq_support():
    """tests.support.rabbitmq, skipping when Debian's RabbitMQ cannot run here."""
    rabbit = pytest.importorskip("tests.support.rabbitmq")
    reason = rabbit.RabbitMQ.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return rabbit


def test_rabbitmq_section_runs_as_written(package_files: None, rabbitmq_support, scratch: Path,
                                          tmp_path: Path) -> None:
    blocks = guide_blocks(GUIDE.read_text())["rabbitmq"]
    rabbit_port, proxy_port, metrics_port = free_port(), free_port(), free_port()
    sub = Substitution(scratch, rabbit_port, proxy_port, metrics_port)

    # 3.1: RabbitMQ with the guide's rabbitmq.conf
    node = rabbitmq_support.RabbitMQ(port=rabbit_port, config=sub.text(blocks["rabbitmq.conf"]))
    node.start(timeout=120)
    try:
        # 3.2: its vhost and user
        ctl: Callable[..., subprocess.CompletedProcess[str]] = node.ctl
        for line in sub.lines(blocks["users"]):
            args = shlex.split(line)
            assert args[0] == "rabbitmqctl", args
            result = ctl(*args[1:])
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        # 3.3, 3.4: the files, where the guide puts them
        write_files({k: v for k, v in blocks.items() if k.startswith("/")}, sub)
        # 3.5
        run_proxy_steps(blocks, sub, proxy_port, metrics_port, tmp_path,
                        upstream=f"127.0.0.1:{rabbit_port}")
    finally:
        node.stop()
