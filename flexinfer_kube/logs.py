"""Structured logs: one JSON object per line.

Log calls pass their data as `extra={"fields": {...}}`; the formatter puts them
beside `ts`, `level`, `logger` and `msg`, so a decision's reason and message are
fields a log pipeline can filter on. This module only formats.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

THIRD_PARTY = ("urllib3", "kubernetes")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Debug is flexinfer's own: the HTTP libraries' would log every request (and the
    # Kubernetes client's, response bodies, Secrets included).
    for library in THIRD_PARTY:
        logging.getLogger(library).setLevel(max(root.level, logging.INFO))
