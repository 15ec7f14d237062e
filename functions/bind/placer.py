"""The Kubernetes side of bind: its views of the cluster (views.py: the cache, cache.py, kept by
the watches' event handlers, eventhandlers.py), its scheduling queue (schedqueue.py) and the
workers that drain it. Each attempt at a pod is the framework's (gpu_scheduler/framework:
PreFilter, Filter, Reserve, Permit, PreBind, Bind, on a snapshot of the pod's node); this shell
gives it the I/O it asks for (handle.py) and turns its Outcome into Events, the pod's condition,
the queue's verdict and the log.

bind finds its own work: every pending pod of ours that its pod watch shows is queued and placed,
whether or not an event came; an event or a ping makes it sooner and serves as a check."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

import prometheus_client as prom

from gpu_scheduler.binding import (
    ALREADY_BOUND, BOUND, GONE, PENDING_SELECTOR, REPLACED, Ignore, Unplaceable, bind_decision, not_ours_to_place,
)
from gpu_scheduler.devices import DRA
from gpu_scheduler.events import (
    FAILED_SCHEDULING, NORMAL, PLUGIN_ANNOTATION, SCHEDULED, SCHEDULER_ERROR, UNSCHEDULABLE, WARNING, PodRef,
    scheduled_message,
)
from gpu_scheduler.framework.interface import API_ERROR, RETRY, Code
from gpu_scheduler.framework.runtime import PERMIT, PRE_BIND, PRE_ENQUEUE, RESERVE, CycleOutcome, Framework, Outcome
from gpu_scheduler.plugins.config import SchedulerConfig
from gpu_scheduler.plugins.defaultbinder import POD_CHANGED
from gpu_scheduler.plugins.registry import new_framework
from gpu_scheduler.queueing import Refused
from gpu_scheduler.records import GRACE_SECONDS, LEASE_API, entry_is_free, is_free, lease_for
from kubeapi.client import Kube, load_configuration
from kubeapi.errors import APIError
from kubeapi.kubeconfig import KubeconfigError
from kubeapi.projection import PODS
from advertiser import NodeAdvertiser
from config import BindConfig, ConfigError, dra_mode_unserved
from handle import AttemptHandle
from informers import Requirement
from metrics import ATTEMPT_DURATION, PREEMPTION_ATTEMPTS, SCHEDULE_ATTEMPTS
from recorder import Recorder
from schedqueue import SchedulingQueue
import testhooks
from views import Views

log = logging.getLogger("bind")
SUCCESS = (BOUND, ALREADY_BOUND)
OUTCOMES = prom.Counter("gpu_scheduler_bind_outcomes_total", "Placement outcomes by result", ["result"])
POD_READS = prom.Counter("gpu_scheduler_bind_pod_reads_total",
                        "Where an event's pod was read: the pod watch, or a GET", ["source"])
EVENT_WAIT_SECONDS = 8  # an event for a pod being placed waits for that attempt's outcome
RESYNC_WAIT_SECONDS = 20  # a ping waits this long for the outcomes of the pods it found
GANG_BINDINGS_IN_FLIGHT = 16
# A refusal from a scoped view (scope.py), not said: decided again from the whole view.
DEFERRED = "Deferred"
SCOPED_REFUSAL = "refused on the pods read for it; decided again once bind has listed every pod"
RECORDS_CHECK_SECONDS = 10  # how often a failing check that bind may write its records is made again


def server_version(api: Kube) -> Mapping[str, Any]:
    """The API server's /version (gitVersion, major, minor, ...), {} when it cannot be read. Every
    authenticated user may read it (ClusterRole system:public-info-viewer): bind needs no grant."""
    try:
        answer = api.server_version()
    except (APIError, ValueError) as error:  # no answer, or not JSON: the message says unknown
        log.info("reading the API server's version", extra={"detail": str(error)[:200]})
        return {}
    return answer if isinstance(answer, dict) else {}


@dataclasses.dataclass
class Attempt:
    """What one attempt came to, for the caller (outcome) and for the queue (refused, retry)."""

    outcome: dict[str, Any]
    refused: Refused | None = None
    retry: bool = False
    jitter: bool = False  # retry after a jittered backoff (a gang that lost a race)


@dataclasses.dataclass(frozen=True)
class Readiness:
    ready: bool
    message: str = ""


class Placer:
    def __init__(self, api: Kube | None, config: BindConfig | None = None, problem: str = "",
                 handle_type: Callable[..., AttemptHandle] = AttemptHandle):
        self.api, self.problem = api, problem
        self.config = config or BindConfig(SchedulerConfig())
        self.namespace = self.config.scheduler.namespace
        self.framework = new_framework(self.config.scheduler)
        # The same plugins without PostFilter, for a cycle on a scoped view (scope.py): preemption
        # chooses among every pod, and a scoped view's refusals wait for the whole one anyway.
        self._scoped_framework = Framework(dataclasses.replace(self.framework.profile, post_filter=()))
        self._handle_type = handle_type  # AttemptHandle; a test hook's (testhooks.py) only where injected
        self._group_locks: dict[str, threading.Lock] = {}  # one attempt per pod group (gang) at a time
        # A gang's Bindings all come at once, after its last member: more of them in flight than
        # workers place single pods (each waits on the API server, not on the CPU).
        self._binding_pool = ThreadPoolExecutor(GANG_BINDINGS_IN_FLIGHT, thread_name_prefix="gang-binding")
        self._started = False
        self._start_lock = threading.Lock()
        self._resyncing = threading.Lock()  # one resync at a time; pings meanwhile coalesce
        self._resync_wanted = threading.Event()
        # What keeps bind from writing its device records (no namespace, no RBAC): readiness says
        # it, until the check that found it passes.
        self._records_problem = ""
        self._records_checked = threading.Event()
        self._recheck = threading.Event()
        if api is not None:
            self.queue = SchedulingQueue()
            # Device env mode dra: every pod that chooses no other mode needs DRA's kinds, so bind
            # is not ready without them rather than refusing every such pod (Requirement).
            dra_required = (Requirement(lambda: dra_mode_unserved(server_version(api)))
                            if self.config.device_mode == DRA else None)
            self.views = Views(api, self.namespace, self.queue, dra=self.config.dra_enabled,
                               admits=lambda pod: self.framework.pre_enqueue(pod).ok,
                               quotas=self.config.scheduler.quota, dra_required=dra_required)
            self.recorder = Recorder(api, self.config.identity, placing=self.queue.placing)

    @classmethod
    def from_environment(cls) -> "Placer":
        """In a cluster, the pod's ServiceAccount; elsewhere KUBECONFIG (or ~/.kube/config)."""
        try:
            config = BindConfig.from_environment()
        except ConfigError as error:
            raise SystemExit(f"bind: {error}") from None
        try:
            api = Kube(load_configuration())
        except KubeconfigError as error:  # an unusable configuration: stay up, report not ready
            problem = (f"{error} (in a cluster: bind's ServiceAccount; elsewhere KUBECONFIG or ~/.kube/config,"
                       " and its current-context)")
            log.error("no Kubernetes API configuration", extra={"detail": problem})
            return cls(None, config, problem)
        return cls(api, config, handle_type=testhooks.handle_type(config))

    def start(self) -> None:
        """The watches, the workers and the record sweeper. On the first request of any kind (the
        readiness probe's, in Knative), not at import: functions-framework forks after importing,
        and threads made before the fork do not survive it."""
        if self._started or self.api is None:
            return
        with self._start_lock:
            if self._started:
                return
            if self.config.scheduler.quota:
                advertiser = NodeAdvertiser(self.api)
                advertiser.start()
                self.views.on_node = advertiser.offer  # before the node watch lists: every node is offered
            self.views.start()
            for n in range(self.config.workers):
                threading.Thread(target=self._work, name=f"placer-{n}", daemon=True).start()
            threading.Thread(target=self._sweep_forever, name="record-sweeper", daemon=True).start()
            threading.Thread(target=self._check_records_forever, name="records-check", daemon=True).start()
            self._started = True

    def readiness(self) -> Readiness:
        """Ready when it can place: an API configuration, its views listed once (the pods' as its
        pending pods: until every pod is listed a cycle reads its own, scope.py), and its records
        writable (their namespace exists and bind may create Leases there)."""
        if self.api is None:
            return Readiness(False, f"no Kubernetes API configuration: {self.problem}")
        self.start()
        if not self.views.can_place():
            return Readiness(False, self.views.sync_problem())
        if self._records_problem:
            return Readiness(False, self._records_problem)
        if not self._records_checked.is_set():
            return Readiness(False, f"checking that bind may write its device records in namespace {self.namespace}")
        return Readiness(True)

    def ready(self) -> bool:
        return self.readiness().ready

    def _check_records_forever(self) -> None:
        """Whether bind may write its device records: a dry-run create of one (the API server
        checks the namespace and bind's RBAC as for a real one, and stores nothing)."""
        probe = lease_for("readiness-check", "0", (), False, "", "", time.time())
        probe["metadata"]["name"] = "gpu-scheduler-readiness-check"
        while True:
            try:
                self.api.create_lease(self.namespace, probe, dry_run=True)
                problem = ""
            except APIError as error:
                if error.conflict:  # such a Lease exists: the namespace does, and create was authorized
                    problem = ""
                elif error.transient:
                    problem = self._records_problem
                elif error.namespace_missing():
                    problem = (f"namespace {self.namespace!r}, where bind keeps its device records, does not exist:"
                               f" create it (kubectl create namespace {self.namespace}), or set"
                               " GPU_SCHEDULER_NAMESPACE to the namespace to keep them in")
                elif error.status == 403:
                    problem = (f"bind may not create Leases ({LEASE_API}) in namespace {self.namespace!r}, where it"
                               f" keeps its device records: {error.message}; grant it the Role the chart installs"
                               " (get, list, watch, create, update, delete on leases), or set GPU_SCHEDULER_NAMESPACE"
                               " to the namespace that Role is in")
                else:
                    problem = f"writing a device record in namespace {self.namespace!r}: {error.message}"
                if not error.transient:
                    self._records_checked.set()
            else:
                self._records_checked.set()
            if problem != self._records_problem:
                (log.error if problem else log.info)("device records", extra={"detail": problem or "writable"})
            self._records_problem = problem
            self._recheck.wait(60 if not problem else RECORDS_CHECK_SECONDS)
            self._recheck.clear()

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
            pending = self.views.pending_pod(uid)
            if pending is None:
                attempt = Attempt(self._ignored("no longer pending"))
            elif pending.pod is None:  # kept by name only (past the view's memory bound, or from an event)
                attempt = self._read_and_place(PodRef(pending.namespace, pending.name, uid))
            else:
                attempt = self.place(pending.pod)
        except Exception:  # a bug: say so, and try again after the backoff
            log.exception("unexpected error placing a pod", extra={"uid": uid})
        finally:
            self.queue.done(uid, attempt.outcome, attempt.refused, attempt.retry, attempt.jitter)
        return attempt.outcome

    def _read_and_place(self, ref: PodRef, again: bool = True) -> Attempt:
        try:
            pod = self.api.read_pod(ref.namespace, ref.name, projection=PODS)
        except APIError as error:
            return self._unreadable(ref, error)
        if (pod.get("metadata") or {}).get("uid") != ref.uid:
            return Attempt(self._report(ref, REPLACED, "the pod was deleted; a pod of the same name has another UID"))
        return self.place(pod, again)

    # -- an event, a ping ----------------------------------------------------------------------
    def place_event(self, event_pod: Mapping[str, Any]) -> dict[str, Any]:
        """An add/update event is a trigger, not the truth: anyone who reaches bind can send one.
        A pod the event shows as not ours to place is ignored as it is (ignoring does nothing);
        any other is placed as the API server has it: from the pod watch when it holds the pod,
        else read now. Its map, UID, scheduler name and node are the API server's, and the
        Binding's preconditions are that UID and version."""
        ignore = not_ours_to_place(event_pod)
        if ignore is not None:
            return self._ignored(ignore.why)
        ref = PodRef.of(event_pod)
        if self.api is None:
            return {**self._report(ref, RETRY, f"no Kubernetes API configuration: {self.problem}"), "retry": True}
        self.start()
        # Nothing else of the event's pod is read (its map is not parsed): it is placed as the
        # API server has it.
        if self.views.synced():
            # Most add events come after the watch has shown the pod bound: logged at debug, since
            # its placement was logged when it was made.
            node = self.views.assigned_node(ref.uid)
            if node:
                return self._report(ref, ALREADY_BOUND, "", node, quiet=True)
            if self.views.pending_version(ref.uid) is not None:
                POD_READS.labels("watch").inc()
                return self._run(ref.uid)
        POD_READS.labels("get").inc()  # the watch has not shown it yet
        try:
            try:
                live = self.api.read_pod(ref.namespace, ref.name, cached=True, projection=PODS)
            except APIError as error:
                if not error.not_found:
                    raise
                live = self.api.read_pod(ref.namespace, ref.name, projection=PODS)  # created after the cache's view
        except APIError as error:
            attempt = self._unreadable(ref, error)
            if attempt.retry:  # this instance keeps it: the queue retries, a redelivery would not help
                self.views.remember(ref)
                self.queue.add(ref.uid)
                attempt.outcome["queued"] = True
            return attempt.outcome
        if (live.get("metadata") or {}).get("uid") != ref.uid:
            return self._report(ref, REPLACED, "the event's pod was deleted; a pod of the same name has another UID")
        if (live.get("spec") or {}).get("nodeName"):  # a duplicate, or another instance was first
            return self._report(ref, ALREADY_BOUND, "", live["spec"]["nodeName"], quiet=True)
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
            pods = self.api.list_pods(PENDING_SELECTOR, PODS)
        except APIError as error:
            # The watches list again by themselves once the API server answers: nothing to redeliver.
            return {"result": RETRY if error.transient else API_ERROR, "message": error.message}
        mark = self.queue.mark()
        uids = [self.views.observe_pending(pod) for pod in pods]
        for uid in uids:
            self.queue.add(uid)
        deadline = time.monotonic() + RESYNC_WAIT_SECONDS
        outcomes = [self.queue.outcome_after(uid, mark, max(0.0, deadline - time.monotonic())) or {"result": "InProgress"}
                    for uid in uids]
        if self.views.synced():  # a record's pod is judged gone from the whole view only
            self.sweep_records()
        counts: dict[str, int] = {}
        for outcome in outcomes:
            counts[outcome["result"]] = counts.get(outcome["result"], 0) + 1
        bound = [outcome["pod"] for outcome in outcomes if outcome["result"] == BOUND]
        log.info("resync", extra={"pending": len(pods), "outcomes": counts, "queue": self.queue.sizes()})
        return {"result": "resynced", "pending": len(pods), "outcomes": counts, "bound": bound}

    # -- one attempt -------------------------------------------------------------------------
    def place(self, pod: Mapping[str, Any], again: bool = True) -> Attempt:
        """One attempt at a pod as the API server has it: the framework's one cycle, for the pod
        and the pods scheduled with it (its gang). Every pending member's Events, condition and
        place in the queue follow from the cycle's outcome; the pod's own Attempt is returned.
        When the pod changed between its version and the Binding (its precondition), it is read
        and placed `again`, once."""
        decision = bind_decision(pod)
        if isinstance(decision, Ignore):
            return Attempt(self._ignored(decision.why))
        ref = PodRef.of(pod)
        if not isinstance(decision, Unplaceable) and not self.views.can_place():
            # never decide on a partial view; the queue tries again shortly. Logged at debug: readiness
            # and its own log line say why, where it lasts (device env mode dra without DRA's API),
            # and every pending pod would otherwise log this at each retry
            return Attempt(self._report(ref, RETRY, "bind's view of the cluster is not listed yet", quiet=True),
                           retry=True)
        started = time.perf_counter()
        began = self.queue.moves()
        # Read before the cycle, and never again in it: the whole pod listing that lands meanwhile
        # queues every pending pod (this one again, after its attempt), so nothing deferred is lost.
        whole = self.views.pods_listed()
        try:
            if whole:
                cycle = self.framework.schedule(pod, self._handle(pod))
            else:
                self.views.cover((ref.namespace,))
                cycle = self._scoped_framework.schedule(pod, self._handle(pod))
        except APIError as error:  # a scoped read (scope.py) failed: the cycle wrote nothing yet
            return Attempt(self._report(ref, RETRY if error.transient else API_ERROR,
                                        f"reading the pods its decision needs: {error.message}"), retry=True)
        if cycle.preemption:
            PREEMPTION_ATTEMPTS.labels(cycle.preemption).inc()
        attempt = Attempt({"result": RETRY, "message": "not among the pods of its cycle"}, retry=True)
        for member in cycle.members:
            attempted = member.uid == ref.uid
            if not whole and member.status.refused:
                # From a scoped view a placement is right (scope.py), but a refusal may not be: a
                # record whose pod the view does not hold counts as held, and preemption needs
                # every pod. Nothing is said or written; the whole listing queues the pod again.
                if attempted:
                    attempt = Attempt(self._report(PodRef.of(member.pod), DEFERRED, SCOPED_REFUSAL, quiet=True))
                continue  # a member not attempted stays as the queue has it (the listing queues it)
            settled = self._settle(PodRef.of(member.pod), cycle, member, started, attempted, again)
            if attempted:
                attempt = settled
            else:
                self.queue.settle(member.uid, began, settled.outcome, settled.refused, settled.retry, settled.jitter)
        return attempt

    def _handle(self, pod: Mapping[str, Any]) -> AttemptHandle:
        return self._handle_type(self.api, self.views, self.namespace, (pod,), pool=self._binding_pool,
                                 recorder=self.recorder, group_locks=self._group_locks)

    def _settle(self, ref: PodRef, cycle: CycleOutcome, outcome: Outcome, started: float, attempted: bool,
                again: bool) -> Attempt:
        """The shell's side of one pod's Outcome: its Events and condition, the log, and the
        queue's verdict. The same for a pod alone and for each member of a gang."""
        status = outcome.status
        if outcome.phase == PRE_ENQUEUE:  # held back (its scheduling gates): nothing written, not queued
            return Attempt(self._report(ref, status.reason, status.message, plugin=status.plugin))
        # What the pod asks for that gpu-scheduler does not do (an upstream PodGroup): said once,
        # at its first cycle, whatever the cycle came to
        for reason, notice in outcome.inputs.notices:
            self.recorder.event_once(ref, WARNING, reason, notice)
        if status.code is Code.SUCCESS:
            if status.already_bound:
                return Attempt(self._report(ref, ALREADY_BOUND, status.message, outcome.node))
            self.recorder.event(ref, NORMAL, SCHEDULED, scheduled_message(ref, outcome.node), "Binding")
            # the device warnings of the pod's entry, worked out with its inputs in its cycle
            for reason, warning in outcome.inputs.warnings:
                self.recorder.event(ref, WARNING, reason, warning, "Binding")
            self._attempted("scheduled", started)  # each pod bound, a gang's members too
            return Attempt(self._report(ref, BOUND, "", outcome.node, time.perf_counter() - started))
        if status.refused:
            return self._refused(ref, cycle, outcome, started, attempted)
        if status.reason == POD_CHANGED and again and attempted:
            return self._read_and_place(ref, again=False)
        if status.reason in (RETRY, API_ERROR, POD_CHANGED):
            attempt = self._failed(ref, outcome, started, attempted)
            return dataclasses.replace(attempt, jitter=not cycle.group.alone)  # a gang's retries never meet again
        return Attempt(self._report(ref, status.reason, status.message, outcome.node))  # gone, replaced, elsewhere
    def sweep_records(self) -> int:
        """Delete the records no pod holds any more, past their grace (each as read: a record
        written since is left alone). Hygiene only: a free record counts for nothing anyway."""
        deleted = 0
        kinds = [(record, is_free) for record in self.views.records()]
        kinds += [(record, entry_is_free) for record in self.views.entry_records()]  # pool entries'
        for record, is_free_now in kinds:
            node = self.views.snapshot(record.node)
            if not is_free_now(record, node.info.pods, node.now, node.gone):
                continue
            try:
                self.api.delete_lease(self.namespace, record.name, record.resource_version)
                deleted += 1
            except APIError:
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

    # -- outcomes ----------------------------------------------------------------------------
    def _unreadable(self, ref: PodRef, error: APIError) -> Attempt:
        """The outcome when the pod could not be read: gone (its 404), or as the API failed."""
        if error.not_found and error.kind in ("pods", ""):
            return Attempt(self._report(ref, GONE, "the pod does not exist"))
        outcome = RETRY if error.transient else API_ERROR
        return Attempt(self._report(ref, outcome, f"reading the pod: {error.message}"), retry=True)

    def _ignored(self, why: str) -> dict[str, Any]:
        OUTCOMES.labels("Ignored").inc()
        log.debug("ignored", extra={"decision": "Ignored", "why": why})
        return {"result": "ignored", "why": why}

    def _refused(self, ref: PodRef, cycle: CycleOutcome, outcome: Outcome, started: float, attempted: bool
                 ) -> Attempt:
        """A plugin refused the pod (or its group): one FailedScheduling Event naming the plugin
        (counted up while the refusal stays the same; a group's is one Event per member, kept
        current, and those of members not attempted themselves are coalesced, since members arrive
        in bursts), and PodScheduled=False. The pod waits in the queue for an event that the
        plugin the group waits on registered; a group that lost a race while reserving is tried
        again after a jittered backoff."""
        status, group = outcome.status, cycle.group
        annotations = {PLUGIN_ANNOTATION: status.plugin}
        if attempted or group.alone:
            self.recorder.event(ref, WARNING, FAILED_SCHEDULING, status.message, annotations=annotations,
                                key=group.plugin, if_changed=not attempted)
            self.recorder.unschedulable(ref, UNSCHEDULABLE, status.message)
        else:
            # Coalesced: members arrive in bursts. While members are still missing (the group waits
            # on no member) a member's condition stays as its own attempt wrote it: N members
            # created in a burst would otherwise rewrite N conditions (N watch events for every
            # bind instance) at each arrival.
            waits_on_member = cycle.waits_on is not None
            self.recorder.event_later(ref, WARNING, FAILED_SCHEDULING, status.message, annotations, group.plugin,
                                      condition=(UNSCHEDULABLE, status.message) if waits_on_member else None)
        if attempted:
            self._attempted("unschedulable", started)
            report = self._report(ref, status.reason or UNSCHEDULABLE, status.message, outcome.node,
                                  plugin=status.plugin)
        else:  # its group's refusal, logged once for the pod attempted, not once per member at every attempt
            report = {"result": status.reason or UNSCHEDULABLE, "pod": str(ref), "message": status.message,
                      "plugin": status.plugin}
        if not group.alone and outcome.phase in (RESERVE, PERMIT, PRE_BIND):
            return Attempt(report, retry=True, jitter=True)
        # a member refused with its group waits on the member the group waits on; one refused on its
        # own (its gang bound without it) on its own refusal
        grouped = not group.alone and cycle.waits_on is not None and cycle.status.refused
        waits_on = cycle.waits_on if grouped else outcome
        diagnosis = waits_on.decision.diagnosis if waits_on.decision is not None else ()
        return Attempt(report, Refused(waits_on.status.plugin, waits_on.node,
                                       tuple(sorted({(r.status.plugin, r.node) for r in diagnosis}))))

    def _failed(self, ref: PodRef, outcome: Outcome, started: float, attempted: bool = True) -> Attempt:
        """The API failed: retried after a backoff, transient or not (a 403 from a missing grant
        or a missing namespace is fixed by an operator, and then the next try binds)."""
        status = outcome.status
        self.recorder.event(ref, WARNING, FAILED_SCHEDULING, f"binding to {outcome.node}: {status.message}",
                            annotations={PLUGIN_ANNOTATION: status.plugin} if status.plugin else None)
        if status.reason == API_ERROR:  # the API answered, and will answer the same: say so on the pod
            self.recorder.unschedulable(ref, SCHEDULER_ERROR, status.message)
            self._recheck.set()  # readiness says what is wrong, if it is bind's configuration
        if attempted:
            self._attempted("error", started)
        return Attempt(self._report(ref, status.reason, status.message, outcome.node, plugin=status.plugin), retry=True)

    @staticmethod
    def _attempted(result: str, started: float) -> None:
        SCHEDULE_ATTEMPTS.labels(result).inc()
        ATTEMPT_DURATION.labels(result).observe(time.perf_counter() - started)

    def _report(self, ref: PodRef, outcome: str, message: str, node: str = "", elapsed: float | None = None,
                plugin: str = "", quiet: bool = False):
        OUTCOMES.labels(outcome).inc()
        fields = {"pod": str(ref), "uid": ref.uid, "node": node, "decision": outcome, "detail": message}
        if plugin:
            fields["plugin"] = plugin
        if elapsed is not None:
            fields["latency_ms"] = round(elapsed * 1000, 1)
        level = logging.DEBUG if quiet else logging.INFO if outcome in SUCCESS else logging.WARNING
        log.log(level, "placement", extra=fields)
        result = {"result": outcome, "pod": str(ref)}
        if node:
            result["node"] = node
        if message:
            result["message"] = message
        if plugin:
            result["plugin"] = plugin
        return result
