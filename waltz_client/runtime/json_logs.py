"""Log lines as JSON (``log_format = "json"``), and the context they carry.

One object a line: ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``,
``message`` (formatted), ``exception`` (the traceback, when there is one), ``stack``
(with ``stack_info``), and, where they apply, ``partition``, ``session`` and ``peer``.

The context fields come from context variables, so that a partition's tasks carry its ID
without every log call naming it: ``log_context(partition=3)`` around creating the
tasks (a task copies the current context when it is created), or ``set_log_context``
inside a task's own coroutine (its context is its own). A field given to the log call
(``extra={"partition": 3}``) wins over the context's.

Pure: no handler is installed by importing it (``configure_logging`` does that).
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
from types import TracebackType
from typing import Any

TEXT = "text"
JSON = "json"
LOG_FORMATS = (TEXT, JSON)
# The text format the daemons have always written (tests and users match it).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

PARTITION: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "waltz_log_partition", default=None
)
SESSION: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "waltz_log_session", default=None
)
PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("waltz_log_peer", default=None)
CONTEXT_FIELDS: tuple[tuple[str, contextvars.ContextVar[Any]], ...] = (
    ("partition", PARTITION),
    ("session", SESSION),
    ("peer", PEER),
)


def set_log_context(
    *, partition: int | None = None, session: int | None = None, peer: str | None = None
) -> None:
    """Set the fields given (None: leave it) in the current context, for good: inside a
    task's coroutine, or before creating tasks that are to carry them."""
    if partition is not None:
        PARTITION.set(partition)
    if session is not None:
        SESSION.set(session)
    if peer is not None:
        PEER.set(peer)


class log_context:  # a class, named as the function it reads as in a ``with``
    """Set the fields given (None: leave it) for the ``with`` block, then put back what
    was there (a block that awaits must end in the task it started in). The hottest
    callbacks (a connection's ``data_received``) set ``PEER`` and reset it themselves."""

    __slots__ = ("_partition", "_peer", "_session", "_tokens")

    def __init__(
        self, *, partition: int | None = None, session: int | None = None, peer: str | None = None
    ) -> None:
        self._partition = partition
        self._session = session
        self._peer = peer
        self._tokens: tuple[
            contextvars.Token[Any] | None,
            contextvars.Token[Any] | None,
            contextvars.Token[Any] | None,
        ] = (None, None, None)

    def __enter__(self) -> None:
        self._tokens = (
            None if self._partition is None else PARTITION.set(self._partition),
            None if self._session is None else SESSION.set(self._session),
            None if self._peer is None else PEER.set(self._peer),
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        partition, session, peer = self._tokens
        self._tokens = (None, None, None)
        if peer is not None:
            PEER.reset(peer)
        if session is not None:
            SESSION.reset(session)
        if partition is not None:
            PARTITION.reset(partition)


def current_context() -> dict[str, Any]:
    """The context fields set here: ``{"partition": 3, "peer": "10.0.0.7:51234"}``."""
    found = {}
    for name, var in CONTEXT_FIELDS:
        value = var.get()
        if value is not None:
            found[name] = value
    return found


def rfc3339(created: float) -> str:
    """``2026-11-28T11:31:16.123Z`` for a ``time.time()`` value."""
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (the keys are in the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record), default=str)

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        line: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            # Formatted once, as logging.Formatter does, and kept for other handlers.
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        line.update(current_context())
        for name, _ in CONTEXT_FIELDS:  # given to the call: ``extra={"partition": 3}``
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        return line


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``)."""
    if log_format == JSON:
        return JsonFormatter()
    if log_format == TEXT:
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"expected one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def configure_logging(
    level: int | str, log_format: str = TEXT, json_formatter: JsonFormatter | None = None
) -> None:
    """The root logger writes to stderr in ``log_format`` at ``level``. Text: exactly
    ``logging.basicConfig`` with ``TEXT_FORMAT``, as before. JSON: the root's handlers
    replaced by one that writes JSON lines (with ``json_formatter``, a subclass that adds
    keys, if given), so that no other line format slips in."""
    if log_format == TEXT:
        logging.basicConfig(level=level, format=TEXT_FORMAT)
        return
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter or formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # a Python warning is a JSON line too, not raw stderr
