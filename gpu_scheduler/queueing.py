"""Which cluster events can undo a refusal, and how long a pod waits before it is tried again:
kube-scheduler's EventsToRegister and queueing hints (noderesources/fit.go and the other
filters), and its pod backoff, for bind's filters. Pure: bind's scheduling queue asks these.

A pod refused by a filter waits as unschedulable until an event that filter registered happens on
the pod's node (its holder leaves, the node becomes Ready or gains the label, a filler is
deleted), or UNSCHEDULABLE_FLUSH_SECONDS pass; then it is tried again after its backoff. A pod
that failed for a transient reason (the API server down or not yet ready) is tried again after its
backoff alone."""
from __future__ import annotations

from dataclasses import dataclass

from .dra import DYNAMIC_RESOURCES
from .fit import GPUS_HELD, NODE_AFFINITY, NODE_PORTS, NODE_RESOURCES_FIT
from .nodecheck import NODE_EXISTS, NODE_GPU_CAPACITY, NODE_READY, NODE_UNSCHEDULABLE, TAINT_TOLERATION

# Cluster events, as (resource, action). An assigned pod "leaves" a node when it is deleted,
# finishes (Succeeded/Failed) or is replaced by another object of the same name.
NODE_ADD = ("Node", "Add")
NODE_UPDATE = ("Node", "Update")
POD_LEAVES = ("AssignedPod", "Delete")
RECORD_FREED = ("Record", "Delete")  # a device record deleted, or taken over, or shared further
RECORD_UPDATE = ("Record", "Update")
POD_UPDATE = ("Pod", "Update")  # the refused pod itself changed (its map, its selector)
# DRA mode: a node's ResourceSlices (its devices as published) and any ResourceClaim. Claims are
# keyed on no one node (ANY_NODE): the claim that holds a device, or the pod's own claim of a
# former pod of its name, may have been allocated on another node or none.
SLICE_ADD = ("ResourceSlice", "Add")
SLICE_UPDATE = ("ResourceSlice", "Update")
SLICE_DELETE = ("ResourceSlice", "Delete")  # a second pool publishing the same device withdrawn
CLAIM_UPDATE = ("ResourceClaim", "Update")  # deallocated, its reservation or owner changed
CLAIM_DELETE = ("ResourceClaim", "Delete")
ANY_NODE = "*"

# The map cannot place the pod (no entry, malformed, unknown index): only the pod can change that.
MAP = "Map"

EVENTS_TO_REGISTER: dict[str, frozenset[tuple[str, str]]] = {
    NODE_EXISTS: frozenset({NODE_ADD}),
    NODE_UNSCHEDULABLE: frozenset({NODE_UPDATE}),
    NODE_READY: frozenset({NODE_UPDATE}),
    TAINT_TOLERATION: frozenset({NODE_UPDATE}),
    NODE_GPU_CAPACITY: frozenset({NODE_UPDATE}),
    NODE_AFFINITY: frozenset({NODE_ADD, NODE_UPDATE}),
    NODE_PORTS: frozenset({POD_LEAVES}),
    NODE_RESOURCES_FIT: frozenset({POD_LEAVES, NODE_UPDATE}),
    GPUS_HELD: frozenset({POD_LEAVES, RECORD_FREED, RECORD_UPDATE}),
    DYNAMIC_RESOURCES: frozenset({SLICE_ADD, SLICE_UPDATE, SLICE_DELETE, CLAIM_UPDATE, CLAIM_DELETE}),
    MAP: frozenset(),
}

INITIAL_BACKOFF_SECONDS = 0.5
# kube-scheduler's podMaxBackoffSeconds is 10; bind's is lower so that a replica refused while
# the API server was not yet ready is bound within seconds of its return.
MAX_BACKOFF_SECONDS = 4.0
# An unschedulable pod is tried again after this long even if no registered event came: a
# safety net for events lost with a broken watch (kube-scheduler: 5 minutes).
UNSCHEDULABLE_FLUSH_SECONDS = 60.0


@dataclass(frozen=True)
class Refused:
    """Why a pod waits: the filter that refused it and the node it is pinned to."""

    filter: str
    node: str


def requeues(refused: Refused, event: tuple[str, str], node: str) -> bool:
    """The queueing hint: may `event` on `node` let the refused pod fit now? Only events its
    filter registered, and only on its own node (a pinned pod has one candidate), or on
    ANY_NODE."""
    return node in (refused.node, ANY_NODE) and event in EVENTS_TO_REGISTER.get(refused.filter, frozenset())


def backoff_seconds(attempts: int) -> float:
    """The wait before attempt `attempts + 1` of a pod: doubling from INITIAL_BACKOFF_SECONDS,
    at most MAX_BACKOFF_SECONDS."""
    return min(MAX_BACKOFF_SECONDS, INITIAL_BACKOFF_SECONDS * 2 ** max(0, attempts - 1))
