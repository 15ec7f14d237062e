"""The Kubernetes side of bind: one API client, reused; calls out, outcomes back."""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import prometheus_client as prom
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpu_scheduler.binding import (
    ALREADY_BOUND, BOUND, PENDING_SELECTOR, RETRY, Bind, Ignore, Unplaceable, bind_decision,
    binding_for, conflict_outcome, failure_outcome,
)

log = logging.getLogger("bind")
TIMEOUT = (3, 10)  # connect, read: an outage must turn into a 503 quickly, not a hung request
SUCCESS = (BOUND, ALREADY_BOUND)
OUTCOMES = prom.Counter("gpu_scheduler_bind_outcomes_total", "Placement outcomes by result", ["result"])
LATENCY = prom.Histogram("gpu_scheduler_bind_seconds", "Time to place one pod, API calls included",
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


def _api_message(error: ApiException) -> str:
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


class Placer:
    def __init__(self, api: client.CoreV1Api | None, problem: str = "", workers: int = 8):
        self.api = api
        self.problem = problem
        self.workers = workers

    @classmethod
    def from_environment(cls) -> "Placer":
        """In a cluster, the pod's ServiceAccount; elsewhere KUBECONFIG (or ~/.kube/config)."""
        try:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        except Exception as error:  # any unusable configuration: stay up, report not ready
            log.error("no Kubernetes API configuration: %s", error)
            return cls(None, str(error))
        return cls(client.CoreV1Api(), workers=int(os.environ.get("RESYNC_CONCURRENCY", "8")))

    def ready(self) -> bool:
        return self.api is not None

    def place(self, decision: Ignore | Bind | Unplaceable) -> dict[str, Any]:
        if isinstance(decision, Ignore):
            OUTCOMES.labels("Ignored").inc()
            log.debug("ignored", extra={"decision": "Ignored", "why": decision.why})
            return {"result": "ignored", "why": decision.why}
        if isinstance(decision, Unplaceable):
            OUTCOMES.labels(decision.reason).inc()
            log.warning("unplaceable", extra={"pod": decision.pod, "decision": decision.reason,
                                              "detail": decision.message})
            return {"result": decision.reason, "message": decision.message}
        started = time.perf_counter()
        outcome, message = self._bind(decision)
        elapsed = time.perf_counter() - started
        OUTCOMES.labels(outcome).inc()
        LATENCY.observe(elapsed)
        log.log(logging.INFO if outcome in SUCCESS else logging.WARNING, "bind", extra={
            "pod": f"{decision.namespace}/{decision.name}", "uid": decision.uid, "node": decision.node,
            "decision": outcome, "detail": message, "latency_ms": round(elapsed * 1000, 1)})
        result = {"result": outcome, "pod": f"{decision.namespace}/{decision.name}", "node": decision.node}
        if message:
            result["message"] = message
        if outcome == RETRY:
            result["retry"] = True
        return result

    def _bind(self, bind: Bind) -> tuple[str, str]:
        if self.api is None:
            return RETRY, f"no Kubernetes API configuration: {self.problem}"
        try:
            # _preload_content=False: the client cannot deserialize the Binding response
            # (kubernetes-client/python#825); a non-2xx still raises ApiException.
            self.api.create_namespaced_pod_binding(
                bind.name, bind.namespace, binding_for(bind),
                _preload_content=False, _request_timeout=TIMEOUT).release_conn()
            return BOUND, ""
        except ApiException as error:
            if error.status == 409:
                return self._after_conflict(bind)
            return failure_outcome(error.status or 0), _api_message(error)
        except urllib3.exceptions.HTTPError as error:
            return RETRY, f"Kubernetes API unreachable: {error}"

    def _after_conflict(self, bind: Bind) -> tuple[str, str]:
        try:
            current = self.api.read_namespaced_pod(bind.name, bind.namespace, _preload_content=False,
                                                   _request_timeout=TIMEOUT)
            pod = json.loads(current.data)
        except ApiException as error:
            if error.status != 404:
                return failure_outcome(error.status or 0), _api_message(error)
            pod = None
        except urllib3.exceptions.HTTPError as error:
            return RETRY, f"Kubernetes API unreachable: {error}"
        return conflict_outcome(bind, pod), ""

    def resync(self) -> dict[str, Any]:
        """Bind every pending pod of ours: what the event source missed or could not deliver."""
        if self.api is None:
            return {"result": RETRY, "retry": True, "message": self.problem}
        try:
            listing = self.api.list_pod_for_all_namespaces(
                field_selector=PENDING_SELECTOR, _preload_content=False, _request_timeout=TIMEOUT)
            pods = json.loads(listing.data)["items"]
        except ApiException as error:
            return {"result": failure_outcome(error.status or 0), "retry": failure_outcome(error.status or 0) == RETRY,
                    "message": _api_message(error)}
        except urllib3.exceptions.HTTPError as error:
            return {"result": RETRY, "retry": True, "message": f"Kubernetes API unreachable: {error}"}
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            outcomes = list(pool.map(lambda pod: self.place(bind_decision(pod)), pods))
        counts: dict[str, int] = {}
        for outcome in outcomes:
            counts[outcome["result"]] = counts.get(outcome["result"], 0) + 1
        log.info("resync", extra={"pending": len(pods), "outcomes": counts})
        return {"result": "resynced", "pending": len(pods), "outcomes": counts}
