"""bind's cache of the cluster, as kube-scheduler's (pkg/scheduler/backend/cache): the state bind's
watches show (every pod: our pending pods, to place, and every node's non-terminal pods, for fit
and GPU accounting; every node; bind's device records; PodDisruptionBudgets; with quotas on every
ResourceQuota; in DRA mode every ResourceSlice and ResourceClaim), and what this instance placed or wrote before its watches show
it (assume, forget, wrote, wrote_claim). One lock guards it all; an attempt reads a node as an
immutable snapshot taken under it.

The watches' data comes in through the mutators (replace_* for a listing, apply_* for an event),
each of which returns the Changes it made: the cluster events that may undo a refusal, the pending
pods to queue or to forget, the nodes and records seen. The cache never calls the scheduling queue:
the event handlers (eventhandlers.py) pass the changes on, after the lock is released."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import threading
from collections import OrderedDict
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import msgspec

from gpu_scheduler import SCHEDULER_NAME
from gpu_scheduler.binding import placement_input_parts
from gpu_scheduler.fit import NodeInfo, PodInfo, gang_key, is_terminal
from gpu_scheduler.framework.events import QUOTA_ADD, QUOTA_DELETE, QUOTA_UPDATE, ClusterEvent
from gpu_scheduler.plugins.dynamicresources.allocator import Device, allocated, drivers_on, node_devices
from gpu_scheduler.framework.snapshot import DraSupport, NodeSnapshot
from gpu_scheduler.plugins.gang import WorkloadMembers
from gpu_scheduler.queueing import (
    ANY_NODE, CLAIM_DELETE, CLAIM_UPDATE, NODE_ADD, NODE_UPDATE, POD_LEAVES, RECORD_FREED, RECORD_UPDATE, SLICE_ADD,
    SLICE_DELETE, SLICE_UPDATE,
)
from gpu_scheduler.quota import quota_view
from gpu_scheduler.records import EntryRecord, Record

MAX_GONE = 65536  # UIDs of deleted pods remembered (about 5 MB)
MAX_PENDING_BYTES = 16 * 1024 * 1024  # of JSON: pending pods past this are kept by name, read when placed


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def node_view(node: Mapping[str, Any]) -> dict[str, Any]:
    """The node as the plugins read it, less what changes without changing any answer (its
    heartbeats, its version) and what is large and read by none (its images, volumes and managed
    fields): a status update that changes nothing else is no event, as kube-scheduler's node
    update hints ignore heartbeats."""
    meta, status = _meta(node), node.get("status") or {}
    conditions = [{k: v for k, v in c.items() if k != "lastHeartbeatTime"}
                  for c in status.get("conditions") or [] if isinstance(c, dict)]
    kept_meta = {k: v for k, v in meta.items() if k not in ("managedFields", "resourceVersion")}
    kept_status = {k: v for k, v in status.items() if k not in ("images", "volumesAttached", "volumesInUse")}
    return {**{k: v for k, v in node.items() if k not in ("metadata", "status")}, "metadata": kept_meta,
            "status": {**kept_status, "conditions": conditions}}


# Keys sorted, as json.dumps(sort_keys=True) sorts them, at a third of its cost: a listing
# fingerprints every pending pod (2,500 with 500-entry maps: 0.13 s of a cold start, issue 53).
_FINGERPRINT_ENCODER = msgspec.json.Encoder(order="sorted", enc_hook=str)


def _placement_fingerprint(pod: Mapping[str, Any]) -> bytes:
    """What can change a pending pod's placement (placement_input_parts), as a digest to compare."""
    return hashlib.sha256(_FINGERPRINT_ENCODER.encode(placement_input_parts(pod))).digest()


