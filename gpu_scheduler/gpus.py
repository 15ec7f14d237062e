"""The operator's view (`kubectl gpu-scheduler gpus`): every GPU of the cluster, its state, who holds
it and who waits for it. Pure: node snapshots (the same NodeSnapshot bind decides on and explain
reads: the node, its pods' PodInfo, bind's device records, the pods known gone) and the waiting
pods' verdicts (explain's, `plan.answer`) in; rows and summaries out.

A GPU's state, from bind's own rules (gpu_scheduler/records.py), first that applies:
- `being-freed`: its record names a preemptor (nomination) until a time: it goes to that pod next;
- `in-flight`: its record was written for a pod within its grace and no pod holds the device yet
  (recorded, not yet bound: another instance is binding it, or died between the two writes);
- `shared`: pods (or records) of two or more workloads hold it (`gpu-scheduler/share-gpus`);
- `held`: a non-terminal pod on the node holds it (the devices its Binding wrote);
- `free`: none of these; a record past them counts for nothing, as for bind.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from .fit import PodInfo, parse_quantity
from .framework.snapshot import NodeSnapshot
from .quota import PRODUCT_LABEL
from .records import GRACE_SECONDS, in_grace, live_holder, nomination, workload_key
from .shapes import as_map, as_maps

GPU_RESOURCE = "nvidia.com/gpu"
FREE, HELD, IN_FLIGHT, BEING_FREED, SHARED = "free", "held", "in-flight", "being-freed", "shared"
STATES = (FREE, HELD, SHARED, IN_FLIGHT, BEING_FREED)
UNKNOWN_TYPE = "unknown"  # a node without the nvidia.com/gpu.product label
MAX_DEVICES_PER_NODE = 1024  # a node's advertised count past this is not believed (bounded rows)


@dataclass(frozen=True)
class Holder:
    pod: str  # namespace/name
    workload: str  # records.workload_key: `StatefulSet team-a/train`
    since: str = ""  # when it was bound (its PodScheduled condition), RFC 3339


@dataclass(frozen=True)
class Waiter:
    """A pending pod whose map entry (or one of whose pool's entries) names the GPU, and why it waits."""

    pod: str
    plugin: str
    message: str
    action: str  # explain's: "bind" (it would be bound now), "wait", "preempt"


@dataclass(frozen=True)
class GPU:
    node: str
    device: str  # the map's name for it: an index, or a UUID / MIG path
    uuid: str  # where known (a UUID device, or the DRA driver's slice); else ''
    product: str  # the node's nvidia.com/gpu.product, or UNKNOWN_TYPE
    state: str
    holders: tuple[Holder, ...] = ()
    workloads: tuple[str, ...] = ()  # distinct, from the holders and the record
    since: str = ""
    nominee: str = ""  # being-freed: the preemptor it goes to
    until: str = ""  # being-freed: until when; in-flight: when its grace ends
    in_flight_for: str = ""  # in-flight: the pod the record was written for
    waiting: tuple[Waiter, ...] = ()


@dataclass(frozen=True)
class Count:
    name: str  # a node, or a GPU type
    free: int
    total: int


@dataclass(frozen=True)
class GpuView:
    gpus: tuple[GPU, ...]
    nodes: tuple[Count, ...]
    types: tuple[Count, ...]
    legend: Mapping[str, str] = field(default_factory=dict)  # workload -> its grid letter


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if seconds else ""


def _index_key(device: str) -> tuple[int, int, str]:
    return (0, int(device), "") if device.isdigit() and len(device) < 10 else (1, 0, device)


def advertised(node: Mapping[str, Any] | None) -> int:
    """How many GPUs the node advertises (`nvidia.com/gpu` capacity, else allocatable), bounded."""
    status = as_map(as_map(node).get("status"))
    for kind in ("capacity", "allocatable"):
        amount = parse_quantity(as_map(status.get(kind)).get(GPU_RESOURCE))
        if amount is not None:
            return max(0, min(int(amount), MAX_DEVICES_PER_NODE))
    return 0


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """{index: uuid} of the devices a node's ResourceSlices publish (attributes `index` and `uuid`,
    as NVIDIA's DRA driver and the test driver name them; '' where no uuid)."""
    found: dict[str, str] = {}
    for piece in slices:
        for device in as_maps(as_map(piece.get("spec")).get("devices")):
            attributes = as_map(device.get("attributes"))
            index = as_map(attributes.get("index")).get("int")
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < MAX_DEVICES_PER_NODE:
                uuid = as_map(attributes.get("uuid")).get("string")
                found[str(index)] = uuid if isinstance(uuid, str) else ""
    return found


def node_gpus(snapshot: NodeSnapshot, since_of: Mapping[str, str] | None = None) -> list[GPU]:
    """Each GPU of one node, in device order, with its state, holders and record (no waiters)."""
    node, since_of = snapshot.node, since_of or {}
    product = as_map(as_map(as_map(node).get("metadata")).get("labels")).get(PRODUCT_LABEL)
    product = product if isinstance(product, str) and product else UNKNOWN_TYPE
    uuids = slice_devices(snapshot.slices)
    devices = dict.fromkeys(str(i) for i in range(advertised(node)))
    devices.update(dict.fromkeys(uuids))
    held_by: dict[str, list[PodInfo]] = {}
    for pod in snapshot.info.pods:
        for device in pod.devices:
            held_by.setdefault(device, []).append(pod)
            devices.setdefault(device)
    for device in snapshot.records:
        devices.setdefault(device)
    gpus = []
    for device in sorted(devices, key=_index_key):
        pods = held_by.get(device, [])
        record = snapshot.records.get(device)
        holders = tuple(Holder(p.name, workload_key(p.workload), since_of.get(p.uid, "")) for p in pods)
        workloads = list(dict.fromkeys(h.workload for h in holders))
        state, nominee, until, in_flight_for, since = (SHARED if len(workloads) > 1 else HELD) if pods else FREE, "", "", "", ""
        if record is not None:
            nominated = nomination(record, snapshot.now, snapshot.gone)
            if nominated:
                state, nominee, until = BEING_FREED, record.nominee, _time(record.nominated_until)
            elif not pods and in_grace(record, snapshot.now, snapshot.gone):
                state, in_flight_for, until = IN_FLIGHT, record.last_pod, _time(record.written + GRACE_SECONDS)
                workloads = list(record.holders)
            elif pods and record.shares and (live_holder(record, pods) is not None
                                             or in_grace(record, snapshot.now, snapshot.gone)):
                # a shared record's workloads, as bind counts them against MAX_HOLDERS (a workload's line
                # stays while the record lives, its pods gone or not yet bound), with the pods' own
                workloads = list(dict.fromkeys([*workloads, *record.holders]))
                state = SHARED if len(workloads) > 1 else HELD
            since = _time(record.written) if (pods or state == IN_FLIGHT) else ""
        since = min((h.since for h in holders if h.since), default=since)
        uuid = uuids.get(device, "") or (device if not device.isdigit() else "")
        gpus.append(GPU(snapshot.name, device, uuid, product, state, holders, tuple(workloads), since, nominee, until,
                        in_flight_for))
    return gpus


def waiters_by_gpu(waiting: Iterable[tuple[Waiter, Iterable[tuple[str, str]]]]) -> dict[tuple[str, str], list[Waiter]]:
    """{(node, device): the waiters whose entries name it}, from each waiter and its (node, device) pairs."""
    found: dict[tuple[str, str], list[Waiter]] = {}
    for waiter, places in waiting:
        for place in dict.fromkeys(places):
            found.setdefault(place, []).append(waiter)
    return found


def gpu_view(snapshots: Iterable[NodeSnapshot], waiting: Iterable[tuple[Waiter, Iterable[tuple[str, str]]]] = (),
             since_of: Mapping[str, str] | None = None) -> GpuView:
    """The view of every GPU of `snapshots` (node order), each with the pending pods waiting for it;
    a count of free GPUs per node and per GPU type; one letter per holding workload (the grid's)."""
    waits = waiters_by_gpu(waiting)
    gpus: list[GPU] = []
    for snapshot in sorted(snapshots, key=lambda s: s.name):
        for gpu in node_gpus(snapshot, since_of):
            found = waits.get((gpu.node, gpu.device))
            gpus.append(GPU(**{**gpu.__dict__, "waiting": tuple(found)}) if found else gpu)
    return GpuView(tuple(gpus), _counts(gpus, lambda g: g.node), _counts(gpus, lambda g: g.product), legend(gpus))


def _counts(gpus: Sequence[GPU], key) -> tuple[Count, ...]:
    totals: dict[str, list[int]] = {}
    for gpu in gpus:
        count = totals.setdefault(key(gpu), [0, 0])
        count[0] += gpu.state == FREE
        count[1] += 1
    return tuple(Count(name, free, total) for name, (free, total) in sorted(totals.items()))


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def legend(gpus: Iterable[GPU]) -> dict[str, str]:
    """One letter per workload holding a GPU, in order of first appearance ('?' past 52)."""
    letters: dict[str, str] = {}
    for gpu in gpus:
        for workload in gpu.workloads:
            if workload not in letters:
                letters[workload] = LETTERS[len(letters)] if len(letters) < len(LETTERS) else "?"
    return letters


def only(view: GpuView, node: str | None = None, namespace: str | None = None) -> GpuView:
    """The view of one node, and/or of the GPUs a namespace's pods hold or wait for (counts
    recomputed over what is left)."""
    def keep(gpu: GPU) -> bool:
        if node and gpu.node != node:
            return False
        if namespace:
            names = [h.pod for h in gpu.holders] + [w.pod for w in gpu.waiting] + [gpu.in_flight_for, gpu.nominee]
            return any(n.split("/", 1)[0] == namespace for n in names if n)
        return True
    gpus = [g for g in view.gpus if keep(g)]
    return GpuView(tuple(gpus), _counts(gpus, lambda g: g.node), _counts(gpus, lambda g: g.product), legend(gpus))
