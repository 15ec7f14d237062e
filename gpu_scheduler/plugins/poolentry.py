"""PoolEntry (Filter, Reserve): a pool pod (a Deployment's: podindex.is_pool) takes an entry of
its map that no other live pod of its workload holds. The GPU records cannot guard an entry, since
a workload's own pods may share a device (its map may say so), so the entry has a holder of its
own:

- a bound pod holds the entry its Binding wrote (`gpu-scheduler/entry`) while it lives: until it
  is deleted or finishes, and through its termination, as its GPUs are held;
- between the decision and the Binding, the entry record bind writes first (records.EntryRecord:
  one Lease per workload and entry). A create fails when another instance was first (409), and a
  takeover is an update at the version decided from, so two bind instances never give one entry
  to two pods. The record holds for GRACE_SECONDS, or until its pod is seen deleted.

A pod refused here waits for a pod of its workload to leave the entry's node, or a record to be
freed: only then can an entry become free. Evicting a pod of one's own workload never helps, so
the refusal is UnschedulableAndUnresolvable. MapEntry offers the entries in map order and the
framework takes the first free one that passes every filter."""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from kubeapi.errors import APIError

from ..fit import PodInfo
from ..framework.events import POD_LEAVES, RECORD_FREED, RECORD_UPDATE
from ..framework.interface import (
    SUCCESS, CycleState, FilterPlugin, ReservePlugin, Status, api_failure, error, inputs, unresolvable,
)
from ..placement import Resolved
from ..podinputs import PodInputs
from ..records import EntryRecord, entry_in_grace, entry_lease_for
from .mapentry import resolved

NAME = "PoolEntry"
WRITTEN = "PoolEntry/written"  # CycleState: (record name, version) this attempt wrote
PREVIOUS = "PoolEntry/previous"  # CycleState: the record to take over (its version), or None: create


class EntryStore(Protocol):
    """What PoolEntry writes through the handle: the entry records (Leases in bind's namespace)."""

    def create_record(self, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def update_record(self, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...
    def delete_record(self, name: str, resource_version: str) -> None: ...


def held_by(me: PodInputs, entry: Resolved, pods_on_node: tuple[PodInfo, ...], record: EntryRecord | None,
            now: float, gone) -> str | None:
    """Who other than the pod of `me` holds `entry` of its workload's pool on the entry's node ('held by
    <pod>'), or None when it is free to `pod`. A pod of the workload that took its entry from
    another map (a rollout that changed the map) holds the devices it was given, whatever their
    entry's index: the new map's entries sharing them wait for it, as sharing is the map's to say."""
    mine, uid = me.workload, me.uid
    devices = set(entry.placement.devices)
    for other in pods_on_node:
        if other.workload != mine or other.uid == uid or other.entry is None:
            continue
        same_map = other.pool_map == entry.map_text
        if (other.entry == entry.index and same_map) or (not same_map and devices & set(other.devices)):
            return f"held by {other.name}" + (" (terminating)" if other.terminating else "")
    if record is not None and record.last_uid != uid and entry_in_grace(record, now, gone):
        return f"given to {record.last_pod} by a bind instance, being bound"
    return None


class PoolEntry(FilterPlugin, ReservePlugin):
    name = NAME
    events = frozenset({POD_LEAVES, RECORD_FREED, RECORD_UPDATE})

    def filter(self, state: CycleState, pod, node) -> Status:
        entry = resolved(state)
        if not entry.pooled:
            return SUCCESS
        me = inputs(state, pod)
        record = node.entries.get((me.holder, entry.index))
        holder = held_by(me, entry, node.info.pods, record, node.now, node.gone)
        if holder:
            return unresolvable(NAME, holder)
        state.write(PREVIOUS, record)
        return SUCCESS

    def reserve(self, state: CycleState, pod, node, cluster: EntryStore) -> Status:
        """The entry recorded as this pod's before its Binding: created, or taken over at the
        version decided from. Another writer first (409): an ERROR retried after the backoff, when
        the view shows its record and the pod takes another entry."""
        entry = resolved(state)
        if not entry.pooled:
            return SUCCESS
        me = inputs(state, pod)
        previous: EntryRecord | None = state.read(PREVIOUS)
        body = entry_lease_for(node.name, me.holder, entry.index, me.name, me.uid, time.time(), previous)
        try:
            written = cluster.create_record(body) if previous is None else cluster.update_record(previous.name, body)
            written_meta = written.get("metadata") or {}
            state.write(WRITTEN, (str(written_meta.get("name") or ""), str(written_meta.get("resourceVersion") or "")))
        except APIError as failure:
            if failure.conflict:
                return error(NAME, f"entry {entry.index} of the pool was given to another pod meanwhile (another bind"
                                   " instance); trying the pool again")
            return api_failure(NAME, f"writing the record of pool entry {entry.index}", failure)
        return SUCCESS

    def unreserve(self, state: CycleState, pod, node, cluster: EntryStore) -> None:
        """The record this attempt wrote (created, or taken over: it was free), deleted at the
        version written, so that the entry is free at once (a record written since by anyone is
        left alone). Also when another instance bound the pod meanwhile, to another entry: the
        record would otherwise hold this one for the pod, for nothing, through its grace."""
        written = state.read(WRITTEN)
        if not written or not written[0]:
            return
        try:
            cluster.delete_record(*written)
        except APIError:  # written since, gone already, or the API is down: it frees itself after its grace
            pass
