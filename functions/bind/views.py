"""bind's one view of the cluster, kept current by its watches (informers.py), as
kube-scheduler's informers keep its cache: every pod (our pending pods, to place; every node's
non-terminal pods, for fit and GPU accounting), every node (labels, taints, conditions,
allocatable), bind's device records (gpu_scheduler/records.py), PodDisruptionBudgets, with quotas
on (GPU_SCHEDULER_QUOTA) every ResourceQuota (GPUQuota: plugins/gpuquota.py) and, for DRA
mode (gpu_scheduler/plugins/dynamicresources/allocator.py, unless GPU_SCHEDULER_DRA=false), every
ResourceSlice and ResourceClaim.

Views is what the rest of bind (placer.py, handle.py) reads and writes through. It builds the
three parts, after kube-scheduler's layout: the cache (cache.py: the state, its lock, the reads and
this instance's own writes), the event handlers (eventhandlers.py: each listing or event into the
cache, and what changed on to the scheduling queue: each change that can undo a refusal as a
cluster event, each pending pod of ours found new or changed queued) and one informer per kind.
The I/O side of bind; the decisions stay in gpu_scheduler/."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from gpu_scheduler.fit import PodInfo
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.plugins.gang import WorkloadMembers
from gpu_scheduler.records import RECORD_SELECTOR, Record
from cache import Cache, PendingPod
from eventhandlers import EventHandlers
from informers import Informer, Requirement
from kubeapi import projection
from schedqueue import SchedulingQueue
from scope import ScopedReads

NOT_TERMINAL = "status.phase!=Succeeded,status.phase!=Failed"


class Views:
    def __init__(self, api, namespace: str, queue: SchedulingQueue, dra: bool = True,
                 admits: Callable[[Mapping[str, Any]], bool] = lambda pod: True, quotas: bool = False,
                 dra_required: Requirement | None = None):
        """`dra_required`: DRA's kinds are needed (device env mode dra): not served, bind is not
        ready, saying why; without it they are optional, an empty view where not served."""
        self.api, self.namespace, self.queue = api, namespace, queue
        self.dra = dra
        self.informers: list[Informer] = []
        # gone_of compares a record with how far the pod watch is; a snapshot says whether DRA is served
        self.cache = Cache(dra, pods_version=lambda: self.informers[0].version,
                           dra_served=lambda: all(i.served for i in self.informers if i.optional),
                           quotas=quotas)
        self.handlers = handlers = EventHandlers(self.cache, queue, admits)
        self.informers = [
            # Pods and nodes, the bulk of what bind watches, decoded into only what it reads; pods
            # that are not terminal only, as kube-scheduler's pod informer selects them: a pod that
            # ends leaves the selection, which the watch says with a DELETED event (its GPUs free).
            Informer("pods", lambda: api.list_all_pods(projection.PODS, NOT_TERMINAL),
                     lambda version, seconds: api.watch_all_pods(version, seconds, projection.PODS, NOT_TERMINAL),
                     handlers.replace_pods, handlers.apply_pod),
            Informer("nodes", lambda: api.list_nodes(projection.NODES),
                     lambda version, seconds: api.watch_nodes(version, seconds, projection.NODES),
                     handlers.replace_nodes, handlers.apply_node),
            Informer("records", lambda: api.list_leases(namespace, RECORD_SELECTOR),
                     lambda version, seconds: api.watch_leases(namespace, RECORD_SELECTOR, version, seconds),
                     handlers.replace_records, handlers.apply_record),
            # Preemption evicts no pod a PodDisruptionBudget protects now (plugins/defaultpreemption.py).
            Informer("poddisruptionbudgets", api.list_pdbs, api.watch_pdbs, handlers.replace_pdbs, handlers.apply_pdb),
        ]
        if quotas:
            # GPUQuota refuses a pod counted for too few GPUs only where a quota of its namespace counts them.
            self.informers.append(Informer("resourcequotas", api.list_resource_quotas_all, api.watch_resource_quotas,
                                           handlers.replace_quotas, handlers.apply_quota))
        self._pods = self.informers[0]
        # Until the pod informer's first listing is in, what a decision reads of the pods is read
        # for it (scope.py).
        self.scope = ScopedReads(api, handlers.merge_pods, lambda: self.cache.pods_listed, NOT_TERMINAL,
                                 self._others_listed, self.cache.unknown_holders, self.cache.saw_gone)
        if dra:
            self.informers += [
                Informer("resourceslices", api.list_resource_slices, api.watch_resource_slices,
                         handlers.replace_slices, handlers.apply_slice, optional=True, required=dra_required),
                Informer("resourceclaims", api.list_resource_claims, api.watch_resource_claims,
                         handlers.replace_claims, handlers.apply_claim, optional=True, required=dra_required),
            ]

    @property
    def on_node(self) -> Callable[[Mapping[str, Any]], None] | None:
        """Called with each node added or changed (quotas' advertiser)."""
        return self.handlers.on_node

    @on_node.setter
    def on_node(self, offer: Callable[[Mapping[str, Any]], None] | None) -> None:
        self.handlers.on_node = offer

    def start(self) -> None:
        self.scope.start()
        for informer in self.informers:
            informer.start()

    def _others_listed(self) -> None:
        """Returns once every view but the pods' is listed (scope.py)."""
        for informer in self.informers:
            if informer is not self._pods:
                informer.synced.wait()

    def synced(self) -> bool:
        """Every view is listed whole: the pods' too."""
        return all(informer.synced.is_set() for informer in self.informers)

    def _waiting(self) -> list[Informer]:
        """The views bind cannot decide without yet: each one not listed, but the pods' once bind's
        pending pods are (scope.py: until then each decision reads its own pods)."""
        return [informer for informer in self.informers if not informer.synced.is_set()
                and (informer is not self._pods or not self.scope.pending_listed.is_set())]

    def can_place(self) -> bool:
        return not self._waiting()

    def pods_listed(self) -> bool:
        """The pod watch's first listing is in: every pod is in the view, none is read for a cycle."""
        return self.cache.pods_listed

    def cover(self, namespaces: Iterable[str]) -> None:
        """Before a cycle: its namespaces' pods read, unless every pod is listed (scope.py).
        Raises APIError."""
        for namespace in namespaces:
            self.scope.cover_namespace(namespace)

    def sync_problem(self) -> str:
        """Why the views are not listed yet, in words (readiness)."""
        waiting = self._waiting()
        problems = list(dict.fromkeys(i.problem for i in waiting if i.problem))  # one kind's missing API: said once
        return "; ".join(problems) if problems else f"listing {', '.join(i.name for i in waiting) or 'nothing'}"

    # -- reads, for placement (the cache's) ------------------------------------------------------
    def snapshot(self, node: str, claims: Iterable[tuple[str, str]] = (), namespaces: Iterable[str] = ()) -> NodeSnapshot:
        """Raises APIError: the node's pods read for it, while not every pod is listed (scope.py)."""
        self.scope.cover_node(node)
        return self.cache.snapshot(node, claims, namespaces)

    def pdbs(self, node: str) -> tuple[Mapping[str, Any], ...]:
        return self.cache.pdbs(node)

    def members_of(self, key: tuple[str, ...]) -> tuple[tuple[str, PodInfo], ...]:
        return self.cache.members_of(key)

    def pending_pod(self, uid: str) -> PendingPod | None:
        return self.cache.pending_pod(uid)

    def pending_version(self, uid: str) -> str | None:
        return self.cache.pending_version(uid)

    def assigned_node(self, uid: str) -> str | None:
        return self.cache.assigned_node(uid)

    def workload_pods(self, key: tuple[str, ...]) -> WorkloadMembers:
        return self.cache.workload_pods(key)

    def assumed(self, uid: str) -> bool:
        return self.cache.assumed(uid)

    def pending_uids(self) -> list[str]:
        return self.cache.pending_uids()

    def gone_of(self, record: Record | None) -> frozenset[str]:
        return self.cache.gone_of(record)

    def records(self) -> list[Record]:
        return self.cache.records()

    def entry_records(self) -> list:
        return self.cache.entry_records()

    # -- this instance's own placements and writes (the cache's) -----------------------------------
    def assume(self, info: PodInfo, snapshot: NodeSnapshot) -> bool:
        return self.cache.assume(info, snapshot)

    def forget(self, node: str, uid: str) -> None:
        self.cache.forget(node, uid)

    def wrote(self, lease: Mapping[str, Any]) -> None:
        self.cache.wrote(lease)

    def wrote_claim(self, claim: Mapping[str, Any]) -> None:
        self.cache.wrote_claim(claim)

    def observe_pending(self, pod: Mapping[str, Any]) -> str:
        return self.cache.observe_pending(pod)

    def remember(self, ref) -> None:
        self.cache.remember(ref)
