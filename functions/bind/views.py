"""bind's one view of the cluster, kept current by its watches (informers.py), as
kube-scheduler's informers keep its cache: every pod (our pending pods, to place; every node's
non-terminal pods, for fit and GPU accounting), every node (labels, taints, conditions,
allocatable), bind's device records (gpu_scheduler/records.py) and, for DRA mode
(gpu_scheduler/dra.py, unless GPU_SCHEDULER_DRA=false), every ResourceSlice and ResourceClaim.
Each change that can undo a
refusal is passed to the scheduling queue as a cluster event; each pending pod of ours found new or
changed is queued. The I/O side of bind; the decisions stay in gpu_scheduler/."""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict, abc
from typing import Any, Iterable, Mapping

from gpu_scheduler import SCHEDULER_NAME
from gpu_scheduler.fit import NodeInfo, PodInfo, is_terminal
from gpu_scheduler.dra import Device, allocated
from gpu_scheduler.queueing import (
    ANY_NODE, CLAIM_DELETE, CLAIM_UPDATE, NODE_ADD, NODE_UPDATE, POD_LEAVES, RECORD_FREED, RECORD_UPDATE, SLICE_ADD,
    SLICE_DELETE, SLICE_UPDATE,
)
from gpu_scheduler.records import RECORD_SELECTOR, Record
from informers import Informer
from metrics import GPUS_HELD
from schedqueue import SchedulingQueue

