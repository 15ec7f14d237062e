"""NodeReady: the node reports Ready. kube-scheduler leaves this to the node lifecycle
controller's taints; bind binds no pod to a node whose kubelet would not run it, and says why."""
from __future__ import annotations

from typing import Any, Mapping

from ..framework.events import NODE_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable
from ..shapes import as_map as _map, as_maps as _maps

NAME = "NodeReady"


def _ready(node: Mapping[str, Any]) -> tuple[bool, str]:
    for condition in _maps(_map(node.get("status")).get("conditions")):
        if condition.get("type") == "Ready":
            return condition.get("status") == "True", condition.get("message") or condition.get("reason") or ""
    return False, "it reports no Ready condition"


class NodeReady(FilterPlugin):
    name = NAME
    events = frozenset({NODE_UPDATE})

    def filter(self, state, pod, node):
        ready, detail = _ready(node.node)
        if not ready:
            return unresolvable(NAME, f"node {node.name} is not Ready" + (f": {detail}" if detail else ""))
        return SUCCESS
