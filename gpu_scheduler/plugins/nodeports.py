"""NodePorts: no host port of the pod is held by another pod on the node (kube-scheduler's
plugins/nodeports, with its defaults: hostIP 0.0.0.0, protocol TCP)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fit import NodeInfo, host_ports
from ..framework.events import POD_LEAVES
from ..framework.interface import SUCCESS, FilterPlugin, unschedulable

NAME = "NodePorts"
PORTS_REASON = "node(s) didn't have free ports for the requested pod ports"


def _ports_conflict(wanted: tuple[str, str, int], taken: tuple[str, str, int]) -> bool:
    (ip, protocol, number), (taken_ip, taken_protocol, taken_number) = wanted, taken
    if (protocol, number) != (taken_protocol, taken_number):
        return False
    return ip == "0.0.0.0" or taken_ip == "0.0.0.0" or ip == taken_ip


def node_ports(pod: Mapping[str, Any], info: NodeInfo) -> str | None:
    """NodePorts: the first host port another pod on the node holds, named with its holder."""
    for port in host_ports(pod):
        for other in info.pods:
            if any(_ports_conflict(port, taken) for taken in other.ports):
                return f"{PORTS_REASON}: hostPort {port[2]}/{port[1]} is held by {other.name}"
    return None


class NodePorts(FilterPlugin):
    name = NAME
    events = frozenset({POD_LEAVES})

    def filter(self, state, pod, node):
        problem = node_ports(pod, node.info)
        return unschedulable(NAME, problem) if problem else SUCCESS
