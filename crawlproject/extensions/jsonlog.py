"""JSON-lines logs for log shippers (opt-in: ``LOG_JSON = True``).

Every record becomes one line holding one JSON object: ``time`` (ISO 8601,
UTC), ``level``, ``logger``, ``message``, ``spider`` and ``node`` when known,
``exc`` (the formatted traceback, inside the same line) when there is one.

Scrapy rebuilds its log handler (and its formatter) from the settings while a
crawler starts, so a formatter set on the handler would not last. This add-on
(``ADDONS``) instead sets ``LOG_FORMAT = "%(message)s"`` and installs a log
record factory whose message *is* the JSON object, built when the record is
formatted (so ``extra={"spider": ...}`` is in it) and with the traceback moved
inside. Lines Scrapy writes before its handler is rebuilt (its start banner,
versions, the lists of add-ons, extensions and overridden settings) keep the
plain format.
"""

from __future__ import annotations

import json
import logging
import traceback
from datetime import datetime, timezone

from crawlproject.defaults import setting
from crawlproject.node import node_name


class _JsonMessage:
    """A record's message that renders the whole record as one JSON object."""

    __slots__ = ("record", "msg", "args", "exc", "node")

    def __init__(self, record: logging.LogRecord, node: str):
        self.record, self.msg, self.args, self.node = record, record.msg, record.args, node
        self.exc = None
        if record.exc_info:
            self.exc = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            record.exc_info = None  # else the formatter appends it on new lines
        if record.stack_info:
            self.exc = (self.exc + "\n" if self.exc else "") + record.stack_info
            record.stack_info = None

    def __str__(self) -> str:
        record = self.record
        message = str(self.msg)
        if self.args:
            try:
                message = message % self.args
            except (TypeError, ValueError) as exc:
                message = f"{message} (unformattable arguments: {exc})"
        data = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        spider = getattr(record, "spider", None)
        if spider is not None:
            data["spider"] = getattr(spider, "name", None) or str(spider)
        if self.node:
            data["node"] = self.node
        if self.exc:
            data["exc"] = self.exc
        return json.dumps(data, ensure_ascii=False, default=str)


class _JsonRecordFactory:
    def __init__(self, base, node: str):
        self.base, self.node = base, node

    def __call__(self, *args, **kwargs) -> logging.LogRecord:
        record = self.base(*args, **kwargs)
        record.msg, record.args = _JsonMessage(record, self.node), ()
        return record


def install(node: str = "") -> None:
    """Make every log record of this process render as one JSON line."""
    base = logging.getLogRecordFactory()
    if isinstance(base, _JsonRecordFactory):
        base.node = node
        return
    logging.setLogRecordFactory(_JsonRecordFactory(base, node))


class JsonLogsAddon:
    """``ADDONS = {"crawlproject.extensions.jsonlog.JsonLogsAddon": 0}``; on with
    ``LOG_JSON = True``."""

    def update_settings(self, settings) -> None:
        if not setting(settings, "LOG_JSON"):
            return
        settings.set("LOG_FORMAT", "%(message)s", priority="addon")
        install(node_name(settings))
