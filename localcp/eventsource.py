"""What Knative Eventing's ApiServerSource receive adapter sends, reproduced over a real watch.

The adapter itself cannot be built here, so this stands in for it, held to captures of the real
one (knative-v1.21.4 watching kube-apiserver 1.34.0, tests/fixtures/sample-events/k8s-1.34/) and to
the delivery policy measured there (its README):
- configured like the adapter: from the ApiServerSource in knative/sources.yaml, turned into the
  adapter's K_SOURCE_CONFIG (`source_config`) the way Knative's reconciler does it; a source it
  cannot honour (mode Reference, an owner filter, a resource other than v1 pods) is an error at
  start-up;
- binary-mode CloudEvents dev.knative.apiserver.resource.{add,update,delete} with the adapter's
  headers (Kn-Namespace is the source's namespace) and the whole object as data;
- nothing for objects that existed before it started;
- serial: it sends from the watch handler, so while one event is retried the next ones wait;
- for 404, 413, 429, 502, 503 and 504 (and connection errors), six deliveries at 0, 0.1, 0.3,
  0.7, 1.5 and 3.1 s, then the event is dropped and logged; any other status, one delivery.
Fault switches (drops, duplicates, reordering, holding) exist for the tests that need them.
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
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("eventsource")
SOURCES_MANIFEST = Path(__file__).resolve().parent.parent / "knative" / "sources.yaml"
RETRIED_STATUSES = frozenset({404, 413, 429, 502, 503, 504})
RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)  # after each failed attempt: sent at 0, 0.1, 0.3, 0.7, 1.5, 3.1 s
TYPES = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}
USER_AGENT = "Go-http-client/1.1"  # the adapter's Go HTTP client, as the captures show


class SourceConfigError(ValueError):
    """An ApiServerSource this stand-in cannot run as the adapter would."""


def label_selector_string(selector: dict[str, Any] | None) -> str:
    """metav1.LabelSelectorAsSelector(selector).String(): requirements sorted by key."""
    if not selector:
        return ""
    requirements: list[tuple[str, str]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        requirements.append((key, f"{key}={value}"))
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = ",".join(sorted(expression.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                "Exists": key, "DoesNotExist": f"!{key}"}.get(operator)
        if text is None:
            raise SourceConfigError(f"selector: unknown operator {operator!r} for {key!r}")
        requirements.append((key, text))
    return ",".join(text for _, text in sorted(requirements))


def _resource(kind: str) -> str:
    """meta.UnsafeGuessKindToResource, for the kinds a source may name."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


def source_config(source: dict[str, Any], namespaces: list[str]) -> dict[str, Any]:
    """The adapter's K_SOURCE_CONFIG for an ApiServerSource, as Knative's reconciler makes it.
    `namespaces`: the names the namespaceSelector matches now (the reconciler lists them)."""
    spec = source.get("spec") or {}
    selector = spec.get("namespaceSelector")
    config: dict[str, Any] = {
        "namespaces": sorted(namespaces) if selector is not None else [source["metadata"]["namespace"]],
        # An empty selector means every namespace, watched by one cluster-wide watch.
        "allNamespaces": selector is not None and not selector.get("matchLabels") and not selector.get("matchExpressions"),
        "resources": [],
        "mode": spec.get("mode", ""),
    }
    for resource in spec.get("resources") or []:
        group, _, version = resource["apiVersion"].rpartition("/")
        watch: dict[str, Any] = {"gvr": {"Group": group, "Version": version, "Resource": _resource(resource["kind"])}}
        if resource.get("selector") is not None:
            watch["selector"] = label_selector_string(resource["selector"])
        config["resources"].append(watch)
    if spec.get("owner"):
        config["owner"] = spec["owner"]
    return config


def apiserversource_manifest(path: Path = SOURCES_MANIFEST) -> dict[str, Any]:
    """The ApiServerSource document of knative/sources.yaml."""
    for document in yaml.safe_load_all(path.read_text()):
        if document and document.get("kind") == "ApiServerSource":
            return document
    raise SourceConfigError(f"{path}: no ApiServerSource")