def _is_pending_ours(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (spec.get("schedulerName") == SCHEDULER_NAME and not spec.get("nodeName")
            and not _meta(pod).get("deletionTimestamp") and not is_terminal(pod))


@dataclasses.dataclass(frozen=True)
class PendingPod:
    """A pending pod of ours as the cache keeps it: the pod as last seen (None: kept by name only,
    past the memory bound or named by an event that could not be read), and what it is."""

    namespace: str
    name: str
    pod: Mapping[str, Any] | None = None
    fingerprint: bytes = b""  # what can change its placement (_placement_fingerprint): a new one queues it
    size: int = 0  # its JSON's bytes, counted against MAX_PENDING_BYTES while kept


@dataclasses.dataclass(frozen=True)
class Changes:
    """What one listing or watch event changed, as the world outside the cache needs to hear it
    (the event handlers pass it on, in this order: nodes, records, events, forget, pending)."""

    nodes: tuple[Mapping[str, Any], ...] = ()  # each node added or changed, as node_view makes it (quotas)
    held: tuple[tuple[str, str], ...] = ()  # (node, device) of each record seen (the GPUS_HELD gauge)
    freed: tuple[tuple[str, str], ...] = ()  # (node, device) of each record gone
    events: tuple[tuple[ClusterEvent, str], ...] = ()  # (event, node), in order: each may undo a refusal
    forget: tuple[str, ...] = ()  # uids of pending pods no longer pending (bound, deleted, not ours)
    # (uid, pod) of each pending pod found new or changed, to queue if PreEnqueue admits the pod; its
    # pod None: kept by name only (past the memory bound), queued as it is
    pending: tuple[tuple[str, Mapping[str, Any] | None], ...] = ()


NOTHING = Changes()


def _devices_of(slices: Iterable[Mapping[str, Any]]) -> list[Device]:
    """Every device the slices publish (all of one node)."""
    slices = list(slices)
    nodes = {str((s.get("spec") or {}).get("nodeName")) for s in slices}
    return [device for node in nodes for driver in drivers_on(slices, node)
            for device, _ in node_devices(slices, node, driver)]


def _trim_claim(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = _meta(claim)
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return claim


class Cache:
    """`pods_version`: the resourceVersion the pod watch is at (gone_of); `dra_served`: whether the
    API server serves DRA's kinds (snapshots say it); both read under the lock."""

    def __init__(self, dra: bool = True, pods_version: Callable[[], str] = lambda: "",
                 dra_served: Callable[[], bool] = lambda: True, quotas: bool = False):
        self.dra, self._pods_version, self._dra_served = dra, pods_version, dra_served
        self.quotas = quotas  # ResourceQuotas watched (GPU_SCHEDULER_QUOTA): snapshots carry them
        self._lock = threading.Lock()
        self._nodes: dict[str, dict] = {}
        self._pods_on: dict[str, dict[str, PodInfo]] = {}  # node -> uid -> pod
        self._listed: dict[str, NodeInfo] = {}  # node -> its pods as a NodeInfo
        self._node_of: dict[str, str] = {}  # uid -> node, for assigned pods
        # uid -> _accounted(pod) of an assigned pod as last taken from its watch: a status update
        # that changes nothing PodInfo reads (most updates of pods bound elsewhere) is skipped
        # without working out its PodInfo again. Kept with _node_of; emptied by a listing.
        self._accounted_as: dict[str, int] = {}
        self._assumed: dict[str, dict[str, PodInfo]] = {}  # node -> uid -> pod this instance is placing
        self._pending: dict[str, PendingPod] = {}
        self._pending_bytes = 0
        # The pod watch's first listing is in (replace_pods); until then the pods held are those of
        # the scoped listings (merge_pods) only.
        self._pods_listed = False
        # Pod groups (the Gang plugin's WorkloadPods), by fit.gang_key (a workload, or one group of a
        # LeaderWorkerSet): group -> the uids of its pending pods, and group -> uid -> namespace/name
        # of its assigned pods (bound members count), kept with _pending and _pods_on: a group's
        # attempt looks up its own pods, not every pod.
        self._workload_pending: dict[tuple[str, ...], dict[str, None]] = {}
        self._assigned_of: dict[tuple[str, ...], dict[str, str]] = {}
        self._records: dict[tuple[str, str], Record] = {}
        self._records_on: dict[str, dict[str, Record]] = {}  # node -> device -> record, kept with _records
        # Pool entries' records (plugins/poolentry.py): Lease name -> record, and node -> (workload
        # key, entry) -> record, kept together.
        self._entry_records: dict[str, EntryRecord] = {}
        self._entries_on: dict[str, dict[tuple[str, int], EntryRecord]] = {}
        # node -> a number that changes with every change of the node, its pods (assumed ones too),
        # its records or its slices: an attempt assumes its pod only on the node it decided on.
        self._generation: dict[str, int] = {}
        # Pods seen deleted, most recent last: a record written for one of them holds nothing.
        self.gone: OrderedDict[str, None] = OrderedDict()
        # Preemption evicts no pod a PodDisruptionBudget protects now (plugins/defaultpreemption.py).
        self._pdbs: dict[str, dict[str, Mapping[str, Any]]] = {}  # namespace -> name -> budget
        # GPUQuota refuses a pod counted for too few GPUs only where a quota counts them (quota_view).
        self._quotas: dict[str, dict[str, Mapping[str, Any]]] = {}  # namespace -> name -> quota
        # node -> slice name -> spec: a placement reads its node's slices only. Slices published for
        # no single node (spec.nodeName unset) are not kept: DRA mode matches a node's own.
        self._slices: dict[str, dict[str, Mapping[str, Any]]] = {}
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}  # (namespace, name) -> claim
        # Every allocated device and the claims it is allocated in, kept with _claims: a placement
        # looks up its devices, rather than going through every claim of the cluster.
        self._held: dict[Device, dict[str, None]] = {}

    # -- reads, for placement ---------------------------------------------------------------
    def snapshot(self, node: str, claims: Iterable[tuple[str, str]] = (),
                 namespaces: Iterable[str] = ()) -> NodeSnapshot:
        """The node as one attempt decides on it: immutable, taken under the lock at once, read
        outside it. Its pods include those this instance is binding there (assumed); `claims`: the
        (namespace, name) of the claims the pod's attempt reads; `namespaces`: those of its pods,
        whose ResourceQuotas it carries (where they are watched)."""
        with self._lock:
            quotas = MappingProxyType({namespace: tuple(self._quotas.get(namespace, {}).values())
                                       for namespace in namespaces}) if self.quotas else None
            records = dict(self._records_on.get(node, {}))
            entries = dict(self._entries_on.get(node, {}))
            slices = tuple({"spec": spec} for spec in self._slices.get(node, {}).values())
            held = {device: next(iter(self._held[device])) for device in _devices_of(slices)
                    if self._held.get(device)}
            return NodeSnapshot(
                name=node, node=self._nodes.get(node), info=self._node_info(node),
                records=MappingProxyType(records), gone=frozenset(uid for r in records.values()
                                                                  for uid in self._gone_of(r)) |
                frozenset(r.nominee_uid for r in records.values() if r.nominee_uid in self.gone) |  # a preemptor deleted
                frozenset(uid for r in entries.values() for uid in self._gone_of(r)),
                now=time.time(), slices=slices, held=MappingProxyType(held),
                claims=MappingProxyType({key: self._claims[key] for key in claims if key in self._claims}),
                dra=self._dra_support(),
                generation=self._generation.get(node, 0), quotas=quotas, entries=MappingProxyType(entries))

    def pdbs(self, node: str) -> tuple[Mapping[str, Any], ...]:
        """The PodDisruptionBudgets of the namespaces that pods on `node` are in."""
        with self._lock:
            namespaces = {info.name.split("/", 1)[0] for info in self._pods_on.get(node, {}).values()}
            return tuple(pdb for namespace in namespaces for pdb in self._pdbs.get(namespace, {}).values())

    def members_of(self, key: tuple[str, ...]) -> tuple[tuple[str, PodInfo], ...]:
        """(node, pod) of each bound pod of the group `key` (fit.gang_key: a gang's members, for preemption)."""
        with self._lock:
            return tuple((self._node_of[uid], self._pods_on[self._node_of[uid]][uid])
                         for uid in self._assigned_of.get(key, {}) if uid in self._node_of)

    def pending_pod(self, uid: str) -> PendingPod | None:
        with self._lock:
            return self._pending.get(uid)

    def pending_version(self, uid: str) -> str | None:
        with self._lock:
            entry = self._pending.get(uid)
            return str(_meta(entry.pod).get("resourceVersion") or "") if entry and entry.pod else None

    def assigned_node(self, uid: str) -> str | None:
        with self._lock:
            return self._node_of.get(uid)

    def workload_pods(self, key: tuple[str, ...]) -> WorkloadMembers:
        """The pods of group `key` (fit.gang_key) as this instance sees them: its pending pods (those this
        instance has bound and the watch not yet shown count as bound), and its bound ones."""
        with self._lock:
            assumed = {uid for pods in self._assumed.values() for uid in pods}
            pending = [self._pending[uid].pod for uid in self._workload_pending.get(key, ())
                       if uid not in assumed and self._pending[uid].pod is not None]
            bound = list(self._assigned_of.get(key, {}).values())
            bound += [f"{p.get('metadata', {}).get('namespace')}/{p.get('metadata', {}).get('name')}"
                      for uid in self._workload_pending.get(key, ()) if uid in assumed
                      for p in (self._pending[uid].pod,) if p is not None]
        return WorkloadMembers(pending, bound)

    def assumed(self, uid: str) -> bool:
        """This instance is binding the pod, or has bound it and the watch has not shown it yet."""
        with self._lock:
            return any(uid in pods for pods in self._assumed.values())

    def pending_uids(self) -> list[str]:
        with self._lock:
            return list(self._pending)

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records.values())

    def entry_records(self) -> list[EntryRecord]:
        with self._lock:
            return list(self._entry_records.values())

    def _node_info(self, node: str) -> NodeInfo:
        """Inside the lock: the node's pods as watched, plus those this instance is placing."""
        view = self._listed.get(node, NodeInfo())
        for uid, info in self._assumed.get(node, {}).items():
            if uid not in view.uids:
                view = view.plus(info)
        return view

    def _changed(self, node: str) -> None:
        """Inside the lock: the node, its pods, records or slices changed."""
        self._generation[node] = self._generation.get(node, 0) + 1

    def gone_of(self, record: Record | EntryRecord | None) -> frozenset[str]:
        with self._lock:
            return self._gone_of(record)

    def _gone_of(self, record: Record | EntryRecord | None) -> frozenset[str]:
        """Inside the lock: {the UID of the pod `record` was last written for} when this view knows
        that pod is gone, else nothing: seen deleted, or absent from a pod view that is past the
        record's own version (the pod was created before its record was written, so a view that far
        along holds it unless it is gone). A fresh instance thus frees at once the records of pods
        deleted before it started. resourceVersions are compared as etcd revisions, one counter for
        pods and Leases alike; where they are not numbers, only deletions seen count."""
        if record is None or not record.last_uid:
            return frozenset()
        uid = record.last_uid
        if uid in self.gone:
            return frozenset({uid})
        if uid in self._pending or uid in self._node_of:
            return frozenset()
        seen_since = _newer(self._pods_version(), record.resource_version, or_equal=True)
        return frozenset({uid}) if seen_since else frozenset()

    def _dra_support(self) -> DraSupport:
        if not self.dra:
            return DraSupport.OFF
        return DraSupport.SERVED if self._dra_served() else DraSupport.NOT_SERVED

    # -- this instance's own placements and writes ------------------------------------------------
    def assume(self, info: PodInfo, snapshot: NodeSnapshot) -> bool:
        """Count the pod on the node until the watch shows it there, if the node is still as the
        attempt's snapshot saw it; False: it changed since, decide again (kube-scheduler's cache
        generation), so two attempts of this instance never count the same free cpu or GPU twice."""
        with self._lock:
            if self._generation.get(snapshot.name, 0) != snapshot.generation:
                return False
            self._assumed.setdefault(snapshot.name, {})[info.uid] = info
            self._changed(snapshot.name)
            return True

    def forget(self, node: str, uid: str) -> None:
        with self._lock:
            if self._assumed.get(node, {}).pop(uid, None) is not None:
                self._changed(node)

    def wrote(self, lease: Mapping[str, Any]) -> None:
        """A record this instance just wrote or read: seen at once, before its watch event."""
        record = Record.of(lease)
        if record is not None:
            with self._lock:
                known = self._records.get((record.node, record.device))
                if known is None or _newer(record.resource_version, known.resource_version):
                    self._set_record(record)
            return
        entry = EntryRecord.of(lease)
        if entry is not None:
            with self._lock:
                known_entry = self._entry_records.get(entry.name)
                if known_entry is None or _newer(entry.resource_version, known_entry.resource_version):
                    self._set_entry(entry)

    def wrote_claim(self, claim: Mapping[str, Any]) -> None:
        """A claim this instance just wrote or read: seen at once, before its watch event."""
        with self._lock:
            self._keep_claim(claim, from_watch=False)

    def observe_pending(self, pod: Mapping[str, Any]) -> str:
        """A pending pod of ours seen outside the watch (an event's GET, a resync's listing)."""
        uid = str(_meta(pod).get("uid") or "")
        with self._lock:
            if uid not in self._pending and uid not in self._node_of:
                self._put_pending(uid, pod, _size(pod))
        return uid

    def remember(self, ref) -> None:
        """A pod an event named that could not be read (the API server is down): kept by name, so
        the queue can read and place it once the API server answers; a listing replaces it."""
        with self._lock:
            if ref.uid not in self._pending and ref.uid not in self._node_of:
                self._pending[ref.uid] = PendingPod(ref.namespace, ref.name)

    # -- pods ------------------------------------------------------------------------------
    def merge_pods(self, pages: Iterable[list[dict]]) -> Changes:
        """A scoped listing (scope.py: the pods of one node, of one namespace, or bind's pending
        pods), read before the pod watch's first listing is in: its pods added to what the cache
        holds. Nothing once that listing is in: it is the whole truth, and a scoped listing read
        before it would only be older."""
        assigned: list[tuple[str, str, PodInfo]] = []
        pending: list[tuple[str, Mapping[str, Any]]] = []
        for items in pages:
            for pod in items:
                uid, node = str(_meta(pod).get("uid") or ""), (pod.get("spec") or {}).get("nodeName")
                if node:
                    if not is_terminal(pod):
                        assigned.append((node, uid, PodInfo.of(pod)))
                elif _is_pending_ours(pod):
                    pending.append((uid, pod))
        queued = []
        with self._lock:
            if self._pods_listed:
                return NOTHING
            for node, uid, info in assigned:
                if self._node_of.get(uid) in (None, node):
                    self._drop_pending(uid)
                    self._put_assigned(node, uid, info)
            for uid, pod in pending:
                if uid not in self._pending and uid not in self._node_of:
                    self._put_pending(uid, pod)
                    queued.append((uid, pod))
        return Changes(pending=tuple(queued))

    def unknown_holders(self, node: str) -> list[tuple[str, str]]:
        """(namespace/name, uid) of each pod a record on `node` was last written for that this view
        holds neither pending nor on a node nor seen gone: before the whole pod listing is in, the
        pod may be anywhere or gone (scope.py reads it)."""
        with self._lock:
            records = [*self._records_on.get(node, {}).values(), *self._entries_on.get(node, {}).values()]
            return list(dict.fromkeys((r.last_pod, r.last_uid) for r in records
                                      if r.last_uid and r.last_uid not in self.gone
                                      and r.last_uid not in self._pending and r.last_uid not in self._node_of))

    def saw_gone(self, uid: str, node: str) -> None:
        """The pod `uid`, named by a record on `node`, was read and is gone (scope.py): as if its
        deletion had been watched."""
        with self._lock:
            self._saw_deleted(uid)
            self._changed(node)

    @property
    def pods_listed(self) -> bool:
        """The pod watch's first listing is in: the cache holds every pod."""
        return self._pods_listed

    def replace_pods(self, pages: Iterable[list[dict]]) -> Changes:
        pods_on: dict[str, dict[str, PodInfo]] = {}
        pending: dict[str, PendingPod] = {}
        pending_bytes = 0
        for items in pages:
            for pod in items:
                uid, node = str(_meta(pod).get("uid") or ""), (pod.get("spec") or {}).get("nodeName")
                if node:
                    if not is_terminal(pod):  # a pod being deleted holds its node until it is gone
                        pods_on.setdefault(node, {})[uid] = PodInfo.of(pod)
                elif _is_pending_ours(pod):
                    size = _size(pod)
                    kept = _trim(pod) if pending_bytes + size <= MAX_PENDING_BYTES else None
                    pending_bytes += size if kept is not None else 0
                    pending[uid] = PendingPod(*_name(pod), kept, _placement_fingerprint(pod), size if kept is not None else 0)
        with self._lock:
            self._pods_listed = True
            left = {uid: node for uid, node in self._node_of.items()
                    if uid not in pods_on.get(node, {})}
            gone_pending = [uid for uid in self._pending if uid not in pending]
            for node in set(self._pods_on) | set(pods_on):
                self._changed(node)
            self._pods_on = pods_on
            self._listed = {node: NodeInfo.of(pods.values()) for node, pods in pods_on.items()}
            self._node_of = {uid: node for node, pods in pods_on.items() for uid in pods}
            self._accounted_as = {}
            for node, assumed in self._assumed.items():
                for uid in [uid for uid in assumed if uid in self._node_of]:
                    del assumed[uid]
            self._pending, self._pending_bytes = pending, pending_bytes
            self._workload_pending, self._assigned_of = {}, {}
            for uid, entry in pending.items():
                self._index_pending(uid, entry)
            for pods in pods_on.values():
                for uid, info in pods.items():
                    self._assigned_of.setdefault(info.group, {})[uid] = info.name
        # a listing finds every pending pod: each is tried again
        return Changes(events=tuple((POD_LEAVES, node) for node in left.values()), forget=tuple(gone_pending),
                       pending=tuple((uid, entry.pod) for uid, entry in pending.items()))

    def apply_pod(self, kind: str, pod: Mapping[str, Any]) -> Changes:
        meta = _meta(pod)
        uid, node = str(meta.get("uid") or ""), (pod.get("spec") or {}).get("nodeName")
        left_node = None
        queue_it = forget_it = False
        accounted = _accounted(pod) if node and kind != "DELETED" else None
        with self._lock:
            if (accounted is not None and self._accounted_as.get(uid) == accounted and self._node_of.get(uid) == node
                    and uid not in self._pending):
                return NOTHING  # a status update of a pod bound there: nothing bind counts changed
            if kind == "DELETED" or (node and is_terminal(pod)):
                left_node = self._remove_assigned(uid)
                forget_it = self._drop_pending(uid)
                if kind == "DELETED":
                    self._saw_deleted(uid)
                    if left_node is None:  # a pending pod: the records written for it hold nothing now
                        left_node = next((r.node for r in self._records.values() if r.last_uid == uid), None)
            elif node:
                forget_it = self._drop_pending(uid)
                before = self._node_of.get(uid)
                if before is not None and before != node:
                    left_node = self._remove_assigned(uid)
                self._put_assigned(node, uid, PodInfo.of(pod))
                if accounted is not None:
                    self._accounted_as[uid] = accounted
            elif _is_pending_ours(pod):
                entry = self._pending.get(uid)
                fingerprint = _placement_fingerprint(pod)
                # a pod that PreEnqueue holds back (its gates) is kept, and not queued (the event
                # handlers ask); the update that removes its last gate changes its fingerprint
                queue_it = entry is None or entry.fingerprint != fingerprint
                self._put_pending(uid, pod, 0, fingerprint)
            else:
                forget_it = self._drop_pending(uid)
        return Changes(events=((POD_LEAVES, left_node),) if left_node is not None else (),
                       forget=(uid,) if forget_it else (), pending=((uid, pod),) if queue_it else ())

    def _saw_deleted(self, uid: str) -> None:
        self.gone[uid] = None
        while len(self.gone) > MAX_GONE:
            self.gone.popitem(last=False)

    def _put_pending(self, uid: str, pod: Mapping[str, Any], size: int = 0, fingerprint: bytes = b"") -> None:
        size = size or _size(pod)
        self._drop_pending(uid)
        kept = _trim(pod) if self._pending_bytes + size <= MAX_PENDING_BYTES else None
        if kept is not None:
            self._pending_bytes += size
        self._pending[uid] = PendingPod(*_name(pod), kept, fingerprint or _placement_fingerprint(pod),
                                        size if kept is not None else 0)
        self._index_pending(uid, self._pending[uid])

    def _index_pending(self, uid: str, entry: PendingPod) -> None:
        """Inside the lock: a pending pod, under its group (fit.gang_key)."""
        if entry.pod is not None:
            self._workload_pending.setdefault(gang_key(entry.pod), {})[uid] = None

    def _drop_pending(self, uid: str) -> bool:
        entry = self._pending.pop(uid, None)
        if entry is not None:
            self._pending_bytes -= entry.size
            if entry.pod is not None:
                key = gang_key(entry.pod)
                members = self._workload_pending.get(key)
                if members is not None and members.pop(uid, 0) is None and not members:
                    del self._workload_pending[key]
        return entry is not None

    def _put_assigned(self, node: str, uid: str, info: PodInfo) -> None:
        pods = self._pods_on.setdefault(node, {})
        before = pods.get(uid)
        if before == info:
            return
        pods[uid] = info
        self._node_of[uid] = node
        self._assigned_of.setdefault(info.group, {})[uid] = info.name
        # A pod added is one more; a changed one means summing again (rare: resizes).
        self._listed[node] = (self._listed.get(node, NodeInfo()).plus(info) if before is None
                              else NodeInfo.of(pods.values()))
        self._assumed.get(node, {}).pop(uid, None)  # shown: no longer assumed
        self._changed(node)

    def _remove_assigned(self, uid: str) -> str | None:
        self._accounted_as.pop(uid, None)
        node = self._node_of.pop(uid, None)
        if node is None:
            return None
        pods = self._pods_on.get(node, {})
        info = pods.pop(uid, None)
        if info is not None:
            of = self._assigned_of.get(info.group, {})
            of.pop(uid, None)
            if not of:
                self._assigned_of.pop(info.group, None)
        self._listed[node] = NodeInfo.of(pods.values())
        self._assumed.get(node, {}).pop(uid, None)
        self._changed(node)
        return node

    # -- nodes -----------------------------------------------------------------------------
    def replace_nodes(self, pages: Iterable[list[dict]]) -> Changes:
        nodes = {str(_meta(n).get("name")): node_view(n) for items in pages for n in items}
        with self._lock:
            changed = [name for name, node in nodes.items() if self._nodes.get(name) != node]
            for name in changed + [name for name in self._nodes if name not in nodes]:
                self._changed(name)
            self._nodes = nodes
        return Changes(nodes=tuple(nodes[name] for name in changed),
                       events=tuple(event for name in changed for event in ((NODE_ADD, name), (NODE_UPDATE, name))))

    def apply_node(self, kind: str, node: Mapping[str, Any]) -> Changes:
        name = str(_meta(node).get("name"))
        view = node_view(node)
        with self._lock:
            before = self._nodes.get(name)
            if kind == "DELETED":
                self._nodes.pop(name, None)
                self._changed(name)
                return NOTHING
            if before == view:
                return NOTHING
            self._nodes[name] = view
            self._changed(name)
        return Changes(nodes=(view,), events=((NODE_ADD if before is None else NODE_UPDATE, name),))

    # -- device records ----------------------------------------------------------------------
    def replace_records(self, pages: Iterable[list[dict]]) -> Changes:
        records, entries = {}, {}
        for items in pages:
            for lease in items:
                record = Record.of(lease)
                if record is not None:
                    records[(record.node, record.device)] = record
                    continue
                entry = EntryRecord.of(lease)
                if entry is not None:
                    entries[entry.name] = entry
        with self._lock:
            freed = [key for key in self._records if key not in records]
            freed_entries = {e.node for name, e in self._entry_records.items() if name not in entries}
            for node in {key[0] for key in self._records} | {key[0] for key in records}:
                self._changed(node)
            for node in {e.node for e in self._entry_records.values()} | {e.node for e in entries.values()}:
                self._changed(node)
            self._entry_records, self._entries_on = {}, {}
            for entry in entries.values():
                self._set_entry(entry)
            self._records = records
            self._records_on = {}
            for (node, device), record in records.items():
                self._records_on.setdefault(node, {})[device] = record
        return Changes(freed=tuple(freed), held=tuple(records),
                       events=tuple((RECORD_FREED, key[0]) for key in freed) +
                       tuple((RECORD_FREED, node) for node in sorted(freed_entries)))

    def apply_record(self, kind: str, lease: Mapping[str, Any]) -> Changes:
        record = Record.of(lease)
        if record is None:
            return self._apply_entry(kind, lease)
        key = (record.node, record.device)
        with self._lock:
            if kind == "DELETED":
                self._drop_record(key)
            else:
                known = self._records.get(key)
                if known is None or not _newer(known.resource_version, record.resource_version):
                    self._set_record(record)
        if kind == "DELETED":
            return Changes(freed=(key,), events=((RECORD_FREED, record.node),))
        return Changes(held=(key,), events=((RECORD_UPDATE, record.node),))

    def _apply_entry(self, kind: str, lease: Mapping[str, Any]) -> Changes:
        """A pool entry's record added, changed or deleted (the same watch as the devices')."""
        entry = EntryRecord.of(lease)
        if entry is None:
            return NOTHING
        with self._lock:
            known = self._entry_records.get(entry.name)
            if kind == "DELETED":
                if known is not None:
                    self._drop_entry(known)
            elif known is None or not _newer(known.resource_version, entry.resource_version):
                if known is not None and known.node != entry.node:
                    self._drop_entry(known)
                self._set_entry(entry)
        return Changes(events=((RECORD_FREED if kind == "DELETED" else RECORD_UPDATE, entry.node),))

    def _set_entry(self, entry: EntryRecord) -> None:
        """Inside the lock."""
        self._entry_records[entry.name] = entry
        self._entries_on.setdefault(entry.node, {})[(entry.pool, entry.entry)] = entry
        self._changed(entry.node)

    def _drop_entry(self, entry: EntryRecord) -> None:
        """Inside the lock."""
        self._entry_records.pop(entry.name, None)
        self._entries_on.get(entry.node, {}).pop((entry.pool, entry.entry), None)
        self._changed(entry.node)

    def _set_record(self, record: Record) -> None:
        """Inside the lock."""
        self._records[(record.node, record.device)] = record
        self._records_on.setdefault(record.node, {})[record.device] = record
        self._changed(record.node)

    def _drop_record(self, key: tuple[str, str]) -> None:
        """Inside the lock."""
        if self._records.pop(key, None) is not None:
            self._records_on.get(key[0], {}).pop(key[1], None)
            self._changed(key[0])

    # -- PodDisruptionBudgets ------------------------------------------------------------------
    def replace_pdbs(self, pages: Iterable[list[dict]]) -> Changes:
        pdbs: dict[str, dict[str, Mapping[str, Any]]] = {}
        for items in pages:
            for pdb in items:
                namespace, name = _name(pdb)
                pdbs.setdefault(namespace, {})[name] = _trim(pdb)
        with self._lock:
            self._pdbs = pdbs
        return NOTHING  # a budget undoes no refusal: preemption reads it when it runs

    def apply_pdb(self, kind: str, pdb: Mapping[str, Any]) -> Changes:
        namespace, name = _name(pdb)
        with self._lock:
            if kind == "DELETED":
                self._pdbs.get(namespace, {}).pop(name, None)
            else:
                self._pdbs.setdefault(namespace, {})[name] = _trim(pdb)
        return NOTHING

    # -- ResourceQuotas ------------------------------------------------------------------------
    def replace_quotas(self, pages: Iterable[list[dict]]) -> Changes:
        quotas: dict[str, dict[str, Mapping[str, Any]]] = {}
        for items in pages:
            for quota in items:
                namespace, name = _name(quota)
                quotas.setdefault(namespace, {})[name] = quota_view(quota)
        with self._lock:
            changed, self._quotas = quotas != self._quotas, quotas
        # what changed unseen is not known: any of the three may have
        return Changes(events=((QUOTA_ADD, ANY_NODE), (QUOTA_UPDATE, ANY_NODE), (QUOTA_DELETE, ANY_NODE))) \
            if changed else NOTHING

    def apply_quota(self, kind: str, quota: Mapping[str, Any]) -> Changes:
        """A quota's use (its status) changes with every pod of its namespace created or deleted:
        no event, only a change of what it counts (its spec) is one."""
        namespace, name = _name(quota)
        with self._lock:
            known = self._quotas.get(namespace, {})
            before = known.get(name)
            if kind == "DELETED":
                known.pop(name, None)
                if not known:
                    self._quotas.pop(namespace, None)
                return Changes(events=((QUOTA_DELETE, ANY_NODE),)) if before is not None else NOTHING
            view = quota_view(quota)
            if view == before:
                return NOTHING
            self._quotas.setdefault(namespace, {})[name] = view
        return Changes(events=(((QUOTA_ADD if before is None else QUOTA_UPDATE), ANY_NODE),))

    # -- DRA ---------------------------------------------------------------------------------
    def _set_claim(self, key: tuple[str, str], claim: Mapping[str, Any] | None) -> None:
        """Inside self._lock: `claim` (None: deleted) under `key`, and the held index with it."""
        before = self._claims.get(key)
        name = f"{key[0]}/{key[1]}"
        for device in allocated([before] if before is not None else []):
            holders = self._held.get(device, {})
            holders.pop(name, None)
            if not holders:
                self._held.pop(device, None)
        if claim is None:
            self._claims.pop(key, None)
            return
        self._claims[key] = claim
        for device in allocated([claim]):
            self._held.setdefault(device, {})[name] = None

    def _keep_claim(self, claim: Mapping[str, Any], from_watch: bool) -> None:
        """Inside self._lock: `claim` in the view, unless the view holds a newer copy. A watch's copy
        yields only to a newer one this instance wrote; a written or read copy must be newer."""
        key = _name(claim)
        known = self._claims.get(key)
        if known is not None:
            version, known_version = (str(_meta(c).get("resourceVersion") or "") for c in (claim, known))
            stale = _newer(known_version, version) if from_watch else not _newer(version, known_version)
            if stale:
                return
        self._set_claim(key, _trim_claim(claim))

    def replace_slices(self, pages: Iterable[list[dict]]) -> Changes:
        slices: dict[str, dict[str, Mapping[str, Any]]] = {}
        for items in pages:
            for item in items:
                spec = item.get("spec") or {}
                if spec.get("nodeName"):
                    slices.setdefault(spec["nodeName"], {})[str(_meta(item).get("name"))] = spec
        with self._lock:
            before, self._slices = self._slices, slices
            for node in set(before) | set(slices):
                self._changed(node)
        events: list[tuple[ClusterEvent, str]] = []
        for node in set(before) | set(slices):
            now, then = slices.get(node, {}), before.get(node, {})
            if any(then.get(name) != spec for name, spec in now.items()):
                events.append((SLICE_UPDATE, node))
            if any(name not in now for name in then):
                events.append((SLICE_DELETE, node))
        return Changes(events=tuple(events))

    def apply_slice(self, kind: str, item: Mapping[str, Any]) -> Changes:
        name, spec = str(_meta(item).get("name")), item.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            return NOTHING
        with self._lock:
            if kind == "DELETED":
                self._slices.get(node, {}).pop(name, None)
            else:
                self._slices.setdefault(node, {})[name] = spec
            self._changed(node)
        event = {"ADDED": SLICE_ADD, "DELETED": SLICE_DELETE}.get(kind, SLICE_UPDATE)
        return Changes(events=((event, node),))

    def replace_claims(self, pages: Iterable[list[dict]]) -> Changes:
        claims = {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): _trim_claim(c)
                  for items in pages for c in items}
        with self._lock:
            self._claims, self._held = {}, {}
            for key, claim in claims.items():
                self._set_claim(key, claim)
        # what changed unseen is not known: all may
        return Changes(events=((CLAIM_UPDATE, ANY_NODE), (CLAIM_DELETE, ANY_NODE)))

    def apply_claim(self, kind: str, claim: Mapping[str, Any]) -> Changes:
        with self._lock:
            if kind == "DELETED":
                self._set_claim(_name(claim), None)
            else:  # the watch's copy, unless this instance already holds a newer one it wrote
                self._keep_claim(claim, from_watch=True)
        if kind == "DELETED":
            return Changes(events=((CLAIM_DELETE, ANY_NODE),))
        if kind == "MODIFIED":
            return Changes(events=((CLAIM_UPDATE, ANY_NODE),))
        return NOTHING


