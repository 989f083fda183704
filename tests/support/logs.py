"""Catching what one logger emits, on that logger itself."""

from __future__ import annotations

import logging


class LoggerLines(logging.Handler):
    """The messages one logger (and its children) emits at INFO and above, caught on that
    logger itself, not on the root, whose handlers another test's in-process ``run`` may
    replace at any moment under xdist. A context manager: it enables the logger at INFO
    while it is in use and puts its level and ``disabled`` back afterwards.

    Args:
        name: the logger's name, e.g. ``amqp_policy_proxy.core.context``.
    """

    def __init__(self, name: str) -> None:
        super().__init__(logging.INFO)
        self.logger = logging.getLogger(name)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> LoggerLines:
        self.saved = (self.logger.level, self.logger.disabled)
        self.logger.setLevel(logging.INFO)
        self.logger.disabled = False
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.saved[0])
        self.logger.disabled = self.saved[1]
