"""The I/O the framework's phases ask for, for one attempt at one pod (kube-scheduler's
framework.Handle): the framework's own part (framework.interface.Cluster: snapshots from bind's
views, the pod assumed and forgotten there, calls side by side, a lock per pod group) and the
protocols the plugins declare beside them (gang.WorkloadPods, gpusheld.RecordStore,
dynamicresources.plugin.ClaimStore, defaultbinder.Binder, defaultpreemption.Preemptor): the API
calls of the records, the claim, the Binding and preemption, each write also shown to the views at
once. Every API failure is kubeapi.errors.APIError; a read of something absent returns None."""
from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Executor
from typing import Any, Callable, Iterable, Mapping, Sequence

from gpu_scheduler.events import PodRef
from gpu_scheduler.fit import PodInfo
from gpu_scheduler.framework.interface import Status
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.plugins.dynamicresources.plugin import claim_key
from gpu_scheduler.plugins.gang import WorkloadMembers
from gpu_scheduler.records import Record, record_name
from kubeapi.client import Kube
from kubeapi.errors import APIError
from kubeapi.projection import PODS
from metrics import PREEMPTION_VICTIMS
from views import Views


class AttemptHandle:
    """For the attempt at `pods`: one pod, or a gang's pending members. `pool` runs a gang's
    Bindings concurrently; without it they run in turn."""

    def __init__(self, api: Kube, views: Views, namespace: str, pods: Iterable[Mapping[str, Any]],
                 pool: Executor | None = None, recorder: Any = None,
                 group_locks: dict[str, threading.Lock] | None = None):
        self.api, self.views, self.namespace, self._pool, self.recorder = api, views, namespace, pool, recorder
        self._claims = tuple(claim_key(pod) for pod in pods)
        self._namespaces = _namespaces(pods)
        self._group_locks = group_locks if group_locks is not None else {}

    def group_lock(self, group: str) -> threading.Lock:
        """One attempt per pod group at a time in this instance (other instances: the records)."""
        return self._group_locks.setdefault(group, threading.Lock())

    def workload_pods(self, key: tuple[str, ...]) -> WorkloadMembers:
        return self.views.workload_pods(key)

    def assumed(self, pod: Mapping[str, Any]) -> bool:
        return self.views.assumed(str((pod.get("metadata") or {}).get("uid") or ""))

    def group_formed(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """The attempt is for these pods: the snapshots carry their claims (DRA mode) and their
        namespaces' ResourceQuotas (GPUQuota)."""
        pods = tuple(pods)
        self._claims = tuple(claim_key(pod) for pod in pods)
        self._namespaces = _namespaces(pods)

    def each(self, calls: Sequence[Callable[[], Status]]) -> list[Status]:
        if self._pool is None or len(calls) < 2:
            return [call() for call in calls]
        return [future.result() for future in [self._pool.submit(call) for call in calls]]

    def snapshot(self, node: str) -> NodeSnapshot:
        return self.views.snapshot(node, self._claims, self._namespaces)

    def assume(self, pod: Mapping[str, Any], node: NodeSnapshot, devices: tuple[str, ...]) -> bool:
        return self.views.assume(dataclasses.replace(PodInfo.of(pod), devices=devices), node)

    def forget(self, pod: Mapping[str, Any], node: str) -> None:
        self.views.forget(node, str((pod.get("metadata") or {}).get("uid") or ""))

    # -- the pod -----------------------------------------------------------------------------
    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return self.api.read_pod(namespace, name, projection=PODS)
        except APIError as error:
            if error.not_found and error.kind in ("pods", ""):
                return None
            raise

    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self.api.bind(namespace, name, dict(body))

    # -- preemption (gpu_scheduler/plugins/defaultpreemption.py) ---------------------------------
    def pdbs(self, node: NodeSnapshot) -> Sequence[Mapping[str, Any]]:
        return self.views.pdbs(node.name)

    def members_of(self, workload: tuple[str, ...]) -> Sequence[tuple[str, PodInfo]]:
        return self.views.members_of(workload)

    def nominate(self, pod: Mapping[str, Any], node: str) -> None:
        meta = pod.get("metadata") or {}
        self.api.patch_pod_status(str(meta.get("namespace")), str(meta.get("name")),
                                  {"status": {"nominatedNodeName": node}})

    def evict(self, namespace: str, name: str, uid: str) -> None:
        self.api.evict(namespace, name, uid)
        PREEMPTION_VICTIMS.inc()

    def mark_preempted(self, namespace: str, name: str, uid: str, reason: str, condition_message: str,
                       event_message: str) -> None:
        """Written now, in this thread, after the eviction returned: the Eviction API's own
        DisruptionTarget (EvictionByEvictionAPI) is in place by then, and this replaces it. A
        victim deleted meanwhile (no grace period) has no condition to carry."""
        condition = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": condition_message,
                     "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            # metadata.uid: a precondition, never the condition of a pod re-created under the name
            self.api.patch_pod_status(namespace, name, {"metadata": {"uid": uid}, "status": {"conditions": [condition]}})
        except APIError as error:
            if not error.not_found:
                raise
        if self.recorder is not None:
            self.recorder.event(PodRef(namespace, name, uid), "Normal", "Preempted", event_message, "Preempting")

    # -- device records ----------------------------------------------------------------------
    def read_record(self, node: str, device: str) -> Record | None:
        try:
            lease = self.api.read_lease(self.namespace, record_name(node, device))
        except APIError as error:
            if error.not_found and error.kind == "leases":  # deleted meanwhile: create it again
                return None
            raise
        self.views.wrote(lease)
        return Record.of(lease)

    def create_record(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        lease = self.api.create_lease(self.namespace, dict(body))
        self.views.wrote(lease)
        return lease

    def update_record(self, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        lease = self.api.update_lease(self.namespace, name, dict(body))
        self.views.wrote(lease)
        return lease

    def delete_record(self, name: str, resource_version: str) -> None:
        self.api.delete_lease(self.namespace, name, resource_version)

    # -- DRA ---------------------------------------------------------------------------------
    def read_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            claim = self.api.read_resource_claim(namespace, name)
        except APIError as error:
            if error.not_found and error.kind == "resourceclaims":
                return None
            raise
        self.views.wrote_claim(claim)
        return claim

    def create_claim(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        claim = self.api.create_resource_claim(namespace, dict(body))
        self.views.wrote_claim(claim)
        return claim

    def update_claim(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        claim = self.api.update_resource_claim(namespace, name, dict(body))
        self.views.wrote_claim(claim)
        return claim

    def update_claim_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        claim = self.api.update_resource_claim_status(namespace, name, dict(body))
        self.views.wrote_claim(claim)
        return claim


def _namespaces(pods: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str((pod.get("metadata") or {}).get("namespace") or "") for pod in pods))
