"""NodeExists: the map's node is a Node of the cluster. A pinned pod has no other candidate, so
kube-scheduler's "0/N nodes are available" becomes the one node's absence."""
from __future__ import annotations

from ..framework.events import NODE_ADD
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable

NAME = "NodeExists"


class NodeExists(FilterPlugin):
    name = NAME
    events = frozenset({NODE_ADD})

    def filter(self, state, pod, node):
        return SUCCESS if node.node is not None else unresolvable(NAME, f"node {node.name} does not exist")
