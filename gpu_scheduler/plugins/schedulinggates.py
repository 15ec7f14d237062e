"""SchedulingGates (PreEnqueue): a pod that carries spec.schedulingGates is held back by whoever
set them (Kueue until it admits the workload, or another controller) and is not ours to try yet,
as kube-scheduler's plugins/schedulinggates. It never enters the queue: no record, no Binding, no
Event; its PodScheduled condition says SchedulingGated. Removing the last gate is an update of the
pod, and the pod is queued at once."""
from __future__ import annotations

from typing import Any, Mapping

from ..framework.events import POD_UPDATE
from ..framework.interface import SUCCESS, PreEnqueuePlugin, Status, unresolvable
from ..placement import spec

NAME = "SchedulingGates"
REASON = "SchedulingGated"  # PodScheduled's reason, as kube-scheduler writes it


def gates(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the pod's scheduling gates, in order."""
    listed = spec(pod).get("schedulingGates")
    if not isinstance(listed, list):
        return ()
    return tuple(str(g.get("name")) for g in listed if isinstance(g, Mapping) and g.get("name"))


def gated(pod: Mapping[str, Any]) -> bool:
    return bool(gates(pod))


def message(pod: Mapping[str, Any]) -> str:
    """kube-scheduler's words for the condition, with the gates named."""
    return f"waiting for scheduling gates: [{' '.join(gates(pod))}]"


class SchedulingGates(PreEnqueuePlugin):
    name = NAME
    events = frozenset({POD_UPDATE})  # the gates are removed by an update of the pod itself

    def pre_enqueue(self, pod: Mapping[str, Any]) -> Status:
        if not gated(pod):
            return SUCCESS
        return unresolvable(NAME, message(pod), REASON)
