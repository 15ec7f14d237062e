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
from gpu_scheduler.fit import PodInfo, bind_problem
from kubeapi.client import Kube, load_configuration
from recorder import Recorder
from watches import NodePods, PendingPods

log = logging.getLogger("bind")
SUCCESS = (BOUND, ALREADY_BOUND)
OUTCOMES = prom.Counter("gpu_scheduler_bind_outcomes_total", "Placement outcomes by result", ["result"])
POD_READS = prom.Counter("gpu_scheduler_bind_pod_reads_total",
                        "Where an event's pod was read: the pending-pod watch, or a GET", ["source"])
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
            self.pending = PendingPods(api)
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
        any other is placed as the API server has it: from the pending-pod watch when it holds
        the pod at the event's version (watches.PendingPods), else read now (the watch cache;
        etcd if the cache does not have it yet). Its map, UID, scheduler name and node are the
        API server's, and the Binding's preconditions are that UID and version."""
        decision = bind_decision(event_pod)
        if isinstance(decision, Ignore):
            return self._ignored(decision.why)
        ref = PodRef.of(event_pod)
        if self.api is None:
            return self._report(ref, RETRY, f"no Kubernetes API configuration: {self.problem}")
        watched = self.pending.get(ref.uid, str((event_pod.get("metadata") or {}).get("resourceVersion") or ""))
        if watched is not None:
            POD_READS.labels("watch").inc()
            return self.place(watched)
        POD_READS.labels("get").inc()
        try:
            try:
                live = self.api.read_pod(ref.namespace, ref.name, cached=True)
            except ApiException as error:
                if error.status != 404:
                    raise
                live = self.api.read_pod(ref.namespace, ref.name)  # created after the cache's view
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            return self._unreadable(ref, error)
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
            pod = self.api.read_pod(ref.namespace, ref.name)
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            return self._unreadable(ref, error)
        return self.place(pod, again=False)

    def _unreadable(self, ref: PodRef, error: Exception) -> dict[str, Any]:
        """The outcome when the pod could not be read: gone (404), or as the API failed."""
        if isinstance(error, ApiException):
            if error.status == 404:
                return self._report(ref, GONE, "the pod does not exist")
            return self._report(ref, failure_outcome(error.status or 0), f"reading the pod: {_api_message(error)}")
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
