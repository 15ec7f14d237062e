"""NodeResourcesFit: the pod's effective request against the node's allocatable, less what its
other non-terminal pods request, and the node's pod count (kube-scheduler's
plugins/noderesources/fit.go, fitsRequest), with the figures."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fit import CPU, EPHEMERAL, MEMORY, PODS, NodeInfo, scheduler_units, parse_quantity, pod_requests, show
from ..framework.events import NODE_UPDATE, POD_LEAVES
from ..framework.interface import SUCCESS, FilterPlugin, unschedulable
from ..shapes import as_map as _map
from ..placement import metadata

NAME = "NodeResourcesFit"
TOO_MANY_PODS = "Too many pods"


def node_resources_fit(pod: Mapping[str, Any], node: Mapping[str, Any], info: NodeInfo) -> str | None:
    """NodeResourcesFit: `Insufficient cpu` and the like, with the figures; None when it fits."""
    allocatable = _map(_map(node.get("status")).get("allocatable"))
    problems = []
    allowed_pods = parse_quantity(allocatable.get(PODS))
    if allowed_pods is not None and len(info.pods) + 1 > allowed_pods:
        problems.append(f"{TOO_MANY_PODS} ({len(info.pods)} of {scheduler_units(PODS, allowed_pods)} on the node)")
    wanted = {name: units for name, units in pod_requests(pod).items() if units > 0 and name != PODS}
    for name in sorted(wanted, key=lambda n: (n not in (CPU, MEMORY, EPHEMERAL), n)):
        have = parse_quantity(allocatable.get(name))
        capacity = scheduler_units(name, have) if have is not None else 0
        in_use = info.requested.get(name, 0)
        if wanted[name] > capacity - in_use:
            problems.append(f"Insufficient {name} (the pod requests {show(name, wanted[name])}; "
                            f"{show(name, in_use)} of {show(name, capacity)} allocatable is requested by other pods)")
    return f"node {metadata(node).get('name')}: " + ", ".join(problems) if problems else None


class NodeResourcesFit(FilterPlugin):
    name = NAME
    events = frozenset({POD_LEAVES, NODE_UPDATE})

    def filter(self, state, pod, node):
        problem = node_resources_fit(pod, node.node, node.info)
        return unschedulable(NAME, problem) if problem else SUCCESS
