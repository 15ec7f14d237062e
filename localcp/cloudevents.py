"""CloudEvents as Knative's adapters send them, for the tests and benchmarks that post events to
bind themselves (forged, replayed or measured requests), and a client that posts them.

The headers are the ones the real ApiServerSource receive adapter and PingSource send (their
captures: tests/fixtures/sample-events/, re-taken from the real adapter by
localcp/capture_events.py; tests/test_capture_events.py holds these functions to them). What
delivers events to bind on the local stack is the real adapter itself (localcp/adapter.py).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import urllib3

log = logging.getLogger("cloudevents")
# What the real adapter retries, and when (measured: tests/fixtures/sample-events/README.md).
RETRIED_STATUSES = frozenset({404, 413, 429, 502, 503, 504})
RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)  # after each failed attempt: sent at 0, 0.1, 0.3, 0.7, 1.5, 3.1 s
USER_AGENT = "Go-http-client/1.1"  # the adapter's Go HTTP client, as the captures show


def rfc3339_nano(ns: int | None = None) -> str:
    """Go's time.RFC3339Nano in UTC: nanoseconds with trailing zeros dropped."""
    ns = time.time_ns() if ns is None else ns
    seconds, fraction = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}".rstrip("0")
    return f"{stamp}.{digits}Z" if digits else f"{stamp}Z"


def cloudevent_headers(kind: str, obj: dict[str, Any], source: str, source_namespace: str = "gpu-scheduler") -> dict[str, str]:
    """The HTTP headers of one binary-mode event, as the receive adapter writes them."""
    meta = obj["metadata"]
    return {
        "Accept-Encoding": "gzip",
        "Ce-Apiversion": obj.get("apiVersion", "v1"),
        "Ce-Id": str(uuid.uuid4()),
        "Ce-Kind": obj.get("kind", "Pod"),
        "Ce-Name": meta["name"],
        "Ce-Namespace": meta["namespace"],
        "Ce-Source": source,
        "Ce-Specversion": "1.0",
        "Ce-Subject": f"/apis/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        "Ce-Time": rfc3339_nano(),
        "Ce-Type": f"dev.knative.apiserver.resource.{kind}",
        "Content-Type": "application/json",
        "Kn-Namespace": source_namespace,
        "User-Agent": USER_AGENT,
    }


def ping_headers(source: str = "/apis/v1/namespaces/gpu-scheduler/pingsources/resync") -> dict[str, str]:
    """A PingSource event (binary mode), as used for the periodic resync."""
    return {
        "Ce-Id": str(uuid.uuid4()), "Ce-Source": source, "Ce-Specversion": "1.0",
        "Ce-Type": "dev.knative.sources.ping", "Ce-Time": rfc3339_nano(),
        "Content-Type": "application/json", "User-Agent": USER_AGENT,
    }


class Sender:
    """Posts events to a sink, retried as the adapter retries them (delays=(): once)."""

    def __init__(self, sink: str, delays: tuple[float, ...] = RETRY_DELAYS):
        self.sink = sink
        self.delays = delays
        self.http = urllib3.PoolManager(maxsize=4, retries=False, timeout=urllib3.Timeout(connect=2, read=30))
        self.statuses: list[int] = []  # every answer seen (0 = connection error), for tests
        self.results: list[tuple[str, int, str]] = []  # (object name, status, bind's "result")
        self.dropped: list[tuple[str, int]] = []  # (object name, last status) given up after retries
        self._lock = threading.Lock()

    def send(self, headers: dict[str, str], body: bytes) -> int:
        for attempt in range(len(self.delays) + 1):
            result = ""
            try:
                response = self.http.request("POST", self.sink, body=body, headers=headers)
                status = response.status
                try:
                    result = json.loads(response.data).get("result", "")
                except (ValueError, AttributeError):
                    pass
            except urllib3.exceptions.HTTPError:
                status = 0
            with self._lock:
                self.statuses.append(status)
                self.results.append((headers.get("Ce-Name", ""), status, result))
            if 200 <= status < 300:
                return status
            if status != 0 and status not in RETRIED_STATUSES:
                break
            if attempt < len(self.delays):
                time.sleep(self.delays[attempt])
        log.warning("failed to send cloudevent %s (%s) after %d attempts, last status %s",
                    headers.get("Ce-Id"), headers.get("Ce-Name"), attempt + 1, status)
        with self._lock:
            self.dropped.append((headers.get("Ce-Name", ""), status))
        return status
