"""TaintToleration: every NoSchedule or NoExecute taint of the node is tolerated by the pod
(kube-scheduler's plugins/tainttoleration; PreferNoSchedule only scores, and a pinned pod is not
scored)."""
from __future__ import annotations

from ..framework.events import NODE_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable
from ..nodecheck import BLOCKING_EFFECTS, tolerates
from ..shapes import as_map as _map, as_maps as _maps
from ..placement import spec

NAME = "TaintToleration"


class TaintToleration(FilterPlugin):
    name = NAME
    events = frozenset({NODE_UPDATE})

    def filter(self, state, pod, node):
        tolerations = _maps(spec(pod).get("tolerations"))
        for taint in _maps(_map(node.node.get("spec")).get("taints")):
            if taint.get("effect") in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
                shown = f"{taint.get('key')}={taint.get('value')}" if taint.get("value") else taint.get("key")
                return unresolvable(NAME, f"node {node.name} has taint {{{shown}: {taint.get('effect')}}} that the pod"
                                           " does not tolerate")
        return SUCCESS
