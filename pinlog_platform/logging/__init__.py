"""Log output of both services: one JSON object per line, or one readable line for people.

JSON lines (python-json-logger) carry ``timestamp``, ``level``, ``logger`` and ``message``, plus
``context_id`` and ``stage`` while a ``log_context`` is active, and ``trace_id`` and ``span_id``
(hex, as in ``traceparent``) while a span is current with traces on (``pinlog_platform.tracing``),
so an operator can follow one context across both services without parsing messages. Messages
never carry note text or secrets (§6); that is the callers' rule, not something a formatter
could enforce.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from pinlog_platform import tracing

LogFormat = Literal["json", "text"]

# Fields attached to every record logged while a log_context is active (per asyncio task).
_CONTEXT: ContextVar[Mapping[str, object]] = ContextVar(
    "pinlog_log_context", default=MappingProxyType({})
)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = ("asctime", "levelname", "name", "message")
JSON_RENAMES = {"asctime": "timestamp", "levelname": "level", "name": "logger"}
# Libraries whose request logs would name URLs we log ourselves, without their noise.
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "openai", "aiohttp")


class _ContextFilter(logging.Filter):
    """Copies the active ``log_context`` fields and the current span's ids onto each record
    (JSON shows them as keys)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _CONTEXT.get().items():
            setattr(record, key, value)
        ids = tracing.current_ids()
        if ids is not None:
            record.trace_id, record.span_id = ids
        return True


def _timestamp(record: logging.LogRecord) -> str:
    """Local time with milliseconds and the UTC offset: ``2026-12-01T22:30:01.123+0000``."""
    seconds = time.localtime(record.created)
    return (
        f"{time.strftime('%Y-%m-%dT%H:%M:%S', seconds)}.{int(record.msecs):03d}"
        f"{time.strftime('%z', seconds)}"
    )


class _JsonFormatter(JsonFormatter):
    """JSON lines whose ``timestamp`` carries milliseconds."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _timestamp(record)


class _TextFormatter(logging.Formatter):
    """One readable line, the active ``log_context`` fields appended as ``key=value``; the
    time carries milliseconds."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _timestamp(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _CONTEXT.get()
        if not fields:
            return line
        suffix = " ".join(f"{key}={value}" for key, value in fields.items())
        first, newline, rest = line.partition("\n")
        return f"{first} {suffix}{newline}{rest}"


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Attach ``fields`` (e.g. ``context_id=42, stage="embedding"``) to records logged inside,
    nested contexts adding to the outer ones."""
    token = _CONTEXT.set(MappingProxyType({**_CONTEXT.get(), **fields}))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def configure(log_format: LogFormat = "json", level: str = "INFO") -> None:
    """Route the root logger to stderr in ``log_format``; replaces earlier handlers."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(
            _JsonFormatter(
                " ".join(f"%({name})s" for name in JSON_FIELDS),
                rename_fields=JSON_RENAMES,
                timestamp=False,
                # uvicorn adds a copy of its message with terminal colour codes.
                reserved_attrs=[*RESERVED_ATTRS, "color_message"],
            )
        )
    else:
        handler.setFormatter(_TextFormatter(TEXT_FORMAT))
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
