"""One JSON object per log line, so operators can filter on pod, decision and latency."""
from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def handler() -> logging.Handler:
    """A stderr handler writing JSON lines; the functions install it once at start."""
    stream = logging.StreamHandler()
    stream.setFormatter(JsonFormatter())
    return stream


def level(default: str = "INFO") -> str:
    """LOG_LEVEL from the environment when it names a level, else `default`."""
    wanted = os.environ.get("LOG_LEVEL", default).upper()
    return wanted if wanted in logging.getLevelNamesMapping() else default
