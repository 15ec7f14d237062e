"""Device records: who holds each GPU, kept in the API server so that every bind instance sees
the same truth and two of them can never give one device to two workloads.

One Lease (coordination.k8s.io/v1) per node and device, in bind's own namespace. Giving a device
is a write that fails when another instance wrote first: a create (the API server refuses a second
object of the same name, 409 AlreadyExists), or an update carrying the resourceVersion it was
decided from (409 Conflict when anyone changed it since). The record names the workload(s), not
the pod: the replicas of one workload share their devices, as the map says, without a write each.

A record holds its device while a non-terminal pod of a holder workload on that node holds it
(bind's view of the node's pods), and, unless the view saw the pod it was last written for
deleted, for GRACE_SECONDS after it was last written: long enough for the Binding that follows the
write to show in every instance's view.
Past both, the record is free: the next workload takes it over with an update (the precondition
again decides between two instances), and bind deletes it meanwhile. So a record whose pod was
never bound (bind died between the two writes) frees its device GRACE_SECONDS after it was
written, plus the view's delay.

Pure: Lease bodies in, rules out. Which step giving a device takes, and the refusal, are the
GPUsHeld plugin's (gpu_scheduler/plugins/gpusheld.py); the writes are done through bind's shell."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Container, Iterable, Mapping

from .fit import PodInfo, SHARE_ANNOTATION
from .shapes import as_map as _map

GRACE_SECONDS = 30
# A holder renews the record when it places another replica and the record is older than this:
# the Binding then shows in the views long before the record could be taken over.
RENEW_AFTER_SECONDS = GRACE_SECONDS // 2
MAX_HOLDERS = 32  # workloads sharing one device; each is one line of the record
LEASE_API = "coordination.k8s.io/v1"
MANAGED_BY = "app.kubernetes.io/managed-by"
RECORD_SELECTOR = f"{MANAGED_BY}=gpu-scheduler"
NODE_KEY, DEVICE_KEY = "gpu-scheduler/node", "gpu-scheduler/device"
HOLDERS_KEY, POD_KEY, POD_UID_KEY = "gpu-scheduler/holders", "gpu-scheduler/last-pod", "gpu-scheduler/last-pod-uid"
# Preemption's claim on a device (plugins/defaultpreemption.py): the preemptor named on the record
# of each device its victims free, written at the record's version before any eviction, so that
# one preemptor, and one bind instance, wins each device. Until the nomination ends (its time, or
# its pod seen gone), the device goes to that pod alone, or to a pod of higher priority.
NOMINATED_KEY, NOMINATED_UID_KEY = "gpu-scheduler/nominated", "gpu-scheduler/nominated-uid"
NOMINATED_PRIORITY_KEY, NOMINATED_UNTIL_KEY = "gpu-scheduler/nominated-priority", "gpu-scheduler/nominated-until"
NOMINATED_HOLDER_KEY = "gpu-scheduler/nominated-holder"  # the preemptor's workload: its siblings share the device
_NAME_SAFE = re.compile(r"^[0-9]{1,4}$")


def workload_key(workload: tuple[str, ...]) -> str:
    """fit.workload's tuple as one line: `StatefulSet team-a/train`, or `pods of map 3f9c… in team-a`
    for bare pods written from one map (the map's digest: a map can be 256 KiB)."""
    if workload and workload[0] == "owner":
        return f"{workload[2]} {workload[1]}/{workload[3]}"
    digest = hashlib.sha256((workload[2] if len(workload) > 2 else "").encode()).hexdigest()[:16]
    return f"pods of map {digest} in {workload[1] if len(workload) > 1 else ''}"


def record_name(node: str, device: str) -> str:
    """The Lease's name: `<node>.gpu-<index>` where that is a valid name (node names are DNS
    subdomains of up to 253 characters); else a digest of both, since UUIDs and MIG paths hold
    upper case and '/'. The annotations carry the exact node and device either way."""
    if _NAME_SAFE.match(device) and len(node) + 5 + len(device) <= 253:
        return f"{node}.gpu-{device}"
    return "gpu-" + hashlib.sha256(f"{node}\0{device}".encode()).hexdigest()[:40]


def _time(value: float) -> str:
    return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: Any) -> float:
    if not isinstance(value, str):
        return 0.0
    # The two shapes a Lease's times take (MicroTime, and whole seconds), by fromisoformat: a tenth
    # of strptime's cost, which `gpus` pays for each of thousands of records.
    if value[-1:] == "Z" and (len(value) == 20 or (len(value) == 27 and value[19] == ".")):
        try:
            return datetime.fromisoformat(value[:-1] + "+00:00").timestamp()
        except ValueError:
            pass
    for pattern in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(value, pattern).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return 0.0


