"""List-and-watch, as client-go's reflector does: one listing (paged), then one watch after another
from the last version seen. A watch the API server ends with 410 Gone, a dropped connection and an
API server restart all end in a new listing, handed whole to the view (`replace`), so that the view
learns what changed while it was not watching. Failures are retried with backoff, forever: a 403
"not yet ready", a 5xx and a refused connection are all the same here. The I/O side of bind."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

import prometheus_client as prom
from kubeapi.errors import APIError

log = logging.getLogger("bind")
WATCH_SECONDS = 300  # one watch request; the next continues from its last resourceVersion
FIRST_RETRY_SECONDS = 0.2
MAX_RETRY_SECONDS = 2.0  # an API server back from a restart is listed again within this long
NOT_SERVED_RETRY_SECONDS = 60.0  # an optional API the server does not serve (404): looked for again
WATCH_EVENTS = prom.Counter("gpu_scheduler_bind_watch_events_total", "Changes taken from watches", ["view"])
LISTINGS = prom.Counter("gpu_scheduler_bind_listings_total", "Listings made (start, 410, a broken watch)", ["view"])

Pages = Iterator[tuple[list[dict], str]]
Events = Iterator[tuple[str, dict, int]]


class WatchGone(Exception):
    """The API server ended a watch with an ERROR event (410 Gone, mostly)."""


class Requirement:
    """An optional kind that the configuration cannot do without (DRA's, in device env mode dra):
    when the API server does not serve it, bind is not ready, and `why()` says so in words naming
    the fix. Worked out and logged by the first watch that finds it missing, once (what it reads,
    the API server's version, is read once), and said the same by every other watch of it."""

    def __init__(self, explain: Callable[[], str]):
        self._explain = explain
        self._lock = threading.Lock()
        self._said = ""

    def why(self) -> str:
        with self._lock:
            if not self._said:
                self._said = self._explain()
                log.error("not ready: %s", self._said)
            return self._said


class Informer:
    """Keeps a view (`replace(pages) -> version` and `apply(type, object)`) current from
    `list_pages()` and `watch(version, seconds)`. `synced` is set once the first listing is in."""

    def __init__(self, name: str, list_pages: Callable[[], Pages], watch: Callable[[str, int], Events],
                 replace: Callable[[Iterable[list[dict]]], None], apply: Callable[[str, Mapping[str, Any]], None],
                 optional: bool = False, required: Requirement | None = None):
        self.name = name
        self._events_counted = WATCH_EVENTS.labels(name)  # once: labels() costs a lookup per event
        # An optional kind (DRA's, before Kubernetes 1.34) that the API server answers 404 for is an
        # empty view, synced, so that readiness does not wait for an API that will not come.
        self.optional = optional
        # ...unless the configuration requires it: then not synced, its problem why.
        self.required = required
        self.served = True
        self._list, self._watch, self._replace, self._apply = list_pages, watch, replace, apply
        self.synced = threading.Event()
        self.version = ""  # the resourceVersion the view is at: its listing's, then each event's
        self.listed_at = 0.0  # monotonic time of the last listing that succeeded
        self.problem = ""  # why the first listing has not succeeded yet (readiness says it)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        delay = FIRST_RETRY_SECONDS
        while True:
            try:
                version = self._list_once()
                delay = FIRST_RETRY_SECONDS
                while True:  # a watch that ends by its timeout continues from where it was
                    version = self._follow(version)
            except WatchGone as gone:
                log.info("watch ended; listing again", extra={"view": self.name, "detail": str(gone)[:200]})
            except Exception as error:  # an outage, a 403 "not yet ready", a broken stream: list again
                if self.optional and isinstance(error, APIError) and error.not_found:
                    self._not_served()
                    continue
                self.problem = f"listing {self.name}: {error}" if not self.synced.is_set() else ""
                log.info("watch failed; listing again", extra={"view": self.name, "detail": str(error)[:200],
                                                               "retry_in_s": delay})
                time.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _not_served(self) -> None:
        if self.required is not None:  # never synced: readiness says why, and the view stays unlisted
            self.served = False
            self.problem = self.required.why()
            time.sleep(NOT_SERVED_RETRY_SECONDS)
            return
        if self.served:
            log.warning("not served by the API server: an empty view until it is",
                        extra={"view": self.name, "retry_in_s": NOT_SERVED_RETRY_SECONDS})
            self.served = False
            self._replace(iter(()))
        self.synced.set()
        time.sleep(NOT_SERVED_RETRY_SECONDS)

    def _list_once(self) -> str:
        LISTINGS.labels(self.name).inc()
        version = ""

        def pages() -> Iterator[list[dict]]:
            nonlocal version
            for items, page_version in self._list():
                version = version or page_version
                yield items

        started = time.monotonic()
        self._replace(pages())
        self.served = True
        self.problem = ""
        self.version = version
        self.listed_at = time.monotonic()
        self.synced.set()
        log.info("listed", extra={"view": self.name, "version": version,
                                  "took_ms": round((self.listed_at - started) * 1000, 1)})
        return version

    def _follow(self, version: str) -> str:
        began, seen = time.monotonic(), 0
        for kind, obj, _ in self._watch(version, WATCH_SECONDS):
            if kind == "ERROR":
                raise WatchGone(str((obj or {}).get("message")))
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            seen += 1
            if kind != "BOOKMARK":
                self._events_counted.inc()
                self._apply(kind, obj)
            self.version = version
        if not seen and time.monotonic() - began < 1:  # list again, after the backoff: never a tight loop
            raise ConnectionError("the watch ended at once with nothing")
        return version
