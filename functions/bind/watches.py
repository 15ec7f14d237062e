"""bind's views of pods, kept current by watches from the API server's watch cache, as
kube-scheduler's informers keep its own: the pods on each node bind places on (NodePods: fit and
GPU accounting) and our pods waiting for a node (PendingPods: the live state an event's pod is
placed from). The I/O side of bind, like placer.py; the decisions stay in gpu_scheduler/."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

import prometheus_client as prom

from gpu_scheduler.binding import PENDING_SELECTOR
from gpu_scheduler.fit import NodeInfo, PodInfo, is_terminal

log = logging.getLogger("bind")
WATCH_SECONDS = 300  # one watch request; the next continues from its last resourceVersion
WATCH_IDLE_SECONDS = 600  # a view nobody asked for this long stops being watched
WATCH_RETRY_SECONDS = 30  # after a watch failed: no new watch for this long
MAX_WATCHED_NODES = 64
WATCH_EVENTS = prom.Counter("gpu_scheduler_bind_watch_events_total", "Pod changes taken from watches", ["view"])


class WatchGone(Exception):
    """The API server ended a watch with an ERROR event (410 Gone, mostly: the version is no
    longer in its cache): list again and watch from there."""


def follow(api, selector: str, version: str, seconds: int, apply: Callable[[str, Mapping[str, Any], int], None],
           wanted: Callable[[], bool]) -> None:
    """Pass each change of the pods `selector` matches, after `version`, to apply(type, object,
    size), one watch request after another, each continuing from the last version seen, while
    wanted(). Raises WatchGone, ApiException or urllib3's errors; returns when no longer wanted,
    or when a watch request ends at once with nothing (never a tight loop: the caller lists)."""
    while wanted():
        began, seen = time.monotonic(), 0
        for kind, obj, size in api.watch_pods(selector, version, seconds):
            if kind == "ERROR":
                raise WatchGone(str((obj or {}).get("message"))[:200])
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            apply(kind, obj, size)
            seen += 1
        if not seen and time.monotonic() - began < 1:
            return


class NodePods:
    """What the pods on each node occupy (fit.NodeInfo), plus the pods this instance is binding or
    has bound and not yet seen listed: kube-scheduler's "assumed" pods, so two placements of this
    instance never count the same free cpu or GPU twice.

    A node is listed once (`fieldSelector=spec.nodeName`, from the API server's watch cache) and
    then watched from that listing's resourceVersion, as kube-scheduler's informers do: a pod bound
    there by anyone, finished or deleted, shows within milliseconds, and a placement costs no
    listing. Listing every second instead cost a LIST of all the node's pods, maps included, per
    node per second (README, "Performance"). Where a watch cannot run (it fails, or the API
    server ends it with 410 Gone), the node is listed again, at most every `ttl` seconds, until a
    watch runs again. A node nobody placed on for WATCH_IDLE_SECONDS stops being watched. Each
    watch is a thread and a connection: at most MAX_WATCHED_NODES at once, other nodes listed.

    `reserve` is check-and-assume in one step under one lock: the check is pure and takes well
    under a millisecond; listing and watching happen outside the lock."""

    def __init__(self, api, ttl: float = 1.0):
        self.api, self.ttl = api, ttl
        self._listed_at: dict[str, float] = {}  # node -> when its last listing started
        self._pods: dict[str, dict[str, PodInfo]] = {}  # node -> uid -> pod, as listed and watched
        self._listed: dict[str, NodeInfo] = {}  # node -> those pods as a NodeInfo
        self._assumed: dict[str, dict[str, tuple[float, PodInfo]]] = {}  # node -> uid -> (bound at, info)
        self._view: dict[str, NodeInfo] = {}  # node -> listed plus assumed: what checks see
        self._watched: dict[str, str] = {}  # node -> the resourceVersion its running watch is at
        self._used_at: dict[str, float] = {}  # node -> its last reserve
        self._watch_failed_at = float("-inf")
        self._lock = threading.Lock()

    def _rebuild(self, node: str) -> None:
        listed = self._listed.get(node, NodeInfo())
        view = listed
        for uid, (_, info) in self._assumed.get(node, {}).items():
            if uid not in listed.uids:
                view = view.plus(info)
        self._view[node] = view

    def _refresh(self, node: str, fresh: bool = False) -> bool:
        """List the node's pods unless a watch keeps them current or the last listing is
        recent; True when it listed now."""
        with self._lock:
            self._used_at[node] = time.monotonic()
            if node in self._watched:
                return False
            at = self._listed_at.get(node)
        if at is not None and not fresh and time.monotonic() - at < self.ttl:
            return False
        started = time.monotonic()
        items, version = self.api.list_pods_and_version(f"spec.nodeName={node}")
        pods = {info.uid: info for info in NodeInfo.of(items).pods}
        with self._lock:
            if self._listed_at.get(node, float("-inf")) < started and node not in self._watched:
                self._listed_at[node], self._pods[node] = started, pods
                self._listed[node] = NodeInfo.of(pods.values())
                # A listing that started after a bind completed shows that pod (or its deletion).
                assumed = self._assumed.get(node, {})
                for uid in [uid for uid, (at, _) in assumed.items() if at < started]:
                    del assumed[uid]
                self._rebuild(node)
                if version and len(self._watched) < MAX_WATCHED_NODES \
                        and time.monotonic() - self._watch_failed_at > WATCH_RETRY_SECONDS:
                    self._watched[node] = version
                    threading.Thread(target=self._watch, args=(node,), name=f"watch-{node}"[:64], daemon=True).start()
        return True

    def _watch(self, node: str) -> None:
        """Keep the node's pods current from its watch until it ends for good: idle, 410 Gone
        (the next placement lists afresh), or a failure (listings for WATCH_RETRY_SECONDS)."""
        try:
            with self._lock:
                version = self._watched[node]
            follow(self.api, f"spec.nodeName={node}", version, WATCH_SECONDS,
                   lambda kind, obj, size: self._apply(node, kind, obj),
                   lambda: time.monotonic() - self._used_at.get(node, 0.0) <= WATCH_IDLE_SECONDS)
        except WatchGone as gone:  # the next placement lists afresh and watches from there
            log.info("node watch ended", extra={"node": node, "detail": str(gone)})
        except Exception as error:  # an outage, a 403 from older RBAC: list instead, watch again later
            log.info("node watch failed; listing instead", extra={"node": node, "detail": str(error)[:200]})
            self._watch_failed_at = time.monotonic()
        finally:
            with self._lock:
                self._watched.pop(node, None)
                # What it showed was current until now; from here on, listings at most every ttl.
                self._listed_at[node] = time.monotonic()

    def _apply(self, node: str, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid") or ""
        info = None if kind in ("DELETED", "BOOKMARK") or is_terminal(obj) else PodInfo.of(obj)
        if kind != "BOOKMARK":
            WATCH_EVENTS.labels("node").inc()
        with self._lock:
            if node not in self._watched:
                return
            self._watched[node] = meta.get("resourceVersion") or self._watched[node]
            if kind == "BOOKMARK":
                return
            # Sums kept up to date by the change alone where that is exact: a pod added is one
            # more; a status update leaves what a pod occupies as it was.
            pods = self._pods.setdefault(node, {})
            before = pods.get(uid)
            listed = None
            if info is None:
                if before is not None:
                    del pods[uid]
                    listed = NodeInfo.of(pods.values())
            elif before is None:
                pods[uid] = info
                listed = self._listed.get(node, NodeInfo()).plus(info)
            elif before != info:
                pods[uid] = info
                listed = NodeInfo.of(pods.values())
            shown = self._assumed.get(node, {}).pop(uid, None) is not None  # no longer assumed
            if listed is not None:
                self._listed[node] = listed
            if listed is not None or shown:
                self._rebuild(node)

    def reserve(self, node: str, check, assumed: PodInfo) -> str | None:
        """Run `check(NodeInfo) -> problem | None` on the node as listed plus the pods assumed on
        it; when it passes, assume `assumed` there until the watch or a later listing shows it.
        A refusal from a cached listing (no watch running) is confirmed with a fresh one: a pod
        deleted within the cache's second must not keep a replica Pending until the next resync."""
        fresh = self._refresh(node)
        problem = self._check_and_assume(node, check, assumed)
        if problem is not None and not fresh and self._refresh(node, fresh=True):
            problem = self._check_and_assume(node, check, assumed)
        return problem

    def _check_and_assume(self, node: str, check, assumed: PodInfo) -> str | None:
        with self._lock:
            view = self._view.get(node, NodeInfo())
            problem = check(view)
            if problem is None and assumed.uid not in view.uids:
                self._assumed.setdefault(node, {})[assumed.uid] = (float("inf"), assumed)
                self._view[node] = view.plus(assumed)
            return problem

    def bound(self, node: str, uid: str) -> None:
        with self._lock:
            entry = self._assumed.get(node, {}).get(uid)
            if entry:
                self._assumed[node][uid] = (time.monotonic(), entry[1])

    def forget(self, node: str, uid: str) -> None:
        """The Binding failed: the pod does not hold what it was assumed to."""
        with self._lock:
            if self._assumed.get(node, {}).pop(uid, None):
                self._rebuild(node)

    def invalidate(self) -> None:
        """A resync looks again: pods deleted since the last listing free their node at once
        (a watched node is current already)."""
        with self._lock:
            self._listed_at.clear()


class PendingPods:
    """Our pods waiting for a node (`spec.schedulerName=gpu-scheduler,spec.nodeName=`), each as
    the API server has it, from one watch of them all. place_event places
    an event's pod from here when this holds that pod (its UID) at the event's resourceVersion:
    the API server's own copy of that version, so a forged event can only point bind at a real
    pending pod, which is placed as its real map says; the Binding's resourceVersion
    precondition refuses it if the pod changed since. Anything else (not yet seen, another
    version, the watch not running) is read with a GET, as before.

    Bounded: at most MAX_BYTES of pods are kept (past that, events are read with a GET), without
    their managedFields (a third of a pod, never read here). The watch starts with the first
    lookup (functions-framework forks after import), from the version of a one-item listing: the
    pods pending before then are read with GETs as their events come, rather than listed all at
    once (a backlog of hundreds of pods with large maps is tens of MB to decode at a time). It
    stops when nobody looked for WATCH_IDLE_SECONDS."""

    MAX_BYTES = 8 * 1024 * 1024  # of JSON; about twice that in memory

    def __init__(self, api):
        self.api = api
        self._pods: dict[str, tuple[str, Mapping[str, Any], int]] = {}  # uid -> (version, pod, size)
        self._bytes = 0
        self._running = False
        self._failed_at = float("-inf")
        self._used_at = 0.0
        self._lock = threading.Lock()

    def get(self, uid: str, version: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it, when that is the given version; else None."""
        with self._lock:
            self._used_at = time.monotonic()
            if not self._running:
                if time.monotonic() - self._failed_at > WATCH_RETRY_SECONDS:
                    self._running = True
                    threading.Thread(target=self._run, name="watch-pending", daemon=True).start()
                return None
            entry = self._pods.get(uid)
        return entry[1] if entry is not None and version and entry[0] == version else None

    def _run(self) -> None:
        try:
            while True:  # a 410 lists again; anything else ends it
                _, version = self.api.list_pods_and_version(PENDING_SELECTOR, limit=1)
                with self._lock:
                    self._pods.clear()
                    self._bytes = 0
                try:
                    follow(self.api, PENDING_SELECTOR, version, WATCH_SECONDS, self._apply,
                           lambda: time.monotonic() - self._used_at <= WATCH_IDLE_SECONDS)
                    return
                except WatchGone as gone:
                    log.info("pending-pod watch restarts", extra={"detail": str(gone)})
        except Exception as error:  # an outage, a 403 from older RBAC: GETs meanwhile
            log.info("pending-pod watch failed; reading pods with GETs", extra={"detail": str(error)[:200]})
            self._failed_at = time.monotonic()
        finally:
            with self._lock:
                self._running = False
                self._pods.clear()
                self._bytes = 0

    def _apply(self, kind: str, obj: Mapping[str, Any], size: int) -> None:
        if kind == "BOOKMARK":
            return
        WATCH_EVENTS.labels("pending").inc()
        with self._lock:
            if kind == "DELETED":  # deleted, or bound: it left the selector
                self._drop(str((obj.get("metadata") or {}).get("uid") or ""))
            else:
                self._put(obj, size)

    def _put(self, pod: Mapping[str, Any], size: int) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        self._drop(uid)
        if uid and self._bytes + size <= self.MAX_BYTES:
            if isinstance(meta, dict):
                meta.pop("managedFields", None)
            self._pods[uid] = (str(meta.get("resourceVersion") or ""), pod, size)
            self._bytes += size

    def _drop(self, uid: str) -> None:
        entry = self._pods.pop(uid, None)
        if entry is not None:
            self._bytes -= entry[2]