def pod_watches(config: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(namespace or None for all, label selector) per watch the adapter would open; what this
    stand-in cannot reproduce is refused here, at start-up, rather than silently ignored."""
    if config.get("mode") != "Resource":
        raise SourceConfigError(f"mode {config.get('mode')!r}: bind needs the whole pod (mode Resource)")
    if config.get("owner"):
        raise SourceConfigError("owner filters are not reproduced by the local event source")
    if not config.get("resources"):
        raise SourceConfigError("no resources to watch")
    watches = []
    for resource in config["resources"]:
        gvr = resource["gvr"]
        if (gvr["Group"], gvr["Version"], gvr["Resource"]) != ("", "v1", "pods"):
            raise SourceConfigError(f"resource {gvr}: only v1 pods are reproduced by the local event source")
        namespaces = [None] if config.get("allNamespaces") else config.get("namespaces") or []
        watches += [(namespace, resource.get("selector", "")) for namespace in namespaces]
    return watches


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
    """Delivers events to a sink with the adapter's measured retry policy."""

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


class ApiServerSource:
    """Watches what `config` (a K_SOURCE_CONFIG) names and sends each change to `sink`, one at a time."""

    def __init__(self, api, sink: str, api_server_url: str, config: dict[str, Any],
                 source_namespace: str = "gpu-scheduler", duplicate: int = 1, drop_rate: float = 0.0,
                 shuffle: bool = False, seed: int = 0):
        self.watches = pod_watches(config)
        self.api = api
        self.sender = Sender(sink)
        self.source = api_server_url
        self.source_namespace = source_namespace
        self.duplicate = duplicate
        self.drop_rate = drop_rate
        self.shuffle = shuffle
        self.random = random.Random(seed)
        self.sent: list[tuple[str, str]] = []  # (type, pod name) handed to the sink
        self.dropped: list[str] = []  # pods whose events a fault switch dropped
        self.paused = False  # while paused, changes are lost, as when no adapter is running
        self._flowing = threading.Event()  # cleared by hold(): events queue up unsent
        self._flowing.set()
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = threading.Semaphore(0)

    @classmethod
    def from_manifest(cls, api, sink: str, api_server_url: str, namespaces: list[str],
                      manifest: dict[str, Any] | None = None, **faults) -> "ApiServerSource":
        """The source knative/sources.yaml describes (or `manifest`), as its adapter would run it."""
        manifest = manifest or apiserversource_manifest()
        return cls(api, sink, api_server_url, source_config(manifest, namespaces),
                   manifest["metadata"]["namespace"], **faults)

    def start(self) -> "ApiServerSource":
        self._threads = [threading.Thread(target=self._watch, args=watch, name=f"apiserversource-watch-{i}", daemon=True)
                         for i, watch in enumerate(self.watches)]
        self._threads.append(threading.Thread(target=self._send_forever, name="apiserversource-send", daemon=True))
        for thread in self._threads:
            thread.start()
        for _ in self.watches:
            if not self._started.acquire(timeout=30):
                raise TimeoutError("the event source did not start watching within 30s")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._flowing.set()
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

    def _list(self, namespace: str | None, selector: str, **options):
        if namespace is None:
            return self.api.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False, **options)
        return self.api.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False, **options)

    def _current_version(self, namespace: str | None, selector: str) -> str:
        listing = self._list(namespace, selector, limit=1, _request_timeout=(3, 10))
        return json.loads(listing.data)["metadata"]["resourceVersion"]

    def _watch(self, namespace: str | None, selector: str) -> None:
        # Start from "now": like the adapter, nothing is sent for objects that already exist.
        version = self._current_version(namespace, selector)
        self._started.release()
        while not self._stop.is_set():
            try:
                response = self._list(namespace, selector, watch=True, resource_version=version,
                                      allow_watch_bookmarks=True, timeout_seconds=5, _request_timeout=(3, 15))
                for raw in iter_resp_lines(response):
                    event = json.loads(raw)
                    obj = event.get("object", {})
                    if event.get("type") == "ERROR":  # 410 Gone: the adapter's informer re-lists
                        version = self._current_version(namespace, selector)
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

    def _enqueue(self, kind: str, obj: dict[str, Any]) -> None:
        for _ in range(self.duplicate):
            if self.paused or self.drop_rate and self.random.random() < self.drop_rate:
                self.dropped.append(obj["metadata"]["name"])
                continue
            self._queue.put((kind, obj))
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
                kind, obj = item
                self._flowing.wait()
                if self._stop.is_set():
                    return
                headers = cloudevent_headers(kind, obj, self.source, self.source_namespace)
                self.sender.send(headers, json.dumps(obj).encode())
                self.sent.append((kind, obj["metadata"]["name"]))
            finally:
                self._queue.task_done()
