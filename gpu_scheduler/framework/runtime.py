"""Runs the profile: one attempt for one pod (kube-scheduler's schedulingCycle and bindingCycle).

`decide` is PreFilter and Filter on a snapshot of the pod's node: what bind, `plan --cluster` and
`explain` all ask. `schedule` is bind's whole attempt: decide, assume the pod on the node (refused
when the node changed since its snapshot: decided again), Reserve, Permit, PreBind, Bind; a
failure after Reserve runs Unreserve in reverse order and forgets the pod.

A gang's members go together (plugins/gang.py, docs/gangs.md): `decide_gang` decides each pending
member alone and asks the Gang plugin's quorum, reserving nothing; `schedule_gang` then assumes
and reserves the placeable members in one global (node, device) order, asks the quorum again
(Permit), runs PreBind for every member and only then the Bindings. A failure before the
Bindings unreserves every member, in reverse order."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..placement import Resolved, metadata
from ..plugins import gang as gangs
from ..plugins.mapentry import resolved
from .interface import RETRY, SUCCESS, Cluster, Code, CycleState, Status, error
from .profile import Profile
from .snapshot import GangSnapshot, NodeSnapshot

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
    preemption: str = ""  # what PostFilter (preemption) came to: its reason ("Preempted", "None", ...); '' when not run

    @property
    def bound(self) -> bool:
        return self.status.code is Code.SUCCESS


@dataclass(frozen=True)
class MemberDecision:
    pod: Mapping[str, Any]
    decision: Decision

    @property
    def name(self) -> str:
        return _name(self.pod)


@dataclass(frozen=True)
class GangDecision:
    """decide_gang's answer: SUCCESS when enough members are placeable now (those in `members`
    whose decision is SUCCESS), else the Gang plugin's refusal or a member's ERROR. `members`: each
    pending member's own decision, in index order (empty when too few members exist and the
    caller did not ask for every member's); `waits_on`: the refused member the gang waits for."""

    status: Status
    members: tuple[MemberDecision, ...]
    waits_on: MemberDecision | None = None

    @property
    def placeable(self) -> tuple[MemberDecision, ...]:
        return tuple(m for m in self.members if m.decision.status.ok)


