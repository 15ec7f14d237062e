"""What the node plugins read of a node and a pod, total on odd shapes: taints and tolerations
(Kubernetes' Toleration.ToleratesTaint), the advertised GPU count. The checks themselves, with their
names and messages, are the plugins (gpu_scheduler/plugins/)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .shapes import as_map

GPU_RESOURCE = "nvidia.com/gpu"
# Effects the default scheduler's TaintToleration filter refuses; PreferNoSchedule only scores.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


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


def gpu_capacity(node: Mapping[str, Any]) -> int | None:
    """The node's advertised nvidia.com/gpu count, or None when it advertises none."""
    value = as_map(as_map(node.get("status")).get("capacity")).get(GPU_RESOURCE)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
