"""What Knative Eventing's ApiServerSource (mode Resource) sends, reproduced over a real watch.

Binary-mode CloudEvents of type dev.knative.apiserver.resource.{add,update,delete}, subject
/apis/v1/namespaces/<ns>/pods/<name>, extensions kind/name/namespace/apiversion, the whole pod
as JSON data (compare ../shared/sample-events/). Like the adapter, it sends nothing for pods that
existed before it started, and redelivers only on connection errors and
404/413/425/429/502/503/504. Faults (duplication, reordering, drops) can be switched on for tests.
"""
from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import urllib3
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("eventsource")
RETRIED_STATUSES = frozenset({404, 413, 425, 429, 502, 503, 504})
TYPES = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}


def cloudevent_headers(kind: str, pod: dict[str, Any], source: str) -> dict[str, str]:
    """The HTTP headers of one binary-mode event, as the receive adapter writes them."""
    meta = pod["metadata"]
    return {
        "Ce-Apiversion": pod.get("apiVersion", "v1"),
        "Ce-Id": str(uuid.uuid4()),
        "Ce-Kind": pod.get("kind", "Pod"),
        "Ce-Name": meta["name"],
        "Ce-Namespace": meta["namespace"],
        "Ce-Source": source,
        "Ce-Specversion": "1.0",
        "Ce-Subject": f"/apis/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        "Ce-Time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "Ce-Type": f"dev.knative.apiserver.resource.{kind}",
        "Content-Type": "application/json",
    }


def ping_headers(source: str = "/apis/v1/namespaces/gpu-scheduler/pingsources/resync") -> dict[str, str]:
    """A PingSource event (binary mode), as used for the periodic resync."""
    return {
        "Ce-Id": str(uuid.uuid4()), "Ce-Source": source, "Ce-Specversion": "1.0",
        "Ce-Type": "dev.knative.sources.ping",
        "Ce-Time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "Content-Type": "application/json",
    }


class Sender:
    """Delivers events to a sink, with Knative's rule for what is redelivered."""

    def __init__(self, sink: str, retries: int = 10, backoff: float = 0.2, max_backoff: float = 2.0):
        self.sink = sink
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.http = urllib3.PoolManager(maxsize=16, retries=False, timeout=urllib3.Timeout(connect=2, read=30))
        self.statuses: list[int] = []  # every answer seen (0 = connection error), for tests
        self.results: list[tuple[str, int, str]] = []  # (pod name, status, bind's "result")
        self._lock = threading.Lock()

    def send(self, headers: dict[str, str], body: bytes) -> int:
        delay = self.backoff
        for attempt in range(self.retries + 1):
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
            if status != 0 and status not in RETRIED_STATUSES:
                return status
            if attempt < self.retries:
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
        log.warning("dropped event %s after %d attempts (last status %s)", headers.get("Ce-Id"),
                    self.retries + 1, status)
        return status


class ApiServerSource:
    """Watches pods matching `label_selector` in all namespaces and sends each change to `sink`."""

    def __init__(self, api, sink: str, source: str, label_selector: str, senders: int = 4,
                 duplicate: int = 1, drop_rate: float = 0.0, shuffle: bool = False, seed: int = 0):
        self.api = api
        self.sender = Sender(sink)
        self.source = source
        self.label_selector = label_selector
        self.duplicate = duplicate
        self.drop_rate = drop_rate
        self.shuffle = shuffle
        self.random = random.Random(seed)
        self.sent: list[tuple[str, str]] = []  # (type, pod name) actually handed to the sink
        self.dropped: list[str] = []
        self.paused = False  # while paused, changes are lost, as when no adapter is running
        self._flowing = threading.Event()  # cleared by hold(): events queue up unsent
        self._flowing.set()
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, name="apiserversource-watch", daemon=True)]
        self._threads += [threading.Thread(target=self._send_forever, name=f"apiserversource-send-{i}", daemon=True)
                          for i in range(senders)]
        self._started = threading.Event()

    def start(self) -> "ApiServerSource":
        for thread in self._threads:
            thread.start()
        if not self._started.wait(30):
            raise TimeoutError("the event source did not start watching within 30s")
        return self

    def stop(self) -> None:
        self._stop.set()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=5)

    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def hold(self) -> None:
        """Queue events without sending them (a slow or partitioned adapter)."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def _watch(self) -> None:
        # Start from "now": like the adapter, nothing is sent for pods that already exist.
        version = self._current_version()
        self._started.set()
        while not self._stop.is_set():
            try:
                response = self.api.list_pod_for_all_namespaces(
                    label_selector=self.label_selector, watch=True, resource_version=version,
                    allow_watch_bookmarks=True, timeout_seconds=5, _preload_content=False,
                    _request_timeout=(3, 15))
                for raw in iter_resp_lines(response):
                    event = json.loads(raw)
                    obj = event.get("object", {})
                    if event.get("type") == "ERROR":  # 410 Gone: the adapter's informer re-lists
                        version = self._current_version()
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") in TYPES:
                        self._enqueue(TYPES[event["type"]], obj)
                    if self._stop.is_set():
                        break
            except Exception as error:  # API restarts are expected in fault tests: re-watch
                if not self._stop.is_set():
                    log.info("watch interrupted (%s); re-watching from %s", error, version)
                    time.sleep(0.5)

    def _current_version(self) -> str:
        listing = self.api.list_pod_for_all_namespaces(label_selector=self.label_selector, limit=1,
                                                       _preload_content=False, _request_timeout=(3, 10))
        return json.loads(listing.data)["metadata"]["resourceVersion"]

    def _enqueue(self, kind: str, pod: dict[str, Any]) -> None:
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        copies = [(kind, pod)] * self.duplicate
        for item in copies:
            if self.paused or self.drop_rate and self.random.random() < self.drop_rate:
                self.dropped.append(pod["metadata"]["name"])
                continue
            self._queue.put(item)
        if self.shuffle:
            with self._queue.mutex:
                items = list(self._queue.queue)
                self.random.shuffle(items)
                self._queue.queue.clear()
                self._queue.queue.extend(items)

    def _send_forever(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                kind, pod = item
                self._flowing.wait()
                self.sender.send(cloudevent_headers(kind, pod, self.source), json.dumps(pod).encode())
                self.sent.append((kind, pod["metadata"]["name"]))
            finally:
                self._queue.task_done()
