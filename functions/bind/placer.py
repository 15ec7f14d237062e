"""The Kubernetes side of bind: one API client, reused; calls out, outcomes back."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

import prometheus_client as prom
import urllib3
from kubernetes.client.exceptions import ApiException

from gpu_scheduler.binding import (
    ALREADY_BOUND, API_ERROR, BOUND, GONE, PENDING_SELECTOR, REPLACED, RETRY, Bind, Ignore, Unplaceable, bind_decision,
    binding_for, conflict_outcome, failure_outcome,
)
from gpu_scheduler.events import (
    FAILED_SCHEDULING, NORMAL, SCHEDULED, SCHEDULER_ERROR, UNSCHEDULABLE, WARNING, PodRef, scheduled_message,
)
from gpu_scheduler.fit import NodeInfo, PodInfo, bind_problem, is_terminal
from kubeapi.client import Kube, load_configuration
from recorder import Recorder

log = logging.getLogger("bind")
SUCCESS = (BOUND, ALREADY_BOUND)
OUTCOMES = prom.Counter("gpu_scheduler_bind_outcomes_total", "Placement outcomes by result", ["result"])
LATENCY = prom.Histogram("gpu_scheduler_bind_seconds", "Time to place one pod, API calls included",
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


CHANGED = "the pod changed since the version it was placed from"


class Unreachable(Exception):
    """The API server did not answer, or answered with a transient error."""


def _api_message(error: ApiException) -> str:
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


class NodeCache:
    """Nodes read with `get`, kept `ttl` seconds: a burst of pods for one node costs one read."""

    def __init__(self, api, ttl: float = 2.0):
        self.api, self.ttl = api, ttl
        self._nodes: dict[str, tuple[float, dict | None]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> dict | None:
        with self._lock:
            cached = self._nodes.get(name)
        if cached and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        try:
            node = self.api.read_node(name)
        except ApiException as error:
            if error.status != 404:
                raise
            node = None
        with self._lock:
            self._nodes[name] = (time.monotonic(), node)
        return node


class NodePods:
    """What the pods on each node occupy (fit.NodeInfo), plus the pods this instance is binding or
    has bound and not yet seen listed: kube-scheduler's "assumed" pods, so two placements of this
    instance never count the same free cpu or GPU twice.

    A node is listed once (`fieldSelector=spec.nodeName`, from the API server's watch cache) and
    then watched from that listing's resourceVersion, as kube-scheduler's informers do: a pod bound
    there by anyone, finished or deleted, shows within milliseconds, and a placement costs no
    listing. Listing every second instead cost a LIST of all the node's pods, maps included, per
    node per second (bench/README.md). Where a watch cannot run (it fails, or the API server
    ends it with 410 Gone), the node is listed again, at most every `ttl` seconds, until a watch
    runs again. A node nobody placed on for WATCH_IDLE_SECONDS stops being watched.

    `reserve` is check-and-assume in one step under one lock: the check is pure and takes well
    under a millisecond; listing and watching happen outside the lock."""

    WATCH_SECONDS = 300  # one watch request; the next continues from its last resourceVersion
    WATCH_IDLE_SECONDS = 600
    WATCH_RETRY_SECONDS = 30  # after a watch failed: listings only, for this long

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
        extra = [info for uid, (_, info) in self._assumed.get(node, {}).items() if uid not in listed.uids]
        self._view[node] = NodeInfo.of(listed.pods + tuple(extra)) if extra else listed

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
                if version and time.monotonic() - self._watch_failed_at > self.WATCH_RETRY_SECONDS:
                    self._watched[node] = version
                    threading.Thread(target=self._watch, args=(node,), name=f"watch-{node}"[:64], daemon=True).start()
        return True

    def _watch(self, node: str) -> None:
        """Keep the node's pods current from its watch until it ends for good: idle, 410 Gone
        (the next placement lists afresh), or a failure (listings for WATCH_RETRY_SECONDS)."""
        try:
            while True:
                with self._lock:
                    if time.monotonic() - self._used_at.get(node, 0.0) > self.WATCH_IDLE_SECONDS:
                        return
                    version = self._watched[node]
                began, seen = time.monotonic(), 0
                for kind, obj in self.api.watch_pods(f"spec.nodeName={node}", version, self.WATCH_SECONDS):
                    if kind == "ERROR":  # 410 Gone, mostly: this version is no longer in the cache
                        log.info("node watch ended", extra={"node": node, "detail": str(obj.get("message"))[:200]})
                        return
                    self._apply(node, kind, obj)
                    seen += 1
                if not seen and time.monotonic() - began < 1:  # ended at once: no tight loop, list instead
                    return
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
        with self._lock:
            if node not in self._watched:
                return
            self._watched[node] = meta.get("resourceVersion") or self._watched[node]
            if kind == "BOOKMARK":
                return
            pods = self._pods.setdefault(node, {})
            if info is None:
                if pods.pop(uid, None) is None and uid not in self._assumed.get(node, {}):
                    return
            else:
                pods[uid] = info
            self._assumed.get(node, {}).pop(uid, None)  # the watch has shown it: no longer assumed
            self._listed[node] = NodeInfo.of(pods.values())
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


# After an outage bind resyncs by itself: the adapter drops an event after six deliveries in
# 3.1 s, so the pods whose events came while the API server was down would otherwise wait for
# the next PingSource tick, up to a minute.
RECOVERY_FIRST_PROBE = 0.25
RECOVERY_MAX_PROBE = 4.0


class Placer:
    def __init__(self, api: Kube | None, problem: str = "", workers: int = 8):
        self.api = api
        self.problem = problem
        self.workers = workers
        self._recovering = threading.Lock()  # held while a recovery thread runs: one at a time
        self._resyncing = threading.Lock()  # one resync at a time; pings meanwhile coalesce
        self._resync_wanted = threading.Event()
        if api is not None:
            self.nodes = NodeCache(api)
            self.node_pods = NodePods(api)
            self.recorder = Recorder(api, os.environ.get("HOSTNAME") or socket.gethostname())

    @classmethod
    def from_environment(cls) -> "Placer":
        """In a cluster, the pod's ServiceAccount; elsewhere KUBECONFIG (or ~/.kube/config)."""
        try:
            configuration = load_configuration()
        except Exception as error:  # any unusable configuration: stay up, report not ready
            log.error("no Kubernetes API configuration", extra={"detail": str(error)})
            return cls(None, str(error))
        return cls(Kube(configuration), workers=int(os.environ.get("RESYNC_CONCURRENCY", "8")))

    def ready(self) -> bool:
        return self.api is not None

    # -- one pod ---------------------------------------------------------------------------
    def place_event(self, event_pod: Mapping[str, Any]) -> dict[str, Any]:
        """An add/update event is a trigger, not the truth: anyone who reaches bind can send one.
        A pod the event shows as not ours to place is ignored as it is (ignoring does nothing);
        any other is read as the API server has it now (its watch cache; etcd if the cache does
        not have it yet), and placed from that: its map, UID, scheduler name and node."""
        decision = bind_decision(event_pod)
        if isinstance(decision, Ignore):
            return self._ignored(decision.why)
        ref = PodRef.of(event_pod)
        if self.api is None:
            return self._report(ref, RETRY, f"no Kubernetes API configuration: {self.problem}")
        try:
            try:
                live = self.api.read_pod(ref.namespace, ref.name, cached=True)
            except ApiException as error:
                if error.status != 404:
                    raise
                live = self.api.read_pod(ref.namespace, ref.name)  # created after the cache's view
        except ApiException as error:
            if error.status == 404:
                return self._report(ref, GONE, "the pod does not exist")
            return self._report(ref, failure_outcome(error.status or 0), f"reading the pod: {_api_message(error)}")
        except urllib3.exceptions.HTTPError as error:
            return self._report(ref, RETRY, f"Kubernetes API unreachable: {error}")
        if (live.get("metadata") or {}).get("uid") != ref.uid:
            return self._report(ref, REPLACED, "the event's pod was deleted; a pod of the same name has another UID")
        if (live.get("spec") or {}).get("nodeName"):  # a duplicate, or another instance was first
            return self._report(ref, ALREADY_BOUND, "", live["spec"]["nodeName"])
        return self.place(live)

    def place(self, pod: Mapping[str, Any], again: bool = True) -> dict[str, Any]:
        """Place a pod as the API server has it (an event's pod goes through place_event). When
        the pod changed between that version and the Binding (its precondition), it is read and
        placed `again`, once."""
        decision = bind_decision(pod)
        if isinstance(decision, Ignore):
            return self._ignored(decision.why)
        ref = PodRef.of(pod)
        if self.api is None:
            return self._report(ref, RETRY, f"no Kubernetes API configuration: {self.problem}")
        if isinstance(decision, Unplaceable):
            self._unschedulable(ref, decision.message)
            return self._report(ref, decision.reason, decision.message)
        started = time.perf_counter()
        assumed = dataclasses.replace(PodInfo.of(pod), devices=decision.devices)
        try:
            node = self.nodes.get(decision.node)
            problem = (bind_problem(pod, None, decision.placement) if node is None else
                       self.node_pods.reserve(decision.node,
                                              lambda info: bind_problem(pod, node, decision.placement, info), assumed))
        except ApiException as error:
            outcome = failure_outcome(error.status or 0)
            return self._failed(ref, decision, outcome, f"reading node {decision.node} or its pods: {_api_message(error)}")
        except urllib3.exceptions.HTTPError as error:
            return self._failed(ref, decision, RETRY, f"Kubernetes API unreachable: {error}")
        if problem:
            self._unschedulable(ref, problem)
            return self._report(ref, UNSCHEDULABLE, problem, decision.node)
        outcome, message = self._bind(decision)
        LATENCY.observe(time.perf_counter() - started)
        if outcome == BOUND:
            self.node_pods.bound(decision.node, decision.uid)
        else:
            self.node_pods.forget(decision.node, decision.uid)
        if message == CHANGED and again:
            return self._place_as_it_is_now(ref)
        if outcome == BOUND:
            self.recorder.event(ref, NORMAL, SCHEDULED, scheduled_message(ref, decision.node), "Binding")
            for reason, warning in decision.warnings:
                self.recorder.event(ref, WARNING, reason, warning, "Binding")
        elif outcome in (RETRY, API_ERROR):
            return self._failed(ref, decision, outcome, message)
        return self._report(ref, outcome, message, decision.node, time.perf_counter() - started)

    def _place_as_it_is_now(self, ref: PodRef) -> dict[str, Any]:
        try:
            return self.place(self.api.read_pod(ref.namespace, ref.name), again=False)
        except ApiException as error:
            if error.status == 404:
                return self._report(ref, GONE, "the pod does not exist")
            return self._report(ref, failure_outcome(error.status or 0), f"reading the pod: {_api_message(error)}")
        except urllib3.exceptions.HTTPError as error:
            return self._report(ref, RETRY, f"Kubernetes API unreachable: {error}")

    @staticmethod
    def _ignored(why: str) -> dict[str, Any]:
        OUTCOMES.labels("Ignored").inc()
        log.debug("ignored", extra={"decision": "Ignored", "why": why})
        return {"result": "ignored", "why": why}

    def _unschedulable(self, ref: PodRef, message: str) -> None:
        self.recorder.event(ref, WARNING, FAILED_SCHEDULING, message)
        self.recorder.unschedulable(ref, UNSCHEDULABLE, message)

    def _failed(self, ref: PodRef, bind: Bind, outcome: str, message: str) -> dict[str, Any]:
        self.recorder.event(ref, WARNING, FAILED_SCHEDULING, f"binding to {bind.node}: {message}")
        if outcome == API_ERROR:  # the API answered, and will answer the same: say so on the pod
            self.recorder.unschedulable(ref, SCHEDULER_ERROR, message)
        return self._report(ref, outcome, message, bind.node)

    def _report(self, ref: PodRef, outcome: str, message: str, node: str = "", elapsed: float | None = None):
        OUTCOMES.labels(outcome).inc()
        fields = {"pod": str(ref), "uid": ref.uid, "node": node, "decision": outcome, "detail": message}
        if elapsed is not None:
            fields["latency_ms"] = round(elapsed * 1000, 1)
        log.log(logging.INFO if outcome in SUCCESS else logging.WARNING, "placement", extra=fields)
        result = {"result": outcome, "pod": str(ref)}
        if node:
            result["node"] = node
        if message:
            result["message"] = message
        if outcome == RETRY:
            result["retry"] = True
            self._recover_after_outage()
        return result

    def _bind(self, bind: Bind) -> tuple[str, str]:
        try:
            self.api.bind(bind.namespace, bind.name, binding_for(bind))
            return BOUND, ""
        except ApiException as error:
            if error.status == 409:
                return self._after_conflict(bind)
            return failure_outcome(error.status or 0), _api_message(error)
        except urllib3.exceptions.HTTPError as error:
            return RETRY, f"Kubernetes API unreachable: {error}"

    def _after_conflict(self, bind: Bind) -> tuple[str, str]:
        try:
            pod = self.api.read_pod(bind.namespace, bind.name)
        except ApiException as error:
            if error.status != 404:
                return failure_outcome(error.status or 0), _api_message(error)
            pod = None
        except urllib3.exceptions.HTTPError as error:
            return RETRY, f"Kubernetes API unreachable: {error}"
        outcome = conflict_outcome(bind, pod)
        if outcome == RETRY:  # still pending, but not the version decided from
            return RETRY, CHANGED
        return outcome, ""

    # -- all pending pods ------------------------------------------------------------------
    def resync(self, wait: bool = False) -> dict[str, Any]:
        """Place every pending pod of ours: what the event source missed or could not deliver,
        and pods whose node became usable since. One at a time: a ping that comes while a resync
        runs (a burst of pings, forged or not) asks for one more run after it and returns.
        `wait`: run once more for certain, after the running one (recovery needs the outcome)."""
        if self.api is None:
            return {"result": RETRY, "retry": True, "message": self.problem}
        self._resync_wanted.set()
        if not self._resyncing.acquire(blocking=wait):
            return {"result": "coalesced", "why": "a resync is running; one more follows it"}
        try:
            outcome: dict[str, Any] = {}
            if wait:
                self._resync_wanted.set()
            while self._resync_wanted.is_set():
                self._resync_wanted.clear()
                outcome = self._resync_once()
            return outcome
        finally:
            self._resyncing.release()

    def _resync_once(self) -> dict[str, Any]:
        self.node_pods.invalidate()
        try:
            pods = self.api.list_pods(PENDING_SELECTOR)
        except ApiException as error:
            outcome = failure_outcome(error.status or 0)
            if outcome == RETRY:
                self._recover_after_outage()
            return {"result": outcome, "retry": outcome == RETRY, "message": _api_message(error)}
        except urllib3.exceptions.HTTPError as error:
            self._recover_after_outage()
            return {"result": RETRY, "retry": True, "message": f"Kubernetes API unreachable: {error}"}
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            outcomes = list(pool.map(self.place, pods))
        counts: dict[str, int] = {}
        for outcome in outcomes:
            counts[outcome["result"]] = counts.get(outcome["result"], 0) + 1
        bound = [outcome["pod"] for outcome in outcomes if outcome["result"] == BOUND]
        log.info("resync", extra={"pending": len(pods), "outcomes": counts})
        return {"result": "resynced", "pending": len(pods), "outcomes": counts, "bound": bound}

    # -- after an outage -------------------------------------------------------------------
    def _recover_after_outage(self) -> None:
        """bind saw the API server fail: once it answers again, resync without waiting for a ping.
        Started on demand (functions-framework forks after import: threads made then would die)."""
        if self.api is None or not self._recovering.acquire(blocking=False):
            return
        threading.Thread(target=self._recover, name="recover-after-outage", daemon=True).start()

    def _recover(self) -> None:
        try:
            delay = RECOVERY_FIRST_PROBE
            while True:
                time.sleep(delay)
                outcome = self.resync(wait=True)  # its own failures start no other recovery: the lock is held
                if not outcome.get("retry") and not outcome.get("outcomes", {}).get(RETRY):
                    log.info("recovered", extra={"decision": "Recovered", "pending": outcome.get("pending"),
                                                 "outcomes": outcome.get("outcomes")})
                    return
                delay = min(delay * 2, RECOVERY_MAX_PROBE)
        except Exception:  # a bug: say so and stop; the next failure or ping starts afresh
            log.exception("recovery after an outage failed")
        finally:
            self._recovering.release()
