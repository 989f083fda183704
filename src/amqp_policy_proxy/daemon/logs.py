"""Daemon layer: the process's own log (stderr; the journal under systemd), text or JSON.

Both formats are one record per line whatever a client chose as its user name, container-id,
vhost hostname, link name or address: the text format escapes every control or other
non-printable character of the rendered message (``\\n`` becomes ``\\\\n``, ``\\x1b`` becomes
``\\\\x1b``), so a name holding ``"\\nDENY ..."`` cannot forge a second line; the JSON format is
escaped by construction (:func:`json.dumps`, ASCII only, so not even U+2028 or NEL reaches the
line). Tracebacks are the only multi-line part, and only
after the record's own (escaped) line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Layout of a text record (the message is escaped first)."""

QUIET_LOGGERS = ("proton",)
"""Third-party loggers held at WARNING: the proton reactor's INFO lines ("Connecting to ...",
"Accepted connection from ...") come from the in-tree broker and demo clients, not the proxy."""

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_control(text: str) -> str:
    """Escape control and other non-printable characters so ``text`` stays on one line.

    ``\\n``, ``\\r`` and ``\\t`` become ``\\\\n``, ``\\\\r``, ``\\\\t``; any other character
    that :meth:`str.isprintable` rejects (C0/C1 controls, DEL, U+2028, bidi overrides...)
    becomes ``\\\\xNN`` (below U+0100), ``\\\\uNNNN`` or ``\\\\UNNNNNNNN``. Printable text,
    including non-ASCII letters and spaces, is unchanged.
    """
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` with the rendered message escaped by :func:`escape_control`."""

    def __init__(self) -> None:
        """Create the formatter with :data:`TEXT_FORMAT`."""
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        """Render the record's line with its message escaped."""
        message = record.message
        record.message = escape_control(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO 8601, milliseconds), ``level``,
    ``logger``, ``message``, any ``extra=`` fields, and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one line of JSON."""
        ts = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=True, default=str)


def make_formatter(fmt: str) -> logging.Formatter:
    """The formatter for ``fmt`` (``"text"`` or ``"json"``).

    Raises:
        ValueError: another format.
    """
    if fmt == "text":
        return TextFormatter()
    if fmt == "json":
        return JsonFormatter()
    raise ValueError(f"log format must be 'text' or 'json', not {fmt!r}")


def configure_logging(level: str = "info", fmt: str = "text",
                      stream: IO[str] | None = None) -> logging.Handler:
    """Send every record at ``level`` or above to ``stream`` (default stderr) in ``fmt``.

    Replaces the root logger's handlers (idempotent) and holds :data:`QUIET_LOGGERS` at
    WARNING.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (any case).
        fmt: ``text`` or ``json``.
        stream: where lines go; default ``sys.stderr``.

    Returns:
        The installed handler.

    Raises:
        ValueError: an unknown level or format.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
    return handler
