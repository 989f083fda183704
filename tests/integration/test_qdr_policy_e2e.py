"""QDR policy files load unchanged: a group from QDR's own system tests whose
maxSessionWindow (9999) is smaller than its maxFrameSize (222222) loads with a warning, in
`check` and in the running daemon, which gives each session a window of 1 frame."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from proton import Message

from amqp_policy_proxy.daemon.config import DaemonConfig
from tests.support.proxy import ProxyThread

from .test_proxy_e2e import connect

pytestmark = pytest.mark.integration

# The group as QDR's system tests write it (a policyDir file: "#" comment lines allowed).
QDR_FILE = """\
# maxSessionWindow smaller than maxFrameSize, as in qpid-dispatch's system tests
[
    ["vhost", {
        "hostname": "e2e",
        "allowUnknownUser": true,
        "groups": {
            "$default": {
                "users": "alice",
                "remoteHosts": "*",
                "maxFrameSize": 222222,
                "maxMessageSize": 222222,
                "maxSessionWindow": 9999,
                "maxSessions": 1,
                "sources": "*",
                "targets": "*"
            }
        }
    }]
]
"""
WARNING = ("vhost[e2e].groups.$default.maxSessionWindow: maxSessionWindow 9999 is smaller than "
           "maxFrameSize 222222: the session window becomes 1 frame")


def test_check_accepts_it_with_a_warning(tmp_path):
    policy = tmp_path / "qdr-window.json"
    policy.write_text(QDR_FILE)
    result = subprocess.run([sys.executable, "-m", "amqp_policy_proxy", "check", "--policy",
                             str(policy)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"warning: {policy}: {WARNING}" in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1].startswith("ok: 1 vhost(s): e2e;")


def test_the_daemon_logs_the_warning_at_start_and_serves_the_group(broker_address, tmp_path,
                                                                  caplog):
    caplog.set_level(logging.WARNING, logger="amqp_policy_proxy.daemon.reload")
    policy = tmp_path / "qdr-window.json"
    policy.write_text(QDR_FILE)
    # The daemon loads the file itself (as `run` does), so its warnings go to the log.
    with ProxyThread([broker_address], config=DaemonConfig(policy_path=str(policy))) as proxy:
        assert [r.getMessage() for r in caplog.records] == [f"policy: {policy}: {WARNING}"]
        c = connect(proxy.port, "alice")
        try:
            sender = c.create_sender("qdr.window")
            sender.send(Message(body=b"x" * 3000))  # one frame: fits the 1-frame window
        finally:
            c.close()


def test_messages_keep_flowing_through_a_one_frame_window(broker_address, tmp_path):
    """The session window the proxy gives the client (1 frame here) is reopened as the
    client's frames are forwarded (the router, whose own window is larger, sends no Flow)."""
    policy = tmp_path / "qdr-window.json"
    policy.write_text(QDR_FILE)
    with ProxyThread([broker_address], config=DaemonConfig(policy_path=str(policy))) as proxy:
        c = connect(proxy.port, "alice", timeout=3)
        try:
            sender = c.create_sender("qdr.window")
            for i in range(3):
                sender.send(Message(body=b"%d" % i))
        finally:
            c.close()
