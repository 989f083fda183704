"""daemon/logs.py: one record per line whatever a client chose as a name (issue 14 finding 11)."""

from __future__ import annotations

import io
import json
import logging

from hypothesis import given
from hypothesis import strategies as st

from amqp_policy_proxy.daemon.logs import (
    JsonFormatter,
    TextFormatter,
    configure_logging,
    escape_control,
)


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("amqp_policy_proxy.core.connection", logging.INFO, __file__, 1, msg,
                            args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_escape_control_characters() -> None:
    assert escape_control("plain user é 名") == "plain user é 名"
    assert escape_control("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert escape_control("\x00\x1b[31m\x7f\x85") == "\\x00\\x1b[31m\\x7f\\x85"
    assert escape_control("x\u2028y\u202ez") == "x\\u2028y\\u202ez"


def test_text_formatter_escapes_the_rendered_message_not_the_layout() -> None:
    fmt = TextFormatter()
    line = fmt.format(record("DENY AMQP Attach sender '%s' for user '%s'",
                             "q\nFAKE DENY AMQP Open for user 'root'", "al\rice"))
    assert "\n" not in line and "\r" not in line
    assert line.endswith("INFO amqp_policy_proxy.core.connection: DENY AMQP Attach sender "
                         "'q\\nFAKE DENY AMQP Open for user 'root'' for user 'al\\rice'")


def test_text_formatter_keeps_tracebacks_after_the_escaped_line() -> None:
    fmt = TextFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record("failed for %s", "a\nb")
        rec.exc_info = sys.exc_info()
    first, *rest = fmt.format(rec).split("\n")
    assert first.endswith("failed for a\\nb")
    assert rest[0] == "Traceback (most recent call last):"


def test_json_formatter_is_one_line_with_extra_fields() -> None:
    line = JsonFormatter().format(record("user %s", "a\nb\x1b", event="start", vhosts=2))
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "user a\nb\x1b"
    assert (out["level"], out["logger"], out["event"], out["vhosts"]) == (
        "INFO", "amqp_policy_proxy.core.connection", "start", 2)
    assert out["ts"].endswith("Z") and len(out["ts"]) == len("2025-01-01T00:00:00.000Z")


@given(st.text())
def test_any_name_stays_on_one_line(name: str) -> None:
    for fmt in (TextFormatter(), JsonFormatter()):
        line = fmt.format(record("user '%s'", name))
        assert len(line.splitlines()) == 1 or line == ""


def test_configure_logging_writes_the_chosen_format() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        stream = io.StringIO()
        configure_logging("DEBUG", "json", stream)
        logging.getLogger("test_logs.probe").debug("hello %s", "x\ny")
        assert json.loads(stream.getvalue())["message"] == "hello x\ny"
        stream = io.StringIO()
        configure_logging("info", "text", stream)
        logging.getLogger("test_logs.probe").debug("hidden")
        logging.getLogger("proton").info("Connecting to ...")
        logging.getLogger("test_logs.probe").info("shown\nFAKE")
        assert stream.getvalue().count("\n") == 1
        assert stream.getvalue().rstrip().endswith("shown\\nFAKE")
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