@dataclass(frozen=True)
class GangOutcome:
    """What bind's attempt at a gang came to: the gang's status (SUCCESS: its placeable members
    bound), each pending member's own Outcome, and the member whose refusal it waits on (for the
    queue's hints: that member's plugin and node)."""

    status: Status
    members: tuple[tuple[Mapping[str, Any], Outcome], ...]
    waits_on: Outcome | None = None
    preemption: str = ""  # what PostFilter came to for the gang, as Outcome.preemption


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

    def decide_gang(self, gang: GangSnapshot, snapshot_of: Callable[[str], NodeSnapshot],
                    every_member: bool = False) -> GangDecision:
        """Each pending member decided alone on snapshots, and the Gang plugin's quorum: enough
        members exist, and enough pass their filters (bound members count). Nothing written.
        Members are decided only when enough exist, unless `every_member` (explain, plan)."""
        exist = gangs.members_exist(gang)
        if not exist.ok and not every_member:
            return GangDecision(exist, ())
        members = tuple(MemberDecision(pod, self.decide(pod, snapshot_of)) for pod in gang.pending)
        failed = next((m for m in members if m.decision.status.code is Code.ERROR), None)
        if failed is not None:
            return GangDecision(failed.decision.status, members, failed)
        if not exist.ok:
            return GangDecision(exist, members)
        refused = next((m for m in members if not m.decision.status.ok), None)
        placeable = sum(1 for m in members if m.decision.status.ok)
        if refused is None:
            return GangDecision(SUCCESS, members)
        return GangDecision(gangs.members_placeable(gang, placeable, _short(refused.pod), refused.decision.status), members,
                            refused)

    def schedule_gang(self, gang: GangSnapshot, cluster: Cluster) -> GangOutcome:
        """bind's attempt at a gang: decide_gang; then every placeable member assumed and
        reserved in (node, device) order, the quorum asked again, PreBind for all, and the
        Bindings (through cluster.each, concurrently where the shell can). A refusal or failure
        before the Bindings unreserves every member reserved, in reverse order, and forgets them."""
        decided = self.decide_gang(gang, cluster.snapshot)
        if not decided.status.ok:
            status, preemption, blocked = self._post_filter_gang(decided, cluster)
            # the queue's hint: the refused member's own plugin and node; after preemption, the
            # member it could not help (its events are the ones that can change the answer)
            waits_on_member = blocked or decided.waits_on
            waits_on = _outcome_of(waits_on_member, waits_on_member.decision.status) if waits_on_member else None
            if status.code is Code.ERROR:
                return GangOutcome(status, tuple((pod, Outcome(status, _node_of(pod, decided), POST_FILTER))
                                                 for pod in gang.pending), Outcome(status, "", POST_FILTER), preemption)
            return GangOutcome(status, tuple((pod, Outcome(status, _node_of(pod, decided), FILTER))
                                             for pod in gang.pending), waits_on, preemption)
        alone = tuple((m.pod, _outcome_of(m, m.decision.status)) for m in decided.members if not m.decision.status.ok)
        order = sorted(decided.placeable, key=lambda m: (m.decision.node.name, m.decision.entry.placement.devices))
        reserved: list[tuple[MemberDecision, list]] = []
        failure: tuple[Status, str, str, str] | None = None  # (status, member, node, phase)
        for member in order:
            member, status, plugins = self._reserve_member(member, cluster)
            if status.ok:
                reserved.append((member, plugins))
                continue
            failure = (status, _short(member.pod), member.decision.node.name if member.decision.node else "", RESERVE)
            break
        if failure is None:
            permit = gangs.members_reserved(gang, len(reserved))
            if not permit.ok:
                failure = (permit, "", "", PERMIT)
        if failure is None:
            for member, _ in reserved:
                status = _first_not_ok(self.profile.pre_bind, lambda p: p.pre_bind(
                    member.decision.state, member.pod, member.decision.node, cluster))
                if not status.ok:
                    failure = (status, _short(member.pod), member.decision.node.name, PRE_BIND)
                    break
        if failure is not None:
            self._release(reserved, cluster)
            status, member, node, phase = failure
            if status.refused and phase != PERMIT:
                status = gangs.members_reserved(gang, len(reserved), member, status)
            elif status.code is Code.ERROR and member:
                status = dataclasses.replace(status, message=f"gang {gang.name}: member {member}: {status.message}")
            return GangOutcome(status, tuple((m.pod, Outcome(status, m.decision.node.name if m.decision.node else "",
                                                             phase)) for m in decided.members) + (),
                               Outcome(status, node, phase))
        bound = cluster.each([lambda m=m: self._bind_member(m, plugins, cluster) for m, plugins in reserved])
        outcomes = tuple((m.pod, Outcome(status, m.decision.node.name, BIND))
                         for (m, _), status in zip(reserved, bound)) + alone
        failed_bind = next((o for _, o in outcomes if o.phase == BIND and not o.bound), None)
        return GangOutcome(failed_bind.status if failed_bind else SUCCESS, outcomes, failed_bind)

    def _reserve_member(self, member: MemberDecision, cluster: Cluster) -> tuple[MemberDecision, Status, list]:
        """Assume the member on its node (decided again while the node changed under the
        decision, as by earlier members of its own gang) and run Reserve; on a refusal, what it
        reserved is undone here."""
        for _ in range(STALE_TRIES):
            node = member.decision.node
            if cluster.assume(member.pod, node, member.decision.entry.placement.devices):
                break
            member = MemberDecision(member.pod, self.decide(member.pod, cluster.snapshot))
            if not member.decision.status.ok:
                return member, member.decision.status, []
        else:
            return member, error("", f"node {member.decision.node.name} changed {STALE_TRIES} times while deciding",
                                 RETRY), []
        state, node, reserved = member.decision.state, member.decision.node, []
        for plugin in self.profile.reserve:
            reserved.append(plugin)
            status = plugin.reserve(state, member.pod, node, cluster)
            if not status.ok:
                for done in reversed(reserved):
                    done.unreserve(state, member.pod, node, cluster)
                cluster.forget(member.pod, node.name)
                return member, status, []
        for plugin in self.profile.permit:
            status = plugin.permit(state, member.pod, node)
            if status.code is not Code.WAIT and not status.ok:  # the Gang plugin waits: the quorum decides
                for done in reversed(reserved):
                    done.unreserve(state, member.pod, node, cluster)
                cluster.forget(member.pod, node.name)
                return member, status, []
        return member, SUCCESS, reserved

    @staticmethod
    def _release(reserved: list[tuple[MemberDecision, list]], cluster: Cluster) -> None:
        for member, plugins in reversed(reserved):
            for plugin in reversed(plugins):
                plugin.unreserve(member.decision.state, member.pod, member.decision.node, cluster)
            cluster.forget(member.pod, member.decision.node.name)

    def _bind_member(self, member: MemberDecision, plugins: list, cluster: Cluster) -> Status:
        """One Binding of a gang. A member whose Binding failed keeps what was reserved for it:
        the others may be bound already, and its GPUs are its gang's; its records free themselves
        after their grace if it is never bound (or at once when it is deleted), and the next
        attempt, which counts the bound members, binds it."""
        state, node = member.decision.state, member.decision.node
        status = _first_not_ok(self.profile.bind, lambda p: p.bind(state, member.pod, node, cluster),
                               stop_at_success=True)
        if not (status.code is Code.SUCCESS and not status.reason):
            cluster.forget(member.pod, node.name)
        return status

    def _post_filter(self, pod, decision: Decision, cluster: Cluster) -> Outcome:
        """The refusal stands; PostFilter plugins may act so that a later attempt succeeds. What
        they did or why they could not is added to the refusal's message (kube-scheduler's
        "preemption: ..."); the refusing plugin stays, so its events retry the pod. An API failure
        of theirs is the attempt's ERROR: retried after the backoff."""
        refusal = decision.status
        for plugin in self.profile.post_filter:
            status = plugin.post_filter(decision.state, pod, decision.node, refusal, cluster)
            if status.code is Code.ERROR:
                return Outcome(status, decision.node.name, POST_FILTER, "Error")
            said = dataclasses.replace(refusal, message=f"{refusal.message}; preemption: {status.message}") \
                if status.message else refusal
            if status.code is Code.SUCCESS or plugin is self.profile.post_filter[-1]:
                return Outcome(said, decision.node.name, decision.phase, status.reason)
        return Outcome(refusal, decision.node.name, decision.phase)

    def _post_filter_gang(self, decided: GangDecision, cluster: Cluster
                          ) -> tuple[Status, str, MemberDecision | None]:
        """A gang refused because members are refused on their nodes (all exist): preemption for
        all of those members or none (plugins/defaultpreemption.py), its words added to the gang's;
        with the member preemption could not help, if any."""
        refusal = decided.status
        refused = [m for m in decided.members if not m.decision.status.ok]
        if not decided.members or not refused or refusal.code is Code.ERROR or \
                any(m.decision.node is None or not m.decision.status.refused for m in refused):
            return refusal, "", None
        for plugin in self.profile.post_filter:
            status, blocked = plugin.post_filter_gang([(m.decision.state, m.pod, m.decision.node, m.decision.status)
                                                       for m in refused], cluster)
            if status.code is Code.SKIP:
                continue
            if status.code is Code.ERROR:
                return status, "Error", None
            if status.message:
                refusal = dataclasses.replace(refusal, message=f"{refusal.message}; preemption: {status.message}")
            return refusal, status.reason, refused[blocked] if blocked is not None else None
        return refusal, "", None

    def _bind_cycle(self, pod, state: CycleState, node: NodeSnapshot, cluster: Cluster) -> Outcome:
        reserved: list = []

        def reserve(plugin) -> Status:
            reserved.append(plugin)
            return plugin.reserve(state, pod, node, cluster)

        def permit(plugin) -> Status:
            status = plugin.permit(state, pod, node)
            # only gang members wait, and bind places them with schedule_gang: a pod never waits alone
            return error(plugin.name, f"Permit asked to wait: {status.message}") \
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


def _name(pod: Mapping[str, Any]) -> str:
    meta = metadata(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _short(pod: Mapping[str, Any]) -> str:
    """A member in its gang's messages: its name alone (the message names the namespace already)."""
    return str(metadata(pod).get("name"))


def _outcome_of(member: MemberDecision, status: Status) -> Outcome:
    node = member.decision.node
    return Outcome(status, node.name if node else "", member.decision.phase)


def _node_of(pod: Mapping[str, Any], decided: GangDecision) -> str:
    for member in decided.members:
        if member.pod is pod:
            return member.decision.node.name if member.decision.node else ""
    return ""


def _first_not_ok(plugins, run: Callable[[Any], Status], stop_at_success: bool = False) -> Status:
    """Each plugin in turn until one does not succeed; at Bind, until one does not skip (the first
    binder that binds is the only one, as in kube-scheduler)."""
    for plugin in plugins:
        status = run(plugin)
        if not status.ok or (stop_at_success and status.code is not Code.SKIP):
            return status
    return SUCCESS
