"""What one attempt decides on: an immutable view of the pod's node, taken once (kube-scheduler's
per-cycle Snapshot of its cache). bind takes it from its views; `plan --cluster` and `explain`
from what they read. No filter sees the cluster change under it, and no lock is held while the
filters run: bind's assume refuses a snapshot whose node changed since (its generation)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..fit import NodeInfo


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


class DraSupport(enum.Enum):
    OFF = "off"                # bind runs with GPU_SCHEDULER_DRA=false
    NOT_SERVED = "not-served"  # the API server does not serve resource.k8s.io/v1 (before 1.34)
    SERVED = "served"


@dataclass(frozen=True)
class NodeSnapshot:
    name: str
    node: Mapping[str, Any] | None  # None: no such node
    info: NodeInfo = field(default_factory=NodeInfo)  # its non-terminal pods, and those being bound to it
    records: Mapping[str, Any] = field(default_factory=_empty)  # device -> gpu_scheduler.records.Record, this node's
    gone: frozenset[str] = frozenset()  # UIDs of pods that the records name and that are known gone
    now: float = 0.0  # the time the attempt decides at (records' grace)
    slices: tuple[Mapping[str, Any], ...] = ()  # the node's ResourceSlices, as {"spec": ...}
    held: Mapping[Any, str] = field(default_factory=_empty)  # DRA: each device of the node allocated in a claim -> that claim
    claims: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=_empty)  # DRA: the pod's own claim(s), as read
    dra: DraSupport = DraSupport.SERVED
    generation: int = 0  # bind's views: changes with every change of the node, its pods or records
    # The ResourceQuotas of the namespaces of the pods decided on the node (namespace -> its quotas,
    # as {"metadata": {"name"}, "spec": ...}; a namespace without any: absent or empty). None: not
    # read (GPUQuota then takes every namespace to count the GPUs its pods pin).
    quotas: Mapping[str, tuple[Mapping[str, Any], ...]] | None = None
    # Pool entries on this node given by a bind instance (gpu_scheduler.records.EntryRecord), by
    # (workload key, entry index): held until the pod's Binding shows (plugins/poolentry.py).
    entries: Mapping[tuple[str, int], Any] = field(default_factory=_empty)
