"""The profile's filters on one pod and a node built in the test, as bind, plan and explain run
them (gpu_scheduler/framework): for tests of the checks that are not about the map."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from gpu_scheduler.fit import NodeInfo
from gpu_scheduler.framework.interface import DEVICES, CycleState, Status
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.placement import Resolved
from gpu_scheduler.plugins.mapentry import RESOLVED
from gpu_scheduler.plugins.registry import new_framework
from gpu_scheduler.schedmap import Placement

FRAMEWORK = new_framework()


def refusal(pod: Mapping[str, Any], node: Mapping[str, Any] | None, placement: Placement,
            pods_on_node: Iterable[Mapping[str, Any]] | NodeInfo = ()) -> Status | None:
    """The first filter's refusal of `pod` on `node` (None: every filter passes), with the pod
    placed by `placement` whatever its map says."""
    state = CycleState()
    state.write(RESOLVED, Resolved(0, placement, {0: placement}))
    state.write(DEVICES, placement.devices)
    info = pods_on_node if isinstance(pods_on_node, NodeInfo) else NodeInfo.of(pods_on_node)
    info = info.without(str((pod.get("metadata") or {}).get("uid") or ""))
    snapshot = NodeSnapshot(placement.node, node, info)
    status = FRAMEWORK.run_filters(state, pod, snapshot)
    return None if status.ok else status


def problem(pod, node, placement, pods_on_node=()) -> str | None:
    """The refusal's message, or None."""
    status = refusal(pod, node, placement, pods_on_node)
    return status.message if status else None
