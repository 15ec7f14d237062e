"""One JSON object per log line, so operators can filter on pod, decision and latency."""
from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

# Log lines carry what requests sent (uids, names, event ids, messages quoting the map), so every
# value is capped like MapError's message: a line stays a few kilobytes whatever came in.
MAX_CHARS = 1000  # per string value
MAX_ITEMS = 5  # per list, as MapError names 5 problems
MAX_KEYS = 30  # per object
MAX_DEPTH = 4
MAX_EXCEPTION_CHARS = 8000


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def bounded(value, depth: int = 0):
    """`value` with strings, lists and objects cut to the caps above (a copy; never recursive
    past MAX_DEPTH, so nesting cannot reach the recursion limit)."""
    if isinstance(value, str):
        return _cut(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value if not isinstance(value, int) or abs(value) < 10**18 else _cut(str(value), 40)
    if depth >= MAX_DEPTH:
        return f"<{type(value).__name__}>"
    if isinstance(value, dict):
        items = list(value.items())
        result = {_cut(str(k), 100): bounded(v, depth + 1) for k, v in items[:MAX_KEYS]}
        if len(items) > MAX_KEYS:
            result["..."] = f"{len(items) - MAX_KEYS} more keys"
        return result
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        result = [bounded(v, depth + 1) for v in items[:MAX_ITEMS]]
        if len(items) > MAX_ITEMS:
            result.append(f"... and {len(items) - MAX_ITEMS} more")
        return result
    return _cut(str(value))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _cut(record.getMessage()),
        }
        entry.update({k: bounded(v) for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = _cut(self.formatException(record.exc_info), MAX_EXCEPTION_CHARS)
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
