"""Log lines for operators: the console script's ``--log-format json|text`` and ``--log-level``.

The library only logs: module loggers under ``hostedrooms`` (``logging.getLogger(__name__)``), with a
``NullHandler`` on the ``hostedrooms`` logger (so an application that configured no logging prints nothing), and
never a handler of its own that prints. An application routes the records where it likes; the console script's
long-running commands install :func:`logging_to`'s handler on the ``hostedrooms`` logger for the command's run.

Every record the library emits carries an ``event`` name (``replicate.pass``, ``room.refused``, ...) and, where
it concerns one, the ``room`` and ``gateway`` (plus fields such as ``epoch``, ``lag``, ``attempts``: see
docs/cli.md), passed with ``extra=``. Records never hold a message body, a grant, a lease token or a password (a
replicator's ``reason`` may quote what the source answered, as the console script's output does); as a last guard,
the formatters mask any URL password or ``password=`` in a line (:func:`~hostedrooms.errors.redact`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .display import terminal_text
from .errors import redact

__all__ = ["FORMATS", "LEVELS", "REQUIRED_FIELDS", "JsonFormatter", "TextFormatter", "fields", "logging_to",
           "logs_enabled"]

#: ``--log-format`` choices and ``--log-level`` choices.
FORMATS = ("json", "text")
LEVELS = ("debug", "info", "warning", "error")
#: The keys of every JSON line (None where a record does not concern a room or a gateway).
REQUIRED_FIELDS = ("time", "level", "event", "room", "gateway", "logger", "message")
# The attributes every LogRecord has: anything else on a record came through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _timestamp(created: float) -> str:
    """ISO 8601 in UTC with milliseconds: ``2026-12-02T23:05:01.250Z``."""
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value))


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """A record as the flat fields of one log line: the required ones first, then its ``extra=`` fields.

    :param record: a log record.
    :returns: the line's fields, by name.
    """
    line: dict[str, Any] = {
        "time": _timestamp(record.created), "level": record.levelname, "event": getattr(record, "event", record.name),
        "room": _plain(getattr(record, "room", None)), "gateway": _plain(getattr(record, "gateway", None)),
        "logger": record.name, "message": redact(record.getMessage())}
    for key, value in vars(record).items():
        if key not in _STANDARD and key not in line:
            line[key] = _plain(value)
    if record.exc_info and record.exc_info[0] is not None:
        line["error"] = record.exc_info[0].__name__  # the class only: a traceback may quote values
    return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line (ASCII, so no character of a stored value can break the line)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record), ensure_ascii=True, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``time level event message key=value ...``, control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        line = fields(record)
        head = f"{line.pop('time')} {line.pop('level'):<7} {line.pop('event')} {line.pop('message')}"
        del line["logger"]
        rest = " ".join(f"{key}={value}" for key, value in line.items() if value is not None)
        return terminal_text(f"{head} {rest}".rstrip())


def logs_enabled() -> bool:
    """Whether :func:`logging_to` has a handler installed now.

    :returns: True while :func:`logging_to` has a handler installed.
    """
    return any(isinstance(handler, _Installed) for handler in logging.getLogger("hostedrooms").handlers)


class _Installed(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`logging_to` installs (told apart from an application's own)."""


@contextmanager
def logging_to(stream: TextIO, *, log_format: str | None, level: str | None) -> Iterator[None]:
    """While the block runs, hostedrooms' records at ``level`` (default ``info``) and above go to ``stream`` in
    ``log_format`` (default ``text``); neither given: nothing is installed. The logger's level and handlers
    are restored afterwards.

    :param stream: where the lines go.
    :param log_format: ``"json"`` or ``"text"``, or None.
    :param level: the lowest level logged (a level name such as ``"info"``), or None.
    :returns: a context manager; the handler is installed while its block runs.
    """
    if log_format is None and level is None:
        yield
        return
    handler = _Installed(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logger = logging.getLogger("hostedrooms")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, (level or "info").upper()))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
