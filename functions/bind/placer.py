"""The Kubernetes side of bind: one API client, reused; calls out, outcomes back."""
from __future__ import annotations

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
    ALREADY_BOUND, API_ERROR, BOUND, PENDING_SELECTOR, RETRY, Bind, Ignore, Unplaceable, bind_decision,
    binding_for, conflict_outcome, failure_outcome,
)
from gpu_scheduler.events import (
    FAILED_SCHEDULING, NORMAL, SCHEDULED, SCHEDULER_ERROR, UNSCHEDULABLE, WARNING, PodRef, scheduled_message,
)
from gpu_scheduler.nodecheck import node_problem
from kubeapi.client import Kube, load_configuration
from recorder import Recorder

log = logging.getLogger("bind")
SUCCESS = (BOUND, ALREADY_BOUND)
OUTCOMES = prom.Counter("gpu_scheduler_bind_outcomes_total", "Placement outcomes by result", ["result"])
LATENCY = prom.Histogram("gpu_scheduler_bind_seconds", "Time to place one pod, API calls included",
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


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
        if api is not None:
            self.nodes = NodeCache(api)
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
    def place(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        decision = bind_decision(pod)
        if isinstance(decision, Ignore):
            OUTCOMES.labels("Ignored").inc()
            log.debug("ignored", extra={"decision": "Ignored", "why": decision.why})
            return {"result": "ignored", "why": decision.why}
        ref = PodRef.of(pod)
        if self.api is None:
            return self._report(ref, RETRY, f"no Kubernetes API configuration: {self.problem}")
        if isinstance(decision, Unplaceable):
            self._unschedulable(ref, decision.message)
            return self._report(ref, decision.reason, decision.message)
        started = time.perf_counter()
        try:
            problem = node_problem(pod, self.nodes.get(decision.node), decision.placement)
        except ApiException as error:
            outcome = failure_outcome(error.status or 0)
            return self._failed(ref, decision, outcome, f"reading node {decision.node}: {_api_message(error)}")
        except urllib3.exceptions.HTTPError as error:
            return self._failed(ref, decision, RETRY, f"Kubernetes API unreachable: {error}")
        if problem:
            self._unschedulable(ref, problem)
            return self._report(ref, UNSCHEDULABLE, problem, decision.node)
        outcome, message = self._bind(decision)
        LATENCY.observe(time.perf_counter() - started)
        if outcome == BOUND:
            self.recorder.event(ref, NORMAL, SCHEDULED, scheduled_message(ref, decision.node), "Binding")
            for reason, warning in decision.warnings:
                self.recorder.event(ref, WARNING, reason, warning, "Binding")
        elif outcome in (RETRY, API_ERROR):
            return self._failed(ref, decision, outcome, message)
        return self._report(ref, outcome, message, decision.node, time.perf_counter() - started)

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
        return conflict_outcome(bind, pod), ""

    # -- all pending pods ------------------------------------------------------------------
    def resync(self) -> dict[str, Any]:
        """Place every pending pod of ours: what the event source missed or could not deliver,
        and pods whose node became usable since."""
        if self.api is None:
            return {"result": RETRY, "retry": True, "message": self.problem}
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
                outcome = self.resync()  # its own failures start no other recovery: the lock is held
                if not outcome.get("retry") and not outcome.get("outcomes", {}).get(RETRY):
                    log.info("recovered", extra={"decision": "Recovered", "pending": outcome.get("pending"),
                                                 "outcomes": outcome.get("outcomes")})
                    return
                delay = min(delay * 2, RECOVERY_MAX_PROBE)
        except Exception:  # a bug: say so and stop; the next failure or ping starts afresh
            log.exception("recovery after an outage failed")
        finally:
            self._recovering.release()
