"""NodeGPUCapacity: every GPU index of the entry is below the node's advertised nvidia.com/gpu
(a node that advertises none is not checked: its GPUs may be published otherwise)."""
from __future__ import annotations

from ..framework.events import NODE_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable
from ..nodecheck import GPU_RESOURCE, gpu_capacity
from .mapentry import resolved

NAME = "NodeGPUCapacity"


class NodeGPUCapacity(FilterPlugin):
    name = NAME
    events = frozenset({NODE_UPDATE})

    def filter(self, state, pod, node):
        capacity = gpu_capacity(node.node)
        if capacity is None:
            return SUCCESS
        beyond = [i for i in resolved(state).placement.device_indexes() if i >= capacity]
        if beyond:
            listed = ", ".join(map(str, beyond))
            return unresolvable(NAME, f"device {listed} is beyond node {node.name}'s {capacity} {GPU_RESOURCE}"
                                       f" (indexes 0..{capacity - 1})")
        return SUCCESS
