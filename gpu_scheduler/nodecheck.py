"""Can this pod go on that node? The checks kube-scheduler would make for a pinned pod.

A pinned pod has exactly one candidate node, so a failed check means the pod waits (Unschedulable)
until the node changes; the next resync tries again.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .placement import spec
from .schedmap import Placement

GPU_RESOURCE = "nvidia.com/gpu"
# Effects the default scheduler's TaintToleration filter refuses; PreferNoSchedule only scores.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _maps(value: Any) -> list[Mapping[str, Any]]:
    """The objects in a list field; anything else in it, or a field that is no list, counts as none."""
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True  # an empty key with Exists tolerates every taint
    return operator == "Equal" and bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")


def _ready(node: Mapping[str, Any]) -> tuple[bool, str]:
    for condition in _maps(_map(node.get("status")).get("conditions")):
        if condition.get("type") == "Ready":
            return condition.get("status") == "True", condition.get("message") or condition.get("reason") or ""
    return False, "it reports no Ready condition"


def gpu_capacity(node: Mapping[str, Any]) -> int | None:
    """The node's advertised nvidia.com/gpu count, or None when it advertises none."""
    value = _map(_map(node.get("status")).get("capacity")).get(GPU_RESOURCE)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# The filter names bind reports a refusal under (kube-scheduler's where it has one): what the
# scheduling queue keys the cluster events that can undo the refusal on (gpu_scheduler.queueing).
NODE_EXISTS = "NodeExists"
NODE_UNSCHEDULABLE = "NodeUnschedulable"
NODE_READY = "NodeReady"
TAINT_TOLERATION = "TaintToleration"
NODE_GPU_CAPACITY = "NodeGPUCapacity"


def node_refusal(pod: Mapping[str, Any], node: Mapping[str, Any] | None, placement: Placement) -> tuple[str, str] | None:
    """Why `pod` cannot be bound to `node` now, as (filter, message); None: it can."""
    name = placement.node
    if node is None:
        return NODE_EXISTS, f"node {name} does not exist"
    if _map(node.get("spec")).get("unschedulable") is True:
        return NODE_UNSCHEDULABLE, f"node {name} is cordoned (spec.unschedulable)"
    ready, detail = _ready(node)
    if not ready:
        return NODE_READY, f"node {name} is not Ready" + (f": {detail}" if detail else "")
    tolerations = _maps(spec(pod).get("tolerations"))
    for taint in _maps(_map(node.get("spec")).get("taints")):
        if taint.get("effect") in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            shown = f"{taint.get('key')}={taint.get('value')}" if taint.get("value") else taint.get("key")
            return TAINT_TOLERATION, f"node {name} has taint {{{shown}: {taint.get('effect')}}} that the pod does not tolerate"
    capacity = gpu_capacity(node)
    if capacity is not None:
        beyond = [i for i in placement.device_indexes() if i >= capacity]
        if beyond:
            listed = ", ".join(map(str, beyond))
            return NODE_GPU_CAPACITY, (f"device {listed} is beyond node {name}'s {capacity} {GPU_RESOURCE}"
                                       f" (indexes 0..{capacity - 1})")
    return None


def node_problem(pod: Mapping[str, Any], node: Mapping[str, Any] | None, placement: Placement) -> str | None:
    """Why `pod` cannot be bound to `node` now (None: it can)."""
    refusal = node_refusal(pod, node, placement)
    return refusal[1] if refusal else None
