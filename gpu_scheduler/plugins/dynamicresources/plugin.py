"""DynamicResources (DRA mode): the pod's ResourceClaim can hold exactly its map entry's devices,
as its node's ResourceSlices publish them, none of them allocated in another claim; PreBind then
makes it so, as kube-scheduler's dynamicresources plugin does: the claim created (owned by the
pod), kube-scheduler's finalizer added, then allocation and reservation in one status update, each
write at the version read and, after a 409, decided again from the claim as it is then.

The matching of map devices to published devices, and the claim's bodies, are gpu_scheduler/plugins/dynamicresources/allocator.py
(the allocator, as k8s.io/dynamic-resource-allocation/structured is kube-scheduler's). Reserve
takes nothing here: the device records (GPUsHeld) are the lock, written before the claim."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol

from kubeapi.errors import APIError

from . import allocator as dra
from ...devices import DRA, MODE_ANNOTATION
from ..config import SchedulerConfig
from ...framework.events import CLAIM_DELETE, CLAIM_UPDATE, SLICE_ADD, SLICE_DELETE, SLICE_UPDATE
from ...framework.interface import (
    ANY_NODE_RESULT, SUCCESS, PreFilterResult, CycleState, FilterPlugin, PreBindPlugin, PreFilterPlugin, ReservePlugin, Status, api_failure, error,
    unresolvable, unschedulable,
)
from ...framework.snapshot import DraSupport
from ...placement import metadata
from ..mapentry import resolved

NAME = "DynamicResources"
WANTED = "DynamicResources/wanted"  # CycleState: the dra.Wanted filter decided, None for a pod not in DRA mode
ALLOCATED = "DynamicResources/allocated"  # CycleState: the claim as this attempt's PreBind allocated it
QUOTA_EXCEEDED = "QuotaExceeded"  # the reason of a claim the namespace's ResourceQuota refused
CLAIM_TRIES = 5  # writes of one pod's claim in one attempt (a create, the finalizer, the status; 409s)


def _annotated_dra(pod: Mapping[str, Any]) -> bool:
    annotations = metadata(pod).get("annotations") or {}
    return isinstance(annotations, Mapping) and annotations.get(MODE_ANNOTATION) == DRA


def claim_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of the claim bind makes for the pod."""
    return str(metadata(pod).get("namespace") or ""), dra.pod_claim(pod)


