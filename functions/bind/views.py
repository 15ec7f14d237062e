"""bind's one view of the cluster, kept current by its watches (informers.py), as
kube-scheduler's informers keep its cache: every pod (our pending pods, to place; every node's
non-terminal pods, for fit and GPU accounting), every node (labels, taints, conditions,
allocatable), bind's device records (gpu_scheduler/records.py), PodDisruptionBudgets and, for DRA
mode (gpu_scheduler/plugins/dynamicresources/allocator.py, unless GPU_SCHEDULER_DRA=false), every
ResourceSlice and ResourceClaim. What they show is kept in the cache (cache.py). Each change that
can undo a refusal is passed to the scheduling queue as a cluster event; each pending pod of ours
found new or changed is queued. The I/O side of bind; the decisions stay in gpu_scheduler/."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from gpu_scheduler.fit import PodInfo
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.plugins.gang import WorkloadMembers
from gpu_scheduler.records import RECORD_SELECTOR, Record
from cache import Cache, Changes, PendingPod
from informers import Informer
from metrics import GPUS_HELD
from schedqueue import SchedulingQueue


class Views:
    def __init__(self, api, namespace: str, queue: SchedulingQueue, dra: bool = True,
                 admits: Callable[[Mapping[str, Any]], bool] = lambda pod: True):
        self.api, self.namespace, self.queue = api, namespace, queue
        self.admits = admits  # the framework's PreEnqueue: whether a pending pod is queued at all
        self.on_node: Callable[[Mapping[str, Any]], None] | None = None  # each node added or changed (quotas)
        self.dra = dra
        self.informers: list[Informer] = []
        # gone_of compares a record with how far the pod watch is; a snapshot says whether DRA is served
        self.cache = Cache(dra, pods_version=lambda: self.informers[0].version,
                           dra_served=lambda: all(i.served for i in self.informers if i.optional))
        self.informers = [
            Informer("pods", api.list_all_pods, api.watch_all_pods, self._replace_pods, self._apply_pod),
            Informer("nodes", api.list_nodes, api.watch_nodes, self._replace_nodes, self._apply_node),
            Informer("records", lambda: api.list_leases(namespace, RECORD_SELECTOR),
                     lambda version, seconds: api.watch_leases(namespace, RECORD_SELECTOR, version, seconds),
                     self._replace_records, self._apply_record),
            # Preemption evicts no pod a PodDisruptionBudget protects now (plugins/defaultpreemption.py).
            Informer("poddisruptionbudgets", api.list_pdbs, api.watch_pdbs, self._replace_pdbs, self._apply_pdb),
        ]
        if dra:
            self.informers += [
                Informer("resourceslices", api.list_resource_slices, api.watch_resource_slices,
                         self._replace_slices, self._apply_slice, optional=True),
                Informer("resourceclaims", api.list_resource_claims, api.watch_resource_claims,
                         self._replace_claims, self._apply_claim, optional=True),
            ]

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def sync_problem(self) -> str:
        """Why the views are not listed yet, in words (readiness)."""
        waiting = [i for i in self.informers if not i.synced.is_set()]
        problems = [i.problem for i in waiting if i.problem]
        return "; ".join(problems) if problems else f"listing {', '.join(i.name for i in waiting) or 'nothing'}"

    # -- reads, for placement (the cache's) ------------------------------------------------------
    def snapshot(self, node: str, claims: Iterable[tuple[str, str]] = ()) -> NodeSnapshot:
        return self.cache.snapshot(node, claims)

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

    # -- the informers' callbacks: into the cache, and what changed on to the queue ---------------
    def _report(self, changes: Changes) -> None:
        """Outside the cache's lock."""
        for view in changes.nodes:
            if self.on_node:
                self.on_node(view)
        for key in changes.freed:
            _ungauge(key)
        for key in changes.held:
            _gauge(key)
        for event, node in changes.events:
            self.queue.cluster_event(event, node)
        for uid in changes.forget:
            self.queue.forget(uid)
        for uid, pod in changes.pending:
            # a pod that PreEnqueue holds back (its gates) is kept, not queued; the update that
            # removes its last gate changes its fingerprint, and queues it
            if pod is None or self.admits(pod):
                self.queue.add(uid)

    def _replace_pods(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_pods(pages))

    def _apply_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_pod(kind, pod))

    def _replace_nodes(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_nodes(pages))

    def _apply_node(self, kind: str, node: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_node(kind, node))

    def _replace_records(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_records(pages))

    def _apply_record(self, kind: str, lease: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_record(kind, lease))

    def _replace_pdbs(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_pdbs(pages))

    def _apply_pdb(self, kind: str, pdb: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_pdb(kind, pdb))

    def _replace_slices(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_slices(pages))

    def _apply_slice(self, kind: str, item: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_slice(kind, item))

    def _replace_claims(self, pages: Iterable[list[dict]]) -> None:
        self._report(self.cache.replace_claims(pages))

    def _apply_claim(self, kind: str, claim: Mapping[str, Any]) -> None:
        self._report(self.cache.apply_claim(kind, claim))


_gauged: set[tuple[str, str]] = set()  # the (node, device) label pairs GPUS_HELD has


def _gauge(key: tuple[str, str]) -> None:
    GPUS_HELD.labels(*key).set(1)
    _gauged.add(key)


def _ungauge(key: tuple[str, str]) -> None:
    if key in _gauged:
        GPUS_HELD.remove(*key)
        _gauged.discard(key)
