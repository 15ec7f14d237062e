"""The Kubernetes side of bind: its views of the cluster (views.py), its scheduling queue
(schedqueue.py) and the workers that drain it, and one attempt at placing one pod: the checks,
the device records, the Binding. Calls out, outcomes back; the decisions are gpu_scheduler's.

bind finds its own work: every pending pod of ours that its pod watch shows is queued and placed,
whether or not an event came; an event or a ping makes it sooner and serves as a check."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from typing import Any, Mapping

import prometheus_client as prom
import urllib3
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import dra
from gpu_scheduler.binding import (
    ALREADY_BOUND, API_ERROR, BOUND, GONE, PENDING_SELECTOR, REPLACED, RETRY, Bind, Ignore, Unplaceable, bind_decision,
    binding_for, conflict_outcome, failure_outcome,
)
from gpu_scheduler.events import (
    FAILED_SCHEDULING, NORMAL, SCHEDULED, SCHEDULER_ERROR, UNSCHEDULABLE, WARNING, PodRef, scheduled_message,
)
from gpu_scheduler.devices import DRA, MODE_ANNOTATION
from gpu_scheduler.fit import GPUS_HELD, PodInfo, bind_refusal, shares_gpus, workload
from gpu_scheduler.placement import NotPlaceable, resolve
from gpu_scheduler.queueing import MAP, Refused
from gpu_scheduler.records import (
    GRACE_SECONDS, Create, Held, Keep, Record, is_free, lease_for, record_name, record_step, workload_key,
)
from kubeapi.client import IN_CLUSTER_NAMESPACE, Kube, load_configuration
from metrics import ATTEMPT_DURATION, SCHEDULE_ATTEMPTS
from recorder import Recorder
from schedqueue import SchedulingQueue
from views import Views

log = logging.getLogger("bind")
SUCCESS = (BOUND, ALREADY_BOUND)
OUTCOMES = prom.Counter("gpu_scheduler_bind_outcomes_total", "Placement outcomes by result", ["result"])
POD_READS = prom.Counter("gpu_scheduler_bind_pod_reads_total",
                        "Where an event's pod was read: the pod watch, or a GET", ["source"])
CHANGED = "the pod changed since the version it was placed from"
EVENT_WAIT_SECONDS = 8  # an event for a pod being placed waits for that attempt's outcome
RESYNC_WAIT_SECONDS = 20  # a ping waits this long for the outcomes of the pods it found
# For the test of bind dying between its two writes (tests/test_records_cluster.py): exit at once
# after writing a pod's device records, before its Binding. Never set outside that test.
EXIT_AFTER_RECORD = os.environ.get("GPU_SCHEDULER_TEST_EXIT_AFTER_RECORD") == "1"
# DRA mode (gpu_scheduler/dra.py): on unless GPU_SCHEDULER_DRA=false (a cluster without
# resource.k8s.io/v1, before Kubernetes 1.34: its watches would never list, bind never be ready).
# The rules and the default DeviceClass are read once, at start; wrong rules stop bind here.
DRA_ENABLED = os.environ.get("GPU_SCHEDULER_DRA", "true").lower() != "false"
DRA_DEVICE_CLASS = os.environ.get("GPU_SCHEDULER_DRA_DEVICE_CLASS") or dra.DEFAULT_DEVICE_CLASS
try:
    DRA_RULES = dra.parse_rules(os.environ.get("GPU_SCHEDULER_DRA_DEVICE_RULES"))
except dra.RuleError as error:
    raise SystemExit(str(error)) from None
CLAIM_TRIES = 5  # writes of one pod's claim in one attempt (a create, the finalizer, the status; 409s)


def _api_message(error: ApiException) -> str:
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def _failure(error: Exception) -> tuple[str, str]:
    """(outcome, message) for a failed API call."""
    if isinstance(error, ApiException):
        message = _api_message(error)
        return failure_outcome(error.status or 0, message), message
    return RETRY, f"Kubernetes API unreachable: {error}"


def _failed(doing: str, error: Exception) -> tuple[str, str, None]:
    """(outcome, message, no refusal) for a failed write or read of a record or claim: the API's
    message after what was being done, or that the API was unreachable."""
    if isinstance(error, ApiException):
        outcome, message = _failure(error)
        return outcome, f"{doing}: {message}", None
    return RETRY, f"{doing}: unreachable: {error}", None


def _annotated_dra(pod: Mapping[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and annotations.get(MODE_ANNOTATION) == DRA


def own_namespace() -> str:
    """Where bind keeps its device records: its own namespace (in a cluster, its ServiceAccount's;
    elsewhere GPU_SCHEDULER_NAMESPACE, by default gpu-scheduler)."""
    try:
        with open(IN_CLUSTER_NAMESPACE) as f:
            return f.read().strip() or "gpu-scheduler"
    except OSError:
        return os.environ.get("GPU_SCHEDULER_NAMESPACE", "gpu-scheduler")


@dataclasses.dataclass
class Attempt:
    """What one attempt came to, for the caller (outcome) and for the queue (refused, retry)."""

    outcome: dict[str, Any]
    refused: Refused | None = None
    retry: bool = False


class Placer:
    def __init__(self, api: Kube | None, problem: str = "", workers: int = 8, namespace: str = "gpu-scheduler"):
        self.api, self.problem, self.workers, self.namespace = api, problem, workers, namespace
        self._started = False
        self._start_lock = threading.Lock()
        self._resyncing = threading.Lock()  # one resync at a time; pings meanwhile coalesce
        self._resync_wanted = threading.Event()
        if api is not None:
            self.queue = SchedulingQueue()
            self.views = Views(api, namespace, self.queue, dra=DRA_ENABLED)
            self.recorder = Recorder(api, os.environ.get("HOSTNAME") or socket.gethostname())

    @classmethod
    def from_environment(cls) -> "Placer":
        """In a cluster, the pod's ServiceAccount; elsewhere KUBECONFIG (or ~/.kube/config)."""
        try:
            configuration = load_configuration()
        except Exception as error:  # any unusable configuration: stay up, report not ready
            log.error("no Kubernetes API configuration", extra={"detail": str(error)})
            return cls(None, str(error))
        return cls(Kube(configuration), workers=int(os.environ.get("RESYNC_CONCURRENCY", "8")),
                   namespace=own_namespace())

    def start(self) -> None:
        """The watches, the workers and the record sweeper. On the first request of any kind (the
        readiness probe's, in Knative), not at import: functions-framework forks after importing,
        and threads made before the fork do not survive it."""
        if self._started or self.api is None:
            return
        with self._start_lock:
            if self._started:
                return
            self.views.start()
            for n in range(self.workers):
                threading.Thread(target=self._work, name=f"placer-{n}", daemon=True).start()
            threading.Thread(target=self._sweep_forever, name="record-sweeper", daemon=True).start()
            self._started = True

    def ready(self) -> bool:
        """Ready when it can place: an API configuration, and its views listed once."""
        if self.api is None:
            return False
        self.start()
        return self.views.synced()

    # -- the work --------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            uid = self.queue.pop()
            if uid is not None:
                self._attempt_claimed(uid)

    def _run(self, uid: str) -> dict[str, Any]:
        """Place the pod now in this thread, or, when an attempt is running, wait for its outcome."""
        mark = self.queue.mark()
        if self.queue.claim(uid):
            return self._attempt_claimed(uid)
        outcome = self.queue.outcome_after(uid, mark, EVENT_WAIT_SECONDS)
        return outcome or {"result": "InProgress", "why": "another attempt at this pod is running"}

    def _attempt_claimed(self, uid: str) -> dict[str, Any]:
        attempt = Attempt({"result": RETRY, "message": "internal error"}, retry=True)
        try:
            pod, name = self.views.pending_pod(uid)
            if pod is None and name is None:
                attempt = Attempt(self._ignored("no longer pending"))
            elif pod is None:  # kept by name only (past the view's memory bound, or from an event)
                attempt = self._read_and_place(PodRef(name[0], name[1], uid))
            else:
                attempt = self._place(pod)
        except Exception:  # a bug: say so, and try again after the backoff
            log.exception("unexpected error placing a pod", extra={"uid": uid})
        finally:
            self.queue.done(uid, attempt.outcome, attempt.refused, attempt.retry)
        return attempt.outcome

    def _read_and_place(self, ref: PodRef, again: bool = True) -> Attempt:
        try:
            pod = self.api.read_pod(ref.namespace, ref.name)
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            return self._unreadable(ref, error)
        if (pod.get("metadata") or {}).get("uid") != ref.uid:
            return Attempt(self._report(ref, REPLACED, "the pod was deleted; a pod of the same name has another UID"))
        return self._place(pod, again)

    # -- an event, a ping ----------------------------------------------------------------------
    def place_event(self, event_pod: Mapping[str, Any]) -> dict[str, Any]:
        """An add/update event is a trigger, not the truth: anyone who reaches bind can send one.
        A pod the event shows as not ours to place is ignored as it is (ignoring does nothing);
        any other is placed as the API server has it: from the pod watch when it holds the pod,
        else read now. Its map, UID, scheduler name and node are the API server's, and the
        Binding's preconditions are that UID and version."""
        decision = bind_decision(event_pod)
        if isinstance(decision, Ignore):
            return self._ignored(decision.why)
        ref = PodRef.of(event_pod)
        if self.api is None:
            return {**self._report(ref, RETRY, f"no Kubernetes API configuration: {self.problem}"), "retry": True}
        self.start()
        if self.views.synced():
            node = self.views.assigned_node(ref.uid)
            if node:
                return self._report(ref, ALREADY_BOUND, "", node)
            if self.views.pending_version(ref.uid) is not None:
                POD_READS.labels("watch").inc()
                return self._run(ref.uid)
        POD_READS.labels("get").inc()  # the watch has not shown it yet
        try:
            try:
                live = self.api.read_pod(ref.namespace, ref.name, cached=True)
            except ApiException as error:
                if error.status != 404:
                    raise
                live = self.api.read_pod(ref.namespace, ref.name)  # created after the cache's view
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            attempt = self._unreadable(ref, error)
            if attempt.retry:  # this instance keeps it: the queue retries, a redelivery would not help
                self.views.remember(ref)
                self.queue.add(ref.uid)
                attempt.outcome["queued"] = True
            return attempt.outcome
        if (live.get("metadata") or {}).get("uid") != ref.uid:
            return self._report(ref, REPLACED, "the event's pod was deleted; a pod of the same name has another UID")
        if (live.get("spec") or {}).get("nodeName"):  # a duplicate, or another instance was first
            return self._report(ref, ALREADY_BOUND, "", live["spec"]["nodeName"])
        return self._run(self.views.observe_pending(live))

    def resync(self, wait: bool = False) -> dict[str, Any]:
        """A ping: list our pending pods (a check that the watch missed none), try each now, free the
        records nobody holds, and answer with what became of them. One at a time: a ping that comes
        while a resync runs asks for one more run after it and returns."""
        if self.api is None:
            return {"result": RETRY, "retry": True, "message": self.problem}
        self.start()
        self._resync_wanted.set()
        if not self._resyncing.acquire(blocking=wait):
            return {"result": "coalesced", "why": "a resync is running; one more follows it"}
        try:
            outcome: dict[str, Any] = {}
            while self._resync_wanted.is_set():
                self._resync_wanted.clear()
                outcome = self._resync_once()
            return outcome
        finally:
            self._resyncing.release()

    def _resync_once(self) -> dict[str, Any]:
        try:
            pods = self.api.list_pods(PENDING_SELECTOR)
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            outcome, message = _failure(error)
            # The watches list again by themselves once the API server answers: nothing to redeliver.
            return {"result": outcome, "message": message}
        mark = self.queue.mark()
        uids = [self.views.observe_pending(pod) for pod in pods]
        for uid in uids:
            self.queue.add(uid)
        deadline = time.monotonic() + RESYNC_WAIT_SECONDS
        outcomes = [self.queue.outcome_after(uid, mark, max(0.0, deadline - time.monotonic())) or {"result": "InProgress"}
                    for uid in uids]
        self.sweep_records()
        counts: dict[str, int] = {}
        for outcome in outcomes:
            counts[outcome["result"]] = counts.get(outcome["result"], 0) + 1
        bound = [outcome["pod"] for outcome in outcomes if outcome["result"] == BOUND]
        log.info("resync", extra={"pending": len(pods), "outcomes": counts, "queue": self.queue.sizes()})
        return {"result": "resynced", "pending": len(pods), "outcomes": counts, "bound": bound}

    # -- one attempt -------------------------------------------------------------------------
    def _place(self, pod: Mapping[str, Any], again: bool = True) -> Attempt:
        """Place a pod as the API server has it: check it against its node as watched, record its
        devices, bind it. When the pod changed between that version and the Binding (its
        precondition), it is read and placed `again`, once."""
        decision = bind_decision(pod)
        if isinstance(decision, Ignore):
            return Attempt(self._ignored(decision.why))
        ref = PodRef.of(pod)
        if isinstance(decision, Unplaceable):
            self._unschedulable(ref, decision.message)
            return Attempt(self._report(ref, decision.reason, decision.message), Refused(MAP, ""))
        if not self.views.synced():  # never decide on a partial view; the queue tries again shortly
            return Attempt(self._report(ref, RETRY, "bind's view of the cluster is not listed yet"), retry=True)
        started = time.perf_counter()
        refusal, steps, wanted = self._check_and_assume(pod, decision)
        if refusal is not None:
            return self._refused(ref, decision, *refusal, started)
        problem = self._write_records(pod, decision, steps)
        if problem is None and wanted is not None:
            problem = self._write_claim(pod, wanted)
        if problem is not None:
            self.views.forget(decision.node, decision.uid)
            outcome, message, refused = problem
            if refused is not None:
                return self._refused(ref, decision, refused.filter, message, started)
            return self._failed(ref, decision, outcome, message, started)
        if EXIT_AFTER_RECORD:
            os._exit(17)
        outcome, message = self._bind(decision)
        if outcome != BOUND:
            self.views.forget(decision.node, decision.uid)
        if message == CHANGED and again:
            return self._read_and_place(ref, again=False)
        if outcome in (RETRY, API_ERROR):
            return self._failed(ref, decision, outcome, message, started)
        if outcome == BOUND:
            self.recorder.event(ref, NORMAL, SCHEDULED, scheduled_message(ref, decision.node), "Binding")
            for reason, warning in decision.warnings:
                self.recorder.event(ref, WARNING, reason, warning, "Binding")
            self._attempted("scheduled", started)
        return Attempt(self._report(ref, outcome, message, decision.node, time.perf_counter() - started))

    def _check_and_assume(self, pod: Mapping[str, Any], decision: Bind):
        """The filters and the device records as watched, and, when they pass, the pod assumed on
        its node: one step under the views' lock, so two attempts of this instance never count the
        same free cpu or GPU twice. In DRA mode, also the devices the pod's claim must hold, from
        the node's ResourceSlices and every claim's allocation as watched.
        Returns ((filter, message), [], None) or (None, steps, dra.Wanted or None)."""
        node = self.views.node(decision.node)
        mine, shares = workload_key(workload(pod)), shares_gpus(pod)
        now = time.time()
        with self.views.lock:
            info = self.views.node_info(decision.node)
            refusal = bind_refusal(pod, node, decision.placement, info)
            if refusal is not None:
                return refusal, [], None
            steps = []
            for device in decision.devices:
                record = self.views.record(decision.node, device)
                step = record_step(record, mine, shares, info.pods, now, self.views.gone_of_locked(record))
                if isinstance(step, Held):
                    return (GPUS_HELD, step.message), [], None
                steps.append((device, step))
            wanted = None
            if _annotated_dra(pod) and not dra.uses_dra(pod):
                return (MAP, f"the pod asks for device env mode dra but has no spec.resourceClaims entry"
                             f" {dra.POD_CLAIM!r}: it was admitted without gpu-scheduler's webhook; create it again"), [], None
            if dra.uses_dra(pod):
                wanted = self._wanted_locked(pod, decision)
                if isinstance(wanted, str):
                    return (dra.DYNAMIC_RESOURCES, wanted), [], None
            self.views.assume(decision.node, dataclasses.replace(PodInfo.of(pod), devices=decision.devices))
        return None, steps, wanted

    def _wanted_locked(self, pod: Mapping[str, Any], decision: Bind) -> "dra.Wanted | str":
        """Inside the views' lock: what the pod's claim must hold, or why it cannot."""
        if not self.views.dra:
            return "the pod is in DRA mode (spec.resourceClaims gpu-scheduler) but bind runs with GPU_SCHEDULER_DRA=false"
        if not self.views.dra_served():
            return ("the pod is in DRA mode (spec.resourceClaims gpu-scheduler) but the API server does not serve"
                    " resource.k8s.io/v1 ResourceSlices and ResourceClaims (Kubernetes 1.34+)")
        if dra.claim_refs(pod) != [dra.claim_name(decision.name)]:
            return (f"spec.resourceClaims entry {dra.POD_CLAIM!r} must name ResourceClaim {dra.claim_name(decision.name)!r},"
                    f" the claim bind makes for the pod")
        try:
            index = resolve(pod).index
        except NotPlaceable as why:  # decided placeable a moment ago from the same pod
            return why.message
        wanted = dra.wanted_devices(decision.namespace, decision.name, index, decision.placement,
                                    dra.device_class(pod, DRA_DEVICE_CLASS), DRA_RULES,
                                    self.views.slices_on(decision.node), self.views.held())
        if isinstance(wanted, dra.Wanted):  # the claim as watched already says no: no record written
            step = dra.claim_step(self.views.claim(wanted.namespace, wanted.claim), pod, wanted)
            if isinstance(step, dra.Blocked):
                return step.message
        return wanted

    def _write_claim(self, pod: Mapping[str, Any], wanted: "dra.Wanted"):
        """Make the pod's ResourceClaim hold `wanted`, allocated and reserved for the pod, as
        kube-scheduler does: created if absent, its finalizer added (an update), then allocation
        and reservation in one status update; each write at the version read, and after a 409 the
        claim is read and the next step decided again. None when it is ready; else
        (outcome, message, refused or None)."""
        namespace, name = wanted.namespace, wanted.claim
        what = f"ResourceClaim {namespace}/{name}"
        claim = self.views.claim(namespace, name)
        for _ in range(CLAIM_TRIES):
            step = dra.claim_step(claim, pod, wanted)
            if isinstance(step, dra.Ready):
                return None
            if isinstance(step, dra.Blocked):
                return UNSCHEDULABLE, step.message, Refused(dra.DYNAMIC_RESOURCES, wanted.node)
            try:
                if isinstance(step, dra.Create):
                    claim = self.api.create_resource_claim(namespace, dra.claim_for(pod, wanted))
                elif isinstance(step, dra.Update):
                    claim = self.api.update_resource_claim(namespace, name, step.body)
                else:
                    claim = self.api.update_resource_claim_status(namespace, name, step.body)
                self.views.wrote_claim(claim)
                continue
            except ApiException as error:
                if error.status != 409:
                    return _failed(f"writing {what}", error)
            except urllib3.exceptions.HTTPError as error:
                return _failed(f"writing {what}", error)
            try:  # another writer was first: the claim as it is now
                claim = self.api.read_resource_claim(namespace, name)
                self.views.wrote_claim(claim)
            except ApiException as error:
                if error.status != 404:
                    return _failed(f"reading {what}", error)
                claim = None
            except urllib3.exceptions.HTTPError as error:
                return _failed(f"reading {what}", error)
        return RETRY, f"{what} changed {CLAIM_TRIES} times while writing it", None

    def _write_records(self, pod: Mapping[str, Any], decision: Bind, steps: list):
        """Record each device given, before the Binding: a create, or an update at the version
        decided from. When another writer was first (409), read the record and decide again.
        None when all are written; else (outcome, message, refused or None)."""
        mine, shares = workload_key(workload(pod)), shares_gpus(pod)
        who = f"{decision.namespace}/{decision.name}"
        for device, step in steps:
            for _ in range(3):
                if isinstance(step, Keep):
                    break
                try:
                    if isinstance(step, Create):
                        lease = self.api.create_lease(self.namespace, lease_for(
                            decision.node, device, (mine,), shares, who, decision.uid, time.time()))
                    else:
                        flag = shares if step.holders == (mine,) else step.record.shares
                        lease = self.api.update_lease(self.namespace, step.record.name, lease_for(
                            decision.node, device, step.holders, flag, who, decision.uid, time.time(), step.record))
                    self.views.wrote(lease)
                    break
                except ApiException as error:
                    if error.status != 409:
                        return _failed(f"writing the record of GPU {device} on {decision.node}", error)
                except urllib3.exceptions.HTTPError as error:
                    return _failed(f"writing the record of GPU {device} on {decision.node}", error)
                step = self._step_after_conflict(decision.node, device, mine, shares)
                if isinstance(step, tuple):
                    return step
                if isinstance(step, Held):
                    return UNSCHEDULABLE, step.message, Refused(GPUS_HELD, decision.node)
            else:
                return RETRY, f"the record of GPU {device} on {decision.node} changed three times while writing it", None
        return None

    def _step_after_conflict(self, node: str, device: str, mine: str, shares: bool):
        """Another writer was first: the record as it is now, and the step it calls for."""
        try:
            lease = self.api.read_lease(self.namespace, record_name(node, device))
            record = Record.of(lease)
            self.views.wrote(lease)
        except ApiException as error:
            if error.status != 404:
                return _failed(f"reading the record of GPU {device} on {node}", error)
            record = None  # deleted meanwhile: create it again
        except urllib3.exceptions.HTTPError as error:
            return _failed(f"reading the record of GPU {device} on {node}", error)
        gone = self.views.gone_of(record)
        with self.views.lock:
            return record_step(record, mine, shares, self.views.node_info(node).pods, time.time(), gone)

    def sweep_records(self) -> int:
        """Delete the records no pod holds any more, past their grace (each as read: a record
        written since is left alone). Hygiene only: a free record counts for nothing anyway."""
        deleted = 0
        now = time.time()
        for record in self.views.records():
            gone = self.views.gone_of(record)
            with self.views.lock:
                free = is_free(record, self.views.node_info(record.node).pods, now, gone)
            if not free:
                continue
            try:
                self.api.delete_lease(self.namespace, record.name, record.resource_version)
                deleted += 1
            except (ApiException, urllib3.exceptions.HTTPError):
                pass  # written since, gone already, or the API is down: the next sweep looks again
        return deleted

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(GRACE_SECONDS)
            try:
                if self.views.synced():
                    self.sweep_records()
            except Exception:
                log.exception("sweeping device records failed")

    # -- the Binding -------------------------------------------------------------------------
    def _bind(self, bind: Bind) -> tuple[str, str]:
        try:
            self.api.bind(bind.namespace, bind.name, binding_for(bind))
            return BOUND, ""
        except ApiException as error:
            if error.status == 409:
                return self._after_conflict(bind)
            return _failure(error)
        except urllib3.exceptions.HTTPError as error:
            return _failure(error)

    def _after_conflict(self, bind: Bind) -> tuple[str, str]:
        try:
            pod = self.api.read_pod(bind.namespace, bind.name)
        except ApiException as error:
            if error.status != 404:
                return _failure(error)
            pod = None
        except urllib3.exceptions.HTTPError as error:
            return _failure(error)
        outcome = conflict_outcome(bind, pod)
        if outcome == RETRY:  # still pending, but not the version decided from
            return RETRY, CHANGED
        return outcome, ""

    # -- outcomes ----------------------------------------------------------------------------
    def _unreadable(self, ref: PodRef, error: Exception) -> Attempt:
        """The outcome when the pod could not be read: gone (404), or as the API failed."""
        if isinstance(error, ApiException) and error.status == 404:
            return Attempt(self._report(ref, GONE, "the pod does not exist"))
        outcome, message = _failure(error)
        return Attempt(self._report(ref, outcome, f"reading the pod: {message}"), retry=True)

    def _ignored(self, why: str) -> dict[str, Any]:
        OUTCOMES.labels("Ignored").inc()
        log.debug("ignored", extra={"decision": "Ignored", "why": why})
        return {"result": "ignored", "why": why}

    def _unschedulable(self, ref: PodRef, message: str) -> None:
        self.recorder.event(ref, WARNING, FAILED_SCHEDULING, message)
        self.recorder.unschedulable(ref, UNSCHEDULABLE, message)

    def _refused(self, ref: PodRef, decision: Bind, filter_name: str, message: str, started: float) -> Attempt:
        self._unschedulable(ref, message)
        self._attempted("unschedulable", started)
        return Attempt(self._report(ref, UNSCHEDULABLE, message, decision.node), Refused(filter_name, decision.node))

    def _failed(self, ref: PodRef, bind: Bind, outcome: str, message: str, started: float) -> Attempt:
        """The API failed: retried after a backoff, transient or not (a 403 from a missing grant
        is fixed by an operator, and then the next try binds)."""
        self.recorder.event(ref, WARNING, FAILED_SCHEDULING, f"binding to {bind.node}: {message}")
        if outcome == API_ERROR:  # the API answered, and will answer the same: say so on the pod
            self.recorder.unschedulable(ref, SCHEDULER_ERROR, message)
        self._attempted("error", started)
        return Attempt(self._report(ref, outcome, message, bind.node), retry=True)

    @staticmethod
    def _attempted(result: str, started: float) -> None:
        SCHEDULE_ATTEMPTS.labels(result).inc()
        ATTEMPT_DURATION.labels(result).observe(time.perf_counter() - started)

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
        return result