def _newer(a: str, b: str, or_equal: bool = False) -> bool:
    """resourceVersion a after b. Opaque by contract; etcd's revision numbers in every API server
    there is: compared to keep the newer of two copies of one record (the precondition of the next
    write settles any doubt), and to know a view is past a record (gone_of)."""
    try:
        return int(a) >= int(b) if or_equal else int(a) > int(b)
    except ValueError:
        return False


def _trim(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = _meta(pod)
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return pod


def _accounted(pod: Mapping[str, Any]) -> int | None:
    """A fingerprint of what PodInfo.of and is_terminal read of an assigned pod: its metadata but
    for its resourceVersion, its spec, its phase and start time (not the rest of its status, which
    its kubelet rewrites). Python's hash of the encoded bytes: 64 bits of SipHash, compared only
    with the same pod's previous fingerprint. None (always worked out again) for what msgspec does
    not encode."""
    meta, status = _meta(pod), pod.get("status") or {}
    try:
        return hash((msgspec.json.encode({k: v for k, v in meta.items() if k != "resourceVersion"}),
                     msgspec.json.encode(pod.get("spec")), str(status.get("phase")), str(status.get("startTime"))))
    except (TypeError, AttributeError):
        return None


def _size(pod: Mapping[str, Any]) -> int:
    """Its JSON's length: what MAX_PENDING_BYTES counts (msgspec's encoder: an eighth of
    json.dumps's CPU; json for a mapping that is not a dict, which msgspec does not encode)."""
    try:
        return len(msgspec.json.encode(pod))
    except TypeError:
        return len(json.dumps(pod, default=str))


def _name(pod: Mapping[str, Any]) -> tuple[str, str]:
    return str(_meta(pod).get("namespace") or ""), str(_meta(pod).get("name") or "")
