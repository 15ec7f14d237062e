"""GPUsHeld: no device of the pod's map entry is held by another workload on its node, unless
both share (gpu-scheduler/share-gpus: "true", at most MAX_HOLDERS workloads on a device). No
filter of kube-scheduler's makes this check; it is why bind exists.

Two sources say a device is held, both in the snapshot: a non-terminal pod of another workload on
the node that holds it (the devices its Binding recorded), and bind's device records
(gpu_scheduler/records.py: a Lease per node and device, written before the Binding, so that two
bind instances never give one device to two workloads). Filter decides, for each device, the
step its record takes (Create, Keep, Write) or the refusal (Held); Reserve writes those records,
each at the version decided from, deciding again after a 409 from the record as it is then;
Unreserve deletes the records this attempt created, at the version it wrote."""
from __future__ import annotations

import time
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from ..fit import SHARE_ANNOTATION, PodInfo
from ..framework.events import POD_LEAVES, RECORD_FREED, RECORD_UPDATE
from kubeapi.errors import APIError

from ..framework.interface import (
    SUCCESS, CycleState, FilterPlugin, ReservePlugin, Status, api_failure, error, inputs, unschedulable,
)
from ..podinputs import PodInputs
from ..records import (
    GRACE_SECONDS, MAX_HOLDERS, RENEW_AFTER_SECONDS, Record, in_grace, lease_for, live_holder, nomination,
)
from .mapentry import resolved

NAME = "GPUsHeld"
STEPS = "GPUsHeld/steps"  # CycleState: [(device, step)] decided by filter
CREATED = "GPUsHeld/created"  # CycleState: [(record name, version)] this attempt created
WRITE_TRIES = 3  # writes of one record in one attempt (409s from other writers)