@dataclass(frozen=True)
class Record:
    name: str
    node: str
    device: str
    holders: tuple[str, ...]  # workload keys
    shares: bool  # the holders set gpu-scheduler/share-gpus: "true"
    written: float  # renewTime, seconds since the epoch
    resource_version: str
    last_pod: str = ""
    last_uid: str = ""
    nominee: str = ""  # namespace/name of the preemptor the device is being freed for
    nominee_uid: str = ""
    nominee_priority: int = 0
    nominated_until: float = 0.0
    nominee_holder: str = ""  # the preemptor's workload key

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> "Record | None":
        """The record in a Lease, or None when it is not one of ours (or damaged: it then holds
        nothing, and is not written over, since its name may still be taken by a create)."""
        meta = _map(lease.get("metadata"))
        annotations = _map(meta.get("annotations"))
        node, device = annotations.get(NODE_KEY), annotations.get(DEVICE_KEY)
        try:
            holders = json.loads(annotations.get(HOLDERS_KEY) or "[]")
        except ValueError:
            return None
        if not (isinstance(node, str) and isinstance(device, str) and isinstance(holders, list)
                and all(isinstance(h, str) for h in holders)):
            return None
        spec = _map(lease.get("spec"))
        try:
            nominee_priority = int(annotations.get(NOMINATED_PRIORITY_KEY) or 0)
        except ValueError:
            nominee_priority = 0
        return cls(str(meta.get("name") or ""), node, device, tuple(holders),
                   annotations.get(SHARE_ANNOTATION) == "true", _parse_time(spec.get("renewTime")),
                   str(meta.get("resourceVersion") or ""), str(annotations.get(POD_KEY) or ""),
                   str(annotations.get(POD_UID_KEY) or ""), str(annotations.get(NOMINATED_KEY) or ""),
                   str(annotations.get(NOMINATED_UID_KEY) or ""), nominee_priority,
                   _parse_time(annotations.get(NOMINATED_UNTIL_KEY)), str(annotations.get(NOMINATED_HOLDER_KEY) or ""))


def lease_for(node: str, device: str, holders: Iterable[str], shares: bool, pod: str, pod_uid: str, now: float,
              previous: Record | None = None) -> dict[str, Any]:
    """The Lease body recording `holders` on (node, device), written at `now`: created (no
    `previous`) or replacing `previous` at its resourceVersion, the update's precondition."""
    holders = list(holders)
    meta: dict[str, Any] = {
        "name": record_name(node, device),
        "labels": {MANAGED_BY: "gpu-scheduler"},
        "annotations": {NODE_KEY: node, DEVICE_KEY: device, HOLDERS_KEY: json.dumps(holders),
                        POD_KEY: pod, POD_UID_KEY: pod_uid, **({SHARE_ANNOTATION: "true"} if shares else {})},
    }
    if previous is not None:
        meta["resourceVersion"] = previous.resource_version
    return {"apiVersion": LEASE_API, "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holders[0][:1024] if holders else "", "leaseDurationSeconds": GRACE_SECONDS,
                     "acquireTime": _time(now), "renewTime": _time(now)}}


def nominated_lease(record: Record | None, node: str, device: str, pod: str, pod_uid: str, priority: int,
                    until: float, holder: str = "") -> dict[str, Any]:
    """`record` as it is, plus the nomination of `pod` until `until`: an update at its version (its
    holders, last pod and time unchanged, so nothing else about the device changes). Without a
    record (a holder bound before records were kept), a new one naming no holder."""
    if record is None:
        body = lease_for(node, device, (), False, "", "", 0.0)
    else:
        body = lease_for(node, device, record.holders, record.shares, record.last_pod, record.last_uid,
                         record.written, record)
    body["metadata"]["annotations"].update({NOMINATED_KEY: pod, NOMINATED_UID_KEY: pod_uid, NOMINATED_HOLDER_KEY: holder,
                                            NOMINATED_PRIORITY_KEY: str(priority), NOMINATED_UNTIL_KEY: _time(until)})
    return body


def without_nomination(lease: Mapping[str, Any]) -> dict[str, Any]:
    """`lease` (as written, with its resourceVersion) with its nomination taken off."""
    meta = dict(_map(lease.get("metadata")))
    meta["annotations"] = {k: v for k, v in _map(meta.get("annotations")).items()
                           if k not in (NOMINATED_KEY, NOMINATED_UID_KEY, NOMINATED_PRIORITY_KEY, NOMINATED_UNTIL_KEY,
                                        NOMINATED_HOLDER_KEY)}
    return {**lease, "metadata": meta}


def nomination(record: Record | None, now: float, gone: Container[str] = frozenset()) -> str:
    """The UID of the pod the device is being freed for, while that nomination lasts; else ''."""
    if record is None or not record.nominee_uid or now >= record.nominated_until or record.nominee_uid in gone:
        return ""
    return record.nominee_uid