MAX_GONE = 65536  # UIDs of deleted pods remembered (about 5 MB)
MAX_PENDING_BYTES = 16 * 1024 * 1024  # of JSON: pending pods past this are kept by name, read when placed


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def node_view(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the checks read of a node, without heartbeats: a status update that changes nothing
    else is no event (kube-scheduler's node update hints look at the same fields)."""
    meta, spec, status = _meta(node), node.get("spec") or {}, node.get("status") or {}
    conditions = [{k: v for k, v in c.items() if k not in ("lastHeartbeatTime",)}
                  for c in status.get("conditions") or [] if isinstance(c, dict)]
    return {"metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}},
            "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
            "status": {"conditions": conditions, "capacity": status.get("capacity") or {},
                       "allocatable": status.get("allocatable") or {}}}


def _placement_fingerprint(pod: Mapping[str, Any]) -> str:
    """What can change a pending pod's placement: its spec, labels and annotations (not its status,
    which bind writes itself)."""
    meta = _meta(pod)
    text = json.dumps([pod.get("spec"), meta.get("labels"), meta.get("annotations")], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _is_pending_ours(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (spec.get("schedulerName") == SCHEDULER_NAME and not spec.get("nodeName")
            and not _meta(pod).get("deletionTimestamp") and not is_terminal(pod))


class _Held(abc.Mapping):
    """The held index as gpu_scheduler.dra.wanted_devices reads it: device -> a claim's name."""

    def __init__(self, index: dict[Device, dict[str, None]]):
        self._index = index

    def __getitem__(self, device: Device) -> str:
        holders = self._index.get(device)
        if not holders:
            raise KeyError(device)
        return next(iter(holders))

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _trim_claim(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = _meta(claim)
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return claim


class Views:
    def __init__(self, api, namespace: str, queue: SchedulingQueue, dra: bool = True):
        self.api, self.namespace, self.queue = api, namespace, queue
        self.lock = threading.Lock()
        self._nodes: dict[str, dict] = {}
        self._pods_on: dict[str, dict[str, PodInfo]] = {}  # node -> uid -> pod
        self._listed: dict[str, NodeInfo] = {}  # node -> its pods as a NodeInfo
        self._node_of: dict[str, str] = {}  # uid -> node, for assigned pods
        self._assumed: dict[str, dict[str, PodInfo]] = {}  # node -> uid -> pod this instance is placing
        self._pending: dict[str, tuple[str, Mapping[str, Any] | None, int, tuple[str, str]]] = {}
        self._pending_bytes = 0
        self._records: dict[tuple[str, str], Record] = {}
        # Pods seen deleted, most recent last: a record written for one of them holds nothing.
        self.gone: OrderedDict[str, None] = OrderedDict()
        self.informers = [
            Informer("pods", api.list_all_pods, api.watch_all_pods, self._replace_pods, self._apply_pod),
            Informer("nodes", api.list_nodes, api.watch_nodes, self._replace_nodes, self._apply_node),
            Informer("records", lambda: api.list_leases(namespace, RECORD_SELECTOR),
                     lambda version, seconds: api.watch_leases(namespace, RECORD_SELECTOR, version, seconds),
                     self._replace_records, self._apply_record),
        ]
        # node -> slice name -> spec: a placement reads its node's slices only. Slices published for
        # no single node (spec.nodeName unset) are not kept: DRA mode matches a node's own.
        self._slices: dict[str, dict[str, Mapping[str, Any]]] = {}
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}  # (namespace, name) -> claim
        # Every allocated device and the claims it is allocated in, kept with _claims: a placement
        # looks up its devices, rather than going through every claim of the cluster.
        self._held: dict[Device, dict[str, None]] = {}
        self.dra = dra
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

    def dra_served(self) -> bool:
        """The API server serves resource.k8s.io/v1 (Kubernetes 1.34+), as bind's DRA watches found."""
        return self.dra and all(i.served for i in self.informers if i.optional)

    # -- reads, for placement ----------------------------------------------------------------
    def node(self, name: str) -> dict | None:
        with self.lock:
            return self._nodes.get(name)

    def pending_pod(self, uid: str) -> tuple[Mapping[str, Any] | None, tuple[str, str] | None]:
        """A pending pod of ours as last seen (None when kept by name only), and its name."""
        with self.lock:
            entry = self._pending.get(uid)
        return (entry[1], entry[3]) if entry else (None, None)

    def pending_version(self, uid: str) -> str | None:
        with self.lock:
            entry = self._pending.get(uid)
            return str(_meta(entry[1]).get("resourceVersion") or "") if entry and entry[1] else None

    def assigned_node(self, uid: str) -> str | None:
        with self.lock:
            return self._node_of.get(uid)

    def pending_uids(self) -> list[str]:
        with self.lock:
            return list(self._pending)

    def node_info(self, node: str) -> NodeInfo:
        """Inside self.lock: the node's pods as watched, plus those this instance is placing."""
        view = self._listed.get(node, NodeInfo())
        for uid, info in self._assumed.get(node, {}).items():
            if uid not in view.uids:
                view = view.plus(info)
        return view

    def record(self, node: str, device: str) -> Record | None:
        """Inside self.lock or not: one record as watched (or as this instance just wrote it)."""
        return self._records.get((node, device))

    def gone_of(self, record: Record | None) -> frozenset[str]:
        """{the UID of the pod `record` was last written for} when this view knows that pod is
        gone, else nothing: seen deleted, or absent from a pod view that is past the record's own
        version (the pod was created before its record was written, so a view that far along holds
        it unless it is gone). A fresh instance thus frees at once the records of pods deleted
        before it started. resourceVersions are compared as etcd revisions, one counter for pods
        and Leases alike; where they are not numbers, only deletions seen count."""
        with self.lock:
            return self.gone_of_locked(record)

    def gone_of_locked(self, record: Record | None) -> frozenset[str]:
        """gone_of, inside self.lock."""
        if record is None or not record.last_uid:
            return frozenset()
        uid = record.last_uid
        if uid in self.gone:
            return frozenset({uid})
        if uid in self._pending or uid in self._node_of:
            return frozenset()
        return frozenset({uid}) if _newer(self.informers[0].version, record.resource_version, or_equal=True) \
            else frozenset()

    # -- DRA ---------------------------------------------------------------------------------
    def slices_on(self, node: str) -> list[Mapping[str, Any]]:
        """Inside self.lock or not: the ResourceSlices published for `node` (as {"spec": ...})."""
        return [{"spec": spec} for spec in list(self._slices.get(node, {}).values())]

    def held(self) -> Mapping[Device, str]:
        """Inside self.lock: each device allocated in a claim, and that claim ("namespace/name";
        where two claims have it, the first), looked up as asked."""
        return _Held(self._held)

    def _set_claim(self, key: tuple[str, str], claim: Mapping[str, Any] | None) -> None:
        """Inside self.lock: `claim` (None: deleted) under `key`, and the held index with it."""
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

    def claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._claims.get((namespace, name))

    def wrote_claim(self, claim: Mapping[str, Any]) -> None:
        """A claim this instance just wrote or read: seen at once, before its watch event."""
        with self.lock:
            self._keep_claim(claim, from_watch=False)

    def _keep_claim(self, claim: Mapping[str, Any], from_watch: bool) -> None:
        """Inside self.lock: `claim` in the view, unless the view holds a newer copy. A watch's copy
        yields only to a newer one this instance wrote; a written or read copy must be newer."""
        key = _name(claim)
        known = self._claims.get(key)
        if known is not None:
            version, known_version = (str(_meta(c).get("resourceVersion") or "") for c in (claim, known))
            stale = _newer(known_version, version) if from_watch else not _newer(version, known_version)
            if stale:
                return
        self._set_claim(key, _trim_claim(claim))

    def _replace_slices(self, pages: Iterable[list[dict]]) -> None:
        slices: dict[str, dict[str, Mapping[str, Any]]] = {}
        for items in pages:
            for item in items:
                spec = item.get("spec") or {}
                if spec.get("nodeName"):
                    slices.setdefault(spec["nodeName"], {})[str(_meta(item).get("name"))] = spec
        with self.lock:
            before, self._slices = self._slices, slices
        for node in set(before) | set(slices):
            now, then = slices.get(node, {}), before.get(node, {})
            if any(then.get(name) != spec for name, spec in now.items()):
                self.queue.cluster_event(SLICE_UPDATE, node)
            if any(name not in now for name in then):
                self.queue.cluster_event(SLICE_DELETE, node)

    def _apply_slice(self, kind: str, item: Mapping[str, Any]) -> None:
        name, spec = str(_meta(item).get("name")), item.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            return
        with self.lock:
            if kind == "DELETED":
                self._slices.get(node, {}).pop(name, None)
            else:
                self._slices.setdefault(node, {})[name] = spec
        event = {"ADDED": SLICE_ADD, "DELETED": SLICE_DELETE}.get(kind, SLICE_UPDATE)
        self.queue.cluster_event(event, node)

    def _replace_claims(self, pages: Iterable[list[dict]]) -> None:
        claims = {(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): _trim_claim(c)
                  for items in pages for c in items}
        with self.lock:
            self._claims, self._held = {}, {}
            for key, claim in claims.items():
                self._set_claim(key, claim)
        self.queue.cluster_event(CLAIM_UPDATE, ANY_NODE)  # what changed unseen is not known: all may
        self.queue.cluster_event(CLAIM_DELETE, ANY_NODE)

    def _apply_claim(self, kind: str, claim: Mapping[str, Any]) -> None:
        with self.lock:
            if kind == "DELETED":
                self._set_claim(_name(claim), None)
            else:  # the watch's copy, unless this instance already holds a newer one it wrote
                self._keep_claim(claim, from_watch=True)
        if kind == "DELETED":
            self.queue.cluster_event(CLAIM_DELETE, ANY_NODE)
        elif kind == "MODIFIED":
            self.queue.cluster_event(CLAIM_UPDATE, ANY_NODE)

    def records(self) -> list[Record]:
        with self.lock:
            return list(self._records.values())

    # -- this instance's own placements --------------------------------------------------------
    def assume(self, node: str, info: PodInfo) -> None:
        """Inside self.lock: count the pod on the node until the watch shows it there."""
        self._assumed.setdefault(node, {})[info.uid] = info

    def forget(self, node: str, uid: str) -> None:
        with self.lock:
            self._assumed.get(node, {}).pop(uid, None)

    def wrote(self, lease: Mapping[str, Any]) -> None:
        """A record this instance just wrote: seen at once, before its watch event."""
        record = Record.of(lease)
        if record is not None:
            with self.lock:
                known = self._records.get((record.node, record.device))
                if known is None or _newer(record.resource_version, known.resource_version):
                    self._records[(record.node, record.device)] = record

    def observe_pending(self, pod: Mapping[str, Any]) -> str:
        """A pending pod of ours seen outside the watch (an event's GET, a resync's listing)."""
        uid = str(_meta(pod).get("uid") or "")
        with self.lock:
            if uid not in self._pending and uid not in self._node_of:
                self._put_pending(uid, pod, len(json.dumps(pod)))
        return uid

    def remember(self, ref) -> None:
        """A pod an event named that could not be read (the API server is down): kept by name, so
        the queue can read and place it once the API server answers; a listing replaces it."""
        with self.lock:
            if ref.uid not in self._pending and ref.uid not in self._node_of:
                self._pending[ref.uid] = ("", None, 0, (ref.namespace, ref.name))

    # -- pods ------------------------------------------------------------------------------
    def _replace_pods(self, pages: Iterable[list[dict]]) -> None:
        pods_on: dict[str, dict[str, PodInfo]] = {}
        pending: dict[str, tuple[str, Mapping[str, Any] | None, int, tuple[str, str]]] = {}
        pending_bytes = 0
        for items in pages:
            for pod in items:
                uid, node = str(_meta(pod).get("uid") or ""), (pod.get("spec") or {}).get("nodeName")
                if node:
                    if not is_terminal(pod):  # a pod being deleted holds its node until it is gone
                        pods_on.setdefault(node, {})[uid] = PodInfo.of(pod)
                elif _is_pending_ours(pod):
                    size = len(json.dumps(pod))
                    kept = _trim(pod) if pending_bytes + size <= MAX_PENDING_BYTES else None
                    pending_bytes += size if kept is not None else 0
                    pending[uid] = (_placement_fingerprint(pod), kept, size if kept is not None else 0, _name(pod))
        with self.lock:
            left = {uid: node for uid, node in self._node_of.items()
                    if uid not in pods_on.get(node, {})}
            gone_pending = [uid for uid in self._pending if uid not in pending]
            self._pods_on = pods_on
            self._listed = {node: NodeInfo.of(pods.values()) for node, pods in pods_on.items()}
            self._node_of = {uid: node for node, pods in pods_on.items() for uid in pods}
            for node, assumed in self._assumed.items():
                for uid in [uid for uid in assumed if uid in self._node_of]:
                    del assumed[uid]
            self._pending, self._pending_bytes = pending, pending_bytes
        for uid, node in left.items():
            self.queue.cluster_event(POD_LEAVES, node)
        for uid in gone_pending:
            self.queue.forget(uid)
        for uid in pending:  # a listing finds every pending pod: each is tried again
            self.queue.add(uid)

    def _apply_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        uid, node = str(meta.get("uid") or ""), (pod.get("spec") or {}).get("nodeName")
        left_node = None
        queue_it = forget_it = False
        with self.lock:
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
            elif _is_pending_ours(pod):
                entry = self._pending.get(uid)
                fingerprint = _placement_fingerprint(pod)
                queue_it = entry is None or entry[0] != fingerprint
                self._put_pending(uid, pod, 0, fingerprint)
            else:
                forget_it = self._drop_pending(uid)
        if left_node is not None:
            self.queue.cluster_event(POD_LEAVES, left_node)
        if forget_it:
            self.queue.forget(uid)
        if queue_it:
            self.queue.add(uid)

    def _saw_deleted(self, uid: str) -> None:
        self.gone[uid] = None
        while len(self.gone) > MAX_GONE:
            self.gone.popitem(last=False)

    def _put_pending(self, uid: str, pod: Mapping[str, Any], size: int = 0, fingerprint: str = "") -> None:
        size = size or len(json.dumps(pod))
        self._drop_pending(uid)
        kept = _trim(pod) if self._pending_bytes + size <= MAX_PENDING_BYTES else None
        if kept is not None:
            self._pending_bytes += size
        self._pending[uid] = (fingerprint or _placement_fingerprint(pod), kept, size if kept is not None else 0,
                              _name(pod))

    def _drop_pending(self, uid: str) -> bool:
        entry = self._pending.pop(uid, None)
        if entry is not None:
            self._pending_bytes -= entry[2]
        return entry is not None

    def _put_assigned(self, node: str, uid: str, info: PodInfo) -> None:
        pods = self._pods_on.setdefault(node, {})
        before = pods.get(uid)
        if before == info:
            return
        pods[uid] = info
        self._node_of[uid] = node
        # A pod added is one more; a changed one means summing again (rare: resizes).
        self._listed[node] = self._listed.get(node, NodeInfo()).plus(info) if before is None \
            else NodeInfo.of(pods.values())
        self._assumed.get(node, {}).pop(uid, None)  # shown: no longer assumed

    def _remove_assigned(self, uid: str) -> str | None:
        node = self._node_of.pop(uid, None)
        if node is None:
            return None
        pods = self._pods_on.get(node, {})
        pods.pop(uid, None)
        self._listed[node] = NodeInfo.of(pods.values())
        self._assumed.get(node, {}).pop(uid, None)
        return node

    # -- nodes -----------------------------------------------------------------------------
    def _replace_nodes(self, pages: Iterable[list[dict]]) -> None:
        nodes = {str(_meta(n).get("name")): node_view(n) for items in pages for n in items}
        with self.lock:
            changed = [name for name, node in nodes.items() if self._nodes.get(name) != node]
            self._nodes = nodes
        for name in changed:
            self.queue.cluster_event(NODE_ADD, name)
            self.queue.cluster_event(NODE_UPDATE, name)

    def _apply_node(self, kind: str, node: Mapping[str, Any]) -> None:
        name = str(_meta(node).get("name"))
        view = node_view(node)
        with self.lock:
            before = self._nodes.get(name)
            if kind == "DELETED":
                self._nodes.pop(name, None)
                return
            if before == view:
                return
            self._nodes[name] = view
        self.queue.cluster_event(NODE_ADD if before is None else NODE_UPDATE, name)

    # -- device records ----------------------------------------------------------------------
    def _replace_records(self, pages: Iterable[list[dict]]) -> None:
        records = {}
        for items in pages:
            for lease in items:
                record = Record.of(lease)
                if record is not None:
                    records[(record.node, record.device)] = record
        with self.lock:
            freed = [key for key in self._records if key not in records]
            self._records = records
        for key in freed:
            _ungauge(key)
            self.queue.cluster_event(RECORD_FREED, key[0])
        for key in records:
            _gauge(key)

    def _apply_record(self, kind: str, lease: Mapping[str, Any]) -> None:
        record = Record.of(lease)
        if record is None:
            return
        key = (record.node, record.device)
        with self.lock:
            if kind == "DELETED":
                self._records.pop(key, None)
            else:
                known = self._records.get(key)
                if known is None or not _newer(known.resource_version, record.resource_version):
                    self._records[key] = record
        if kind == "DELETED":
            _ungauge(key)
            self.queue.cluster_event(RECORD_FREED, record.node)
        else:
            _gauge(key)
            self.queue.cluster_event(RECORD_UPDATE, record.node)


_gauged: set[tuple[str, str]] = set()  # the (node, device) label pairs GPUS_HELD has


def _gauge(key: tuple[str, str]) -> None:
    GPUS_HELD.labels(*key).set(1)
    _gauged.add(key)


def _ungauge(key: tuple[str, str]) -> None:
    if key in _gauged:
        GPUS_HELD.remove(*key)
        _gauged.discard(key)


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


def _name(pod: Mapping[str, Any]) -> tuple[str, str]:
    return str(_meta(pod).get("namespace") or ""), str(_meta(pod).get("name") or "")