class RecordStore(Protocol):
    """What GPUsHeld reads and writes through the handle: bind's device records (Leases), and the
    node as it is now (after another writer was first)."""

    def read_record(self, node: str, device: str) -> Record | None: ...
    def create_record(self, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def update_record(self, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def delete_record(self, name: str, resource_version: str) -> None: ...
    def snapshot(self, node: str) -> Any: ...


# -- the decision for one device -----------------------------------------------------------------
@dataclass(frozen=True)
class Create:
    """No record: create it (AlreadyExists means another instance was first: read it, decide again)."""


@dataclass(frozen=True)
class Keep:
    """Ours, written recently: nothing to write."""


@dataclass(frozen=True)
class Write:
    """Update `record` to `holders` (renew, join or take over), with its version as precondition."""

    record: Record
    holders: tuple[str, ...]


@dataclass(frozen=True)
class Held:
    """Another workload holds the device: the refusal users see."""

    message: str


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%H:%M:%S UTC")


def record_step(record: Record | None, mine: str, shares: bool, pods_on_node: Iterable[PodInfo], now: float,
                gone: Container[str] = frozenset(), uid: str = "", priority: int = 0):
    """What giving (record.node, record.device) to workload `mine` takes: Create, Keep, Write, or
    Held with the reason. `pods_on_node`: the node's non-terminal pods as bind sees them; `gone`:
    the UIDs of pods bind saw deleted. Every message is stable while the situation lasts (times,
    not ages), so a repeated refusal counts up one Event and explain words it as bind does. A
    device being freed by preemption goes to its nominee (`uid`) and the pods of its workload alone,
    or to a pod of higher `priority` than the nominee's."""
    if record is None:
        return Create()
    nominee = nomination(record, now, gone)
    # the nominee's siblings (one workload, one map) share its devices: they may take it as it would
    if nominee and nominee != uid and mine != record.nominee_holder and priority <= record.nominee_priority:
        return Held(f"GPU {record.device} on {record.node} is being freed for {record.nominee} (priority"
                    f" {record.nominee_priority}), which preempted its holder, until {_clock(record.nominated_until)}")
    if mine in record.holders:
        return Keep() if now - record.written < RENEW_AFTER_SECONDS else Write(record, record.holders)
    if shares and record.shares:
        if len(record.holders) >= MAX_HOLDERS:
            return Held(f"GPU {record.device} on {record.node} is shared by {len(record.holders)} workloads already"
                        f" (at most {MAX_HOLDERS})")
        return Write(record, record.holders + (mine,))
    holder = live_holder(record, pods_on_node)
    if holder is not None and nominee and nominee == uid:
        return Held(f"GPU {record.device} on {record.node} is held by {holder.name}, which this pod preempted;"
                    " it is placed once that pod is gone")
    if holder is not None:
        return Held(f"GPU {record.device} on {record.node} is held by {holder.name} ({record.holders[0]}; "
                    f'both workloads may set {SHARE_ANNOTATION}: "true" to share)')
    if in_grace(record, now, gone):
        who = (f"{record.last_pod} ({record.holders[0]})" if record.last_pod and record.holders
               else record.holders[0] if record.holders else "another workload")
        return Held(f"GPU {record.device} on {record.node} was given to {who} at {_clock(record.written)};"
                    f" it is free again {GRACE_SECONDS} s after that ({_clock(record.written + GRACE_SECONDS)})"
                    " unless that pod is bound")
    return Write(record, (mine,))


def gpus_held(me: PodInputs, devices: Iterable[str], node: str, pods: Iterable[PodInfo]) -> str | None:
    """The first of `devices` that a pod of another workload on the node holds, named with its
    holder; None when all are free to this pod."""
    mine, sharing = me.workload, me.shares
    pods = tuple(pods)
    for device in devices:
        for other in pods:
            if device in other.devices and other.workload != mine and not (sharing and other.shares):
                return (f"GPU {device} on {node} is held by {other.name} (another workload; "
                        f'both may set {SHARE_ANNOTATION}: "true" to share)')
    return None


class GPUsHeld(FilterPlugin, ReservePlugin):
    name = NAME
    events = frozenset({POD_LEAVES, RECORD_FREED, RECORD_UPDATE})

    def filter(self, state: CycleState, pod, node) -> Status:
        placement, me = resolved(state).placement, inputs(state, pod)
        problem = gpus_held(me, placement.devices, node.name, node.info.pods)
        if problem:
            return unschedulable(NAME, problem)
        steps = []
        for device in placement.devices:
            record = node.records.get(device)
            step = record_step(record, me.holder, me.shares, node.info.pods, node.now, node.gone, me.uid, me.priority)
            if isinstance(step, Held):
                return unschedulable(NAME, step.message)
            steps.append((device, step))
        state.write(STEPS, steps)
        return SUCCESS

    def reserve(self, state: CycleState, pod, node, cluster: RecordStore) -> Status:
        """Record each device given, before the Binding: a create, or an update at the version
        decided from. When another writer was first (409), read the record and decide again."""
        me = inputs(state, pod)
        who, uid, mine, shares = me.name, me.uid, me.holder, me.shares
        created: list[tuple[str, str]] = []
        state.write(CREATED, created)
        for device, step in state.read(STEPS, []):
            for _ in range(WRITE_TRIES):
                if isinstance(step, Keep):
                    break
                try:
                    if isinstance(step, Create):
                        lease = cluster.create_record(lease_for(node.name, device, (mine,), shares, who, uid, time.time()))
                        written = lease.get("metadata") or {}
                        if written.get("name") and written.get("resourceVersion"):
                            created.append((str(written["name"]), str(written["resourceVersion"])))
                    else:
                        flag = shares if step.holders == (mine,) else step.record.shares
                        cluster.update_record(step.record.name, lease_for(
                            node.name, device, step.holders, flag, who, uid, time.time(), step.record))
                    break
                except APIError as failure:
                    if not failure.conflict:
                        return api_failure(NAME, f"writing the record of GPU {device} on {node.name}", failure)
                try:  # another writer was first: the record as it is now, and the step it calls for
                    record = cluster.read_record(node.name, device)
                except APIError as failure:
                    return api_failure(NAME, f"reading the record of GPU {device} on {node.name}", failure)
                now = cluster.snapshot(node.name)
                step = record_step(record, mine, shares, now.info.without(uid).pods, now.now, now.gone, uid,
                                   me.priority)
                if isinstance(step, Held):
                    return unschedulable(NAME, step.message)
            else:
                return error(NAME, f"the record of GPU {device} on {node.name} changed {WRITE_TRIES} times while"
                                   " writing it")
        return SUCCESS

    def unreserve(self, state: CycleState, pod, node, cluster: RecordStore) -> None:
        """The records this attempt created, deleted as written (a record written since by
        anyone is left alone). Updated ones are left: they free themselves after their grace."""
        for name, version in state.read(CREATED, []):
            try:
                cluster.delete_record(name, version)
            except APIError:  # written since, gone already, or the API is down: it frees itself after its grace
                pass