def live_holder(record: Record, pods_on_node: Iterable[PodInfo]) -> PodInfo | None:
    """A non-terminal pod on the node of a holder workload that holds the device, if any."""
    for pod in pods_on_node:
        if record.device in pod.devices and workload_key(pod.workload) in record.holders:
            return pod
    return None


def in_grace(record: Record, now: float, gone: Container[str] = frozenset()) -> bool:
    """Written for a pod within GRACE_SECONDS, and that pod not seen deleted: it may be bound
    already, and not yet in this instance's view."""
    return now - record.written < GRACE_SECONDS and not (record.last_uid and record.last_uid in gone)


def is_free(record: Record, pods_on_node: Iterable[PodInfo], now: float, gone: Container[str] = frozenset()) -> bool:
    """No holder pod on the node, past its grace and nominated for nobody: the record can be deleted."""
    return (not in_grace(record, now, gone) and live_holder(record, pods_on_node) is None
            and not nomination(record, now, gone))


# -- pool entries ---------------------------------------------------------------------------------
# A pool's entry given to a pod (plugins/poolentry.py): the GPU records cannot guard it, since a
# workload's own pods may share a device. One Lease per workload and entry, written before the
# Binding as a device's is, so that two bind instances never give one entry to two pods; it holds
# the entry until the Binding's `gpu-scheduler/entry` annotation, which then holds it while the pod
# lives, shows in every view: GRACE_SECONDS, unless its pod is seen deleted.
POOL_WORKLOAD_KEY, ENTRY_KEY = "gpu-scheduler/pool-workload", "gpu-scheduler/entry"


@dataclass(frozen=True)
class EntryRecord:
    name: str
    node: str  # the entry's node: the record is seen with that node's snapshot
    pool: str  # the workload key (workload_key) whose pool it is
    entry: int
    written: float
    resource_version: str
    last_pod: str = ""
    last_uid: str = ""

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> "EntryRecord | None":
        """The entry record in a Lease, or None when it is not one (or damaged: it holds nothing)."""
        meta = _map(lease.get("metadata"))
        annotations = _map(meta.get("annotations"))
        node, pool, entry = annotations.get(NODE_KEY), annotations.get(POOL_WORKLOAD_KEY), annotations.get(ENTRY_KEY)
        if not (isinstance(node, str) and isinstance(pool, str) and isinstance(entry, str) and entry.isdigit()
                and len(entry) <= 10):
            return None
        return cls(str(meta.get("name") or ""), node, pool, int(entry),
                   _parse_time(_map(lease.get("spec")).get("renewTime")), str(meta.get("resourceVersion") or ""),
                   str(annotations.get(POD_KEY) or ""), str(annotations.get(POD_UID_KEY) or ""))


def entry_record_name(pool: str, entry: int) -> str:
    """The Lease's name: a digest of the workload and the entry (a workload key is no valid name)."""
    return "entry-" + hashlib.sha256(f"{pool}\0{entry}".encode()).hexdigest()[:40]


def entry_lease_for(node: str, pool: str, entry: int, pod: str, pod_uid: str, now: float,
                    previous: EntryRecord | None = None) -> dict[str, Any]:
    """The Lease body giving `entry` of `pool` to `pod`, written at `now`: created, or replacing
    `previous` at its resourceVersion."""
    meta: dict[str, Any] = {
        "name": entry_record_name(pool, entry),
        "labels": {MANAGED_BY: "gpu-scheduler"},
        "annotations": {NODE_KEY: node, POOL_WORKLOAD_KEY: pool, ENTRY_KEY: str(entry), POD_KEY: pod,
                        POD_UID_KEY: pod_uid},
    }
    if previous is not None:
        meta["resourceVersion"] = previous.resource_version
    return {"apiVersion": LEASE_API, "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": pod[:1024], "leaseDurationSeconds": GRACE_SECONDS,
                     "acquireTime": _time(now), "renewTime": _time(now)}}


def entry_holder(record: EntryRecord, pods_on_node: Iterable[PodInfo]) -> PodInfo | None:
    """The live pod on the entry's node that holds the entry (its Binding's annotation), if any."""
    for pod in pods_on_node:
        if pod.entry == record.entry and workload_key(pod.workload) == record.pool:
            return pod
    return None


def entry_in_grace(record: EntryRecord, now: float, gone: Container[str] = frozenset()) -> bool:
    """Written for a pod within GRACE_SECONDS, and that pod not seen deleted: its Binding may have
    happened, and not yet be in this instance's view."""
    return now - record.written < GRACE_SECONDS and not (record.last_uid and record.last_uid in gone)


def entry_is_free(record: EntryRecord, pods_on_node: Iterable[PodInfo], now: float,
                  gone: Container[str] = frozenset()) -> bool:
    """Past its grace and no live pod holds the entry: the record can be deleted."""
    return not entry_in_grace(record, now, gone) and entry_holder(record, pods_on_node) is None
