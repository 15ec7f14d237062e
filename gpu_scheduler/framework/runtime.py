"""Runs the profile: one attempt for one pod (kube-scheduler's schedulingCycle and bindingCycle).

`decide` is PreFilter and Filter on a snapshot of the pod's node: what bind, `plan --cluster` and
`explain` all ask. `schedule` is bind's whole attempt: decide, assume the pod on the node (refused
when the node changed since its snapshot: decided again), Reserve, Permit, PreBind, Bind; a
failure after Reserve runs Unreserve in reverse order and forgets the pod."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..placement import Resolved
from ..plugins.mapentry import resolved
from .interface import RETRY, SUCCESS, Cluster, Code, CycleState, Status, error
from .profile import Profile
from .snapshot import NodeSnapshot

STALE_TRIES = 20  # decisions of one attempt whose node changed before the pod was assumed on it
PRE_FILTER, FILTER, POST_FILTER, RESERVE, PERMIT, PRE_BIND, BIND = (
    "PreFilter", "Filter", "PostFilter", "Reserve", "Permit", "PreBind", "Bind")


@dataclass(frozen=True)
class Decision:
    """PreFilter and Filter's answer: SUCCESS (placeable on `node` now) or the first refusal."""

    status: Status
    node: NodeSnapshot | None  # None when PreFilter refused: no node was looked at
    state: CycleState
    phase: str

    @property
    def entry(self) -> Resolved | None:
        return resolved(self.state)


@dataclass(frozen=True)
class Outcome:
    """What one attempt of bind's came to: bound (SUCCESS), refused, or an ERROR, and in which
    phase; `node` is the map's node ('' when PreFilter refused)."""

    status: Status
    node: str
    phase: str

    @property
    def bound(self) -> bool:
        return self.status.code is Code.SUCCESS


class Framework:
    def __init__(self, profile: Profile):
        self.profile = profile

    def decide(self, pod: Mapping[str, Any], snapshot_of: Callable[[str], NodeSnapshot]) -> Decision:
        state = CycleState()
        for plugin in self.profile.pre_filter:
            status = plugin.pre_filter(state, pod)
            if not status.ok:
                return Decision(status, None, state, PRE_FILTER)
        node = snapshot_of(resolved(state).placement.node)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in node.info.uids:  # the pod itself, listed on its node already (a retry): not its own neighbour
            node = dataclasses.replace(node, info=node.info.without(uid))
        for plugin in self.profile.filter:
            status = plugin.filter(state, pod, node)
            if not status.ok:
                return Decision(status, node, state, FILTER)
        return Decision(SUCCESS, node, state, FILTER)

    def schedule(self, pod: Mapping[str, Any], cluster: Cluster) -> Outcome:
        for _ in range(STALE_TRIES):
            decision = self.decide(pod, cluster.snapshot)
            node = decision.node
            if not decision.status.ok or node is None:
                if node is not None and decision.status.refused:
                    return self._post_filter(pod, decision, cluster)
                return Outcome(decision.status, node.name if node else "", decision.phase)
            if cluster.assume(pod, node, resolved(decision.state).placement.devices):
                return self._bind_cycle(pod, decision.state, node, cluster)
        return Outcome(error("", f"node {node.name} changed {STALE_TRIES} times while deciding", RETRY), node.name,
                       RESERVE)

    def _post_filter(self, pod, decision: Decision, cluster: Cluster) -> Outcome:
        """The refusal stands; PostFilter plugins may act so that a later attempt succeeds."""
        for plugin in self.profile.post_filter:
            status = plugin.post_filter(decision.state, pod, decision.node, decision.status, cluster)
            if status.code is Code.SUCCESS:
                break
        return Outcome(decision.status, decision.node.name, decision.phase)

    def _bind_cycle(self, pod, state: CycleState, node: NodeSnapshot, cluster: Cluster) -> Outcome:
        reserved: list = []

        def reserve(plugin) -> Status:
            reserved.append(plugin)
            return plugin.reserve(state, pod, node, cluster)

        def permit(plugin) -> Status:
            status = plugin.permit(state, pod, node)
            # no plugin of this profile waits yet: a Permit that asks to is refused, not ignored
            return error(plugin.name, "Permit asked to wait; this profile cannot hold a pod") \
                if status.code is Code.WAIT else status

        status, phase = SUCCESS, RESERVE
        for phase, plugins, run in ((RESERVE, self.profile.reserve, reserve),
                                    (PERMIT, self.profile.permit, permit),
                                    (PRE_BIND, self.profile.pre_bind, lambda p: p.pre_bind(state, pod, node, cluster)),
                                    (BIND, self.profile.bind, lambda p: p.bind(state, pod, node, cluster))):
            status = _first_not_ok(plugins, run, stop_at_success=phase == BIND)
            if not status.ok or phase == BIND:
                break
        if not (status.code is Code.SUCCESS and not status.reason):  # anything but bound by this attempt
            if status.code is not Code.SUCCESS:  # AlreadyBound keeps its records: the pod holds them
                for plugin in reversed(reserved):
                    plugin.unreserve(state, pod, node, cluster)
            cluster.forget(pod, node.name)
        return Outcome(status, node.name, phase)


def _first_not_ok(plugins, run: Callable[[Any], Status], stop_at_success: bool = False) -> Status:
    """Each plugin in turn until one does not succeed; at Bind, until one does not skip (the first
    binder that binds is the only one, as in kube-scheduler)."""
    for plugin in plugins:
        status = run(plugin)
        if not status.ok or (stop_at_success and status.code is not Code.SKIP):
            return status
    return SUCCESS