class ClaimStore(Protocol):
    """What DynamicResources reads and writes through the handle: the pod's ResourceClaim."""

    def read_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...
    def create_claim(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def update_claim(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def update_claim_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...


class DynamicResources(PreFilterPlugin, FilterPlugin, ReservePlugin, PreBindPlugin):
    name = NAME
    events = frozenset({SLICE_ADD, SLICE_UPDATE, SLICE_DELETE, CLAIM_UPDATE, CLAIM_DELETE})

    def __init__(self, config: SchedulerConfig):
        self.config = config

    def pre_filter(self, state: CycleState, pod) -> PreFilterResult:
        """What the pod alone says: whether it is in DRA mode, and names the claim bind makes."""
        state.write(WANTED, None)
        if not dra.uses_dra(pod):
            if _annotated_dra(pod):
                return PreFilterResult(unresolvable(NAME, f"the pod asks for device env mode dra but has no spec.resourceClaims entry"
                                          f" {dra.POD_CLAIM!r}: it was admitted without gpu-scheduler's webhook;"
                                          " create it again"))
            return ANY_NODE_RESULT
        name = claim_key(pod)[1]
        if dra.claim_refs(pod) != [name]:
            return PreFilterResult(unresolvable(NAME, f"spec.resourceClaims entry {dra.POD_CLAIM!r} must name ResourceClaim {name!r},"
                                      " the claim bind makes for the pod"))
        return ANY_NODE_RESULT

    def filter(self, state: CycleState, pod, node) -> Status:
        if not dra.uses_dra(pod):
            return SUCCESS
        if node.dra is DraSupport.OFF:
            return unschedulable(NAME, "the pod is in DRA mode (spec.resourceClaims gpu-scheduler) but bind runs with"
                                       " GPU_SCHEDULER_DRA=false")
        if node.dra is DraSupport.NOT_SERVED:
            return unschedulable(NAME, "the pod is in DRA mode (spec.resourceClaims gpu-scheduler) but the API server"
                                       " does not serve resource.k8s.io/v1 ResourceSlices and ResourceClaims"
                                       " (Kubernetes 1.34+)")
        entry = resolved(state)
        namespace, name = claim_key(pod)
        wanted = dra.wanted_devices(namespace, name, entry.index, entry.placement,
                                    dra.device_class(pod, self.config.dra_device_class), self.config.dra_rules,
                                    node.slices, node.held)
        if isinstance(wanted, str):
            return unschedulable(NAME, wanted)
        step = dra.claim_step(node.claims.get((namespace, name)), pod, wanted)
        if isinstance(step, dra.Blocked):  # the claim as seen already says no: no record written
            return unschedulable(NAME, step.message)
        state.write(WANTED, wanted)
        return SUCCESS

    def assume(self, state: CycleState, pod, node):
        """The devices the pod's claim would hold, held on the snapshot (as allocated)."""
        wanted = state.read(WANTED)
        if wanted is None:
            return node
        held = dict(node.held)
        for _, device in wanted.requests:
            held[device] = f"{wanted.namespace}/{wanted.claim}"
        return dataclasses.replace(node, held=held)

    def reserve(self, state: CycleState, pod, node, cluster) -> Status:
        """Nothing to hold here: the device records (GPUsHeld) are the lock; PreBind writes the claim."""
        return SUCCESS

    def unreserve(self, state: CycleState, pod, node, cluster: ClaimStore) -> None:
        """A later phase failed (a gang member's PreBind or Binding): the allocation this attempt's
        PreBind wrote is taken back, at the version it wrote, so that a pod not bound holds no
        device (kube-scheduler's Unreserve deallocates likewise). A claim written since is left."""
        claim = state.read(ALLOCATED)
        if claim is None:
            return
        namespace, name = claim_key(pod)
        body = dra.deallocated(claim)
        try:
            cluster.update_claim_status(namespace, name, body)
        except APIError:
            pass  # written since, or the API is down: the pod's next attempt finds it reserved for itself

    def pre_bind(self, state: CycleState, pod, node, cluster: ClaimStore) -> Status:
        """Make the pod's ResourceClaim hold what filter decided, allocated and reserved for it."""
        wanted: dra.Wanted | None = state.read(WANTED)
        if wanted is None:
            return SUCCESS
        namespace, name = wanted.namespace, wanted.claim
        what = f"ResourceClaim {namespace}/{name}"
        claim = node.claims.get((namespace, name))
        for _ in range(CLAIM_TRIES):
            step = dra.claim_step(claim, pod, wanted)
            if isinstance(step, dra.Ready):
                return SUCCESS
            if isinstance(step, dra.Blocked):
                return unschedulable(NAME, step.message)
            try:
                if isinstance(step, dra.Create):
                    claim = cluster.create_claim(namespace, dra.claim_for(pod, wanted))
                elif isinstance(step, dra.Update):
                    claim = cluster.update_claim(namespace, name, step.body)
                else:
                    claim = cluster.update_claim_status(namespace, name, step.body)
                    if (step.body.get("status") or {}).get("allocation") and not (
                            node.claims.get((namespace, name)) or {}).get("status", {}).get("allocation"):
                        state.write(ALLOCATED, claim)
                continue
            except APIError as failure:
                if failure.quota_exceeded:
                    # The namespace's device-class quota (requests by DeviceClass, 1.34): the API
                    # server's own words; a claim of the namespace deleted (CLAIM_DELETE) frees it.
                    return unschedulable(NAME, f"creating {what}: {failure.message}", QUOTA_EXCEEDED)
                if not failure.conflict:
                    return api_failure(NAME, f"writing {what}", failure)
            try:  # another writer was first: the claim as it is now
                claim = cluster.read_claim(namespace, name)
            except APIError as failure:
                return api_failure(NAME, f"reading {what}", failure)
        return error(NAME, f"{what} changed {CLAIM_TRIES} times while writing it")
