"""The profile's filters on one pod and a node built in the test, as bind, plan and explain run
them (gpu_scheduler/framework): for tests of the checks that are not about the map."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from gpu_scheduler.fit import NodeInfo
from gpu_scheduler.framework.config import SchedulerConfig
from gpu_scheduler.framework.interface import CycleState, Status
from gpu_scheduler.framework.profile import default_profile
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.placement import Resolved
from gpu_scheduler.plugins.mapentry import RESOLVED
from gpu_scheduler.schedmap import Placement

FILTERS = default_profile(SchedulerConfig()).filter


def refusal(pod: Mapping[str, Any], node: Mapping[str, Any] | None, placement: Placement,
            pods_on_node: Iterable[Mapping[str, Any]] | NodeInfo = ()) -> Status | None:
    """The first filter's refusal of `pod` on `node` (None: every filter passes), with the pod
    placed by `placement` whatever its map says."""
    state = CycleState()
    state.write(RESOLVED, Resolved(0, placement, {0: placement}))
    info = pods_on_node if isinstance(pods_on_node, NodeInfo) else NodeInfo.of(pods_on_node)
    info = info.without(str((pod.get("metadata") or {}).get("uid") or ""))
    snapshot = NodeSnapshot(placement.node, node, info)
    for plugin in FILTERS:
        status = plugin.filter(state, pod, snapshot)
        if not status.ok:
            return status
    return None


def problem(pod, node, placement, pods_on_node=()) -> str | None:
    """The refusal's message, or None."""
    status = refusal(pod, node, placement, pods_on_node)
    return status.message if status else None
