"""Process logging: ``text`` (human) or ``json`` (one object per line) and the request id.

``request_id`` is a context variable the HTTP middleware sets for the duration of a request
(``agents_ctx.http.observe``), so every line logged while serving it carries the id. Event
lines pass ``extra={"topic": ..., "partition": ..., "offset": ...}`` (:func:`event_extra`)
and the JSON format emits those fields; the text format appends them as ``key=value``.
"""

from __future__ import annotations

import contextvars
import logging
from datetime import UTC, datetime
from typing import Final, Literal

import orjson

LogFormat = Literal["text", "json"]
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "memstream_request_id", default=None
)
EVENT_FIELDS: Final = ("topic", "partition", "offset", "processor")
ACCESS_FIELDS: Final = ("method", "path", "route", "status", "duration_ms", "client")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def event_extra(topic: str, partition: int, offset: int, **more: object) -> dict[str, object]:
    """``extra=`` for a log line about one event."""
    return {"topic": topic, "partition": partition, "offset": offset, **more}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    out: dict[str, object] = {}
    rid = getattr(record, "request_id", None) or request_id.get()
    if rid is not None:
        out["request_id"] = rid
    for name in (*EVENT_FIELDS, *ACCESS_FIELDS):
        value = record.__dict__.get(name)
        if value is not None:
            out[name] = value
    return out


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id"?, "topic"?, ...}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()
