"""NodeUnschedulable: a cordoned node (spec.unschedulable) takes no new pod
(kube-scheduler's plugins/nodeunschedulable; a pinned pod has no toleration for it to weigh)."""
from __future__ import annotations

from ..framework.events import NODE_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable
from ..shapes import as_map as _map

NAME = "NodeUnschedulable"


class NodeUnschedulable(FilterPlugin):
    name = NAME
    events = frozenset({NODE_UPDATE})

    def filter(self, state, pod, node):
        if _map(node.node.get("spec")).get("unschedulable") is True:
            return unresolvable(NAME, f"node {node.name} is cordoned (spec.unschedulable)")
        return SUCCESS
