"""Runs a profile (kube-scheduler's frameworkImpl, schedulingCycle and bindingCycle), in one cycle
for a pod and the pods scheduled with it.

`pre_enqueue` is asked before a pod is queued: a pod it refuses (gated) is never tried.
`schedule` is bind's whole attempt. The pod's PodGroup plugin names the pods that go with it (a
gang; a pod alone is a group of one) and each of them is decided on a snapshot of its node
(PreFilter, whose result names the node, then Filter). Permit's group quorum is asked before
anything is reserved, so a group that cannot complete holds nothing while it waits; refused,
PostFilter may act for every refused member or none. Then each placeable member is assumed and
reserved in one global (node, device) order (decided again when its node changed since its
snapshot), the quorum asked again, PreBind run for every member and only then the Bindings, side by
side. A failure before the Bindings unreserves every member, in reverse order, and forgets them.

`evaluate` is the same cycle's dry run: PreEnqueue, the group, PreFilter, Filter, the quorum and
PostFilter's choice, nothing written. It is the one answer to "what would bind do with this pod
now", which explain, `plan --cluster` and `suggest` render; bind's Events render `schedule`'s,
whose refusals carry the same words."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .interface import (
    BOUND_ANNOTATIONS, DEVICES, POD_INPUTS, RETRY, SUCCESS, Candidates, Cluster, Code, CycleState, PermitStage, PodGroup,
    PostFilterResult, Refusal, Status, error, inputs, unresolvable,
)
from ..fit import PodInfo
from ..podinputs import PodInputs
from .profile import Profile, Registry, build
from .snapshot import NodeSnapshot

STALE_TRIES = 20  # decisions of one attempt whose node changed before the pod was assumed on it
PRE_ENQUEUE, PRE_FILTER, FILTER, POST_FILTER, RESERVE, PERMIT, PRE_BIND, BIND = (
    "PreEnqueue", "PreFilter", "Filter", "PostFilter", "Reserve", "Permit", "PreBind", "Bind")
FRAMEWORK = "Framework"  # the plugin named in the framework's own refusals
# Candidates a refusal names one by one; the rest are counted by the plugin that refused them (a
# pool can have hundreds of entries, and an Event's message is read on one screen).
NAMED_CANDIDATES = 8


@dataclass(frozen=True)
class CandidateRefusal:
    """Why one of a pod's candidates (a pool's entry) was refused: kube-scheduler's NodeToStatus."""

    label: str
    node: str
    status: Status


@dataclass(frozen=True)
class Decision:
    """PreFilter and Filter's answer for one pod: SUCCESS (placeable on `node` now) or the first
    refusal."""

    status: Status
    node: NodeSnapshot | None  # None when PreFilter refused: no node was looked at
    state: CycleState
    phase: str
    # A pod of several candidates refused on all: each one's refusal (the queue waits for any of
    # their plugins' events on their nodes). `node` and `state` are then the candidate that
    # preemption may help, if any, else the first.
    diagnosis: tuple[CandidateRefusal, ...] = ()

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.state.read(DEVICES) or ())

    @property
    def node_name(self) -> str:
        return self.node.name if self.node else ""


@dataclass(frozen=True)
class MemberDecision:
    pod: Mapping[str, Any]
    inputs: PodInputs
    decision: Decision

    @property
    def name(self) -> str:
        return self.inputs.name


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to for one pod: bound (SUCCESS), refused, or an ERROR, and in which
    phase; `node` is the map's node ('' when refused before a node was looked at). `inputs`: the
    pod's, as its cycle worked them out (what the shell tells the pod is there too)."""

    pod: Mapping[str, Any]
    inputs: PodInputs
    status: Status
    node: str
    phase: str
    decision: Decision | None = None

    @property
    def bound(self) -> bool:
        return self.status.code is Code.SUCCESS

    @property
    def uid(self) -> str:
        return self.inputs.uid

    def of(self, pod: Mapping[str, Any]) -> bool:
        return _same(pod, self.pod)


@dataclass(frozen=True)
class CycleOutcome:
    """What `schedule` came to: the group's status (SUCCESS: its placeable members bound), each
    pending member's Outcome (the pod first tried among them), the member whose refusal the group
    waits on (its plugin's events retry it), and what PostFilter came to ('' when not run)."""

    status: Status
    group: PodGroup
    members: tuple[Outcome, ...]
    waits_on: Outcome | None = None
    preemption: str = ""

    def of(self, uid: str) -> Outcome | None:
        return next((m for m in self.members if m.uid == uid), None)


@dataclass(frozen=True)
class Verdict:
    """What `evaluate` found, nothing written: the group's status and phase, each pending member's
    decision, the member the group waits on, and PostFilter's choice where it ran."""

    status: Status
    phase: str
    group: PodGroup
    members: tuple[MemberDecision, ...]
    waits_on: MemberDecision | None = None
    post_filter: PostFilterResult | None = None

    @property
    def placeable(self) -> bool:
        return self.status.ok

    def of(self, pod: Mapping[str, Any]) -> MemberDecision | None:
        return next((m for m in self.members if _same(pod, m.pod)), None)


@dataclass(frozen=True)
class _Quorum:
    """The group's members decided, and whether enough of them can go now."""

    status: Status
    phase: str
    group: PodGroup
    members: tuple[MemberDecision, ...]
    refused: tuple[MemberDecision, ...]

    @property
    def waits_on(self) -> MemberDecision | None:
        return self.refused[0] if self.refused else None


class Framework:
    def __init__(self, profile: Profile):
        self.profile = profile

    @classmethod
    def from_config(cls, config: Mapping[str, Any], registry: Registry) -> "Framework":
        """The framework of a profile given as data; its plugins get this framework as their handle."""
        framework = cls(Profile())
        framework.profile = build(config, registry, framework)
        return framework

    # -- what plugins ask of the framework (kube-scheduler's framework.Handle) ------------------
    def run_filters(self, state: CycleState, pod: Mapping[str, Any], node: NodeSnapshot) -> Status:
        """The one filter loop: each Filter plugin in turn on `node` until one refuses."""
        for plugin in self.profile.filter:
            status = plugin.filter(state, pod, node)
            if not status.ok:
                return status
        return SUCCESS

    def assume(self, decision: Decision, pod: Mapping[str, Any]) -> NodeSnapshot:
        """The decided node's snapshot with `pod` on it, as bind's cache holds an assumed pod
        (its devices counted), and each Reserve plugin's hold (a DRA claim's devices): a dry run
        that places one pod after another (suggest) decides each on what the earlier ones took."""
        node = decision.node
        meta = dict(as_bound(pod, decision.state).get("metadata") or {})
        meta.setdefault("uid", f"assumed/{meta.get('namespace')}/{meta.get('name')}")
        placed = {**pod, "metadata": meta, "spec": {**(pod.get("spec") or {}), "nodeName": node.name}}
        info = dataclasses.replace(PodInfo.of(placed), devices=decision.devices)
        node = dataclasses.replace(node, info=node.info.plus(info), generation=node.generation + 1)
        for plugin in self.profile.reserve:
            node = plugin.assume(decision.state, placed, node)
        return node

    # -- PreEnqueue ------------------------------------------------------------------------------
    def pre_enqueue(self, pod: Mapping[str, Any]) -> Status:
        """Whether the pod may be queued at all (its scheduling gates)."""
        return _first_not_ok(self.profile.pre_enqueue, lambda p: p.pre_enqueue(pod))

    # -- the decision ----------------------------------------------------------------------------
    def decide(self, pod: Mapping[str, Any], snapshot_of: Callable[[str], NodeSnapshot],
               mine: PodInputs | None = None) -> Decision:
        """PreFilter, then Filter on the node PreFilter's results name, on its snapshot. `mine`: the
        pod's inputs as its cycle worked them out (worked out here when it has none: a dry run's)."""
        state = CycleState()
        mine = mine or PodInputs.of(pod)
        state.write(POD_INPUTS, mine)  # read by every plugin of the cycle, none reads the pod again
        nodes: frozenset[str] | None = None
        offered: Candidates | None = None
        for plugin in self.profile.pre_filter:
            result = plugin.pre_filter(state, pod)
            if not result.status.ok:
                return Decision(result.status, None, state, PRE_FILTER)
            if result.node_names is not None:
                nodes = result.node_names if nodes is None else nodes & result.node_names
            if result.candidates is not None:
                offered = result.candidates
        if offered is not None:
            return self._decide_among(pod, state, offered, nodes, snapshot_of)
        if not nodes:
            why = ("no PreFilter plugin named a node for the pod" if nodes is None else
                   "the PreFilter plugins named no node in common")
            return Decision(unresolvable(FRAMEWORK, why), None, state, PRE_FILTER)
        # A pinned pod has one candidate; were there several, the first that fits (no scoring).
        decision = None
        for name in sorted(nodes):
            node = snapshot_of(name)
            uid = mine.uid
            if uid in node.info.uids:  # the pod itself, listed on its node already (a retry): not its own neighbour
                node = dataclasses.replace(node, info=node.info.without(uid))
            status = self.run_filters(state, pod, node)
            decision = Decision(status, node, state, FILTER)
            if status.ok:
                break
        return decision

    def _decide_among(self, pod: Mapping[str, Any], state: CycleState, offered: Candidates,
                      nodes: frozenset[str] | None, snapshot_of: Callable[[str], NodeSnapshot]) -> Decision:
        """Filter on each candidate in turn, each on a copy of the state with the candidate's
        writes, until one passes. Refused on all: one refusal naming each candidate's reason, as
        kube-scheduler summarises its nodes; Unschedulable when preemption may help on one of them."""
        uid = inputs(state, pod).uid
        snapshots: dict[str, NodeSnapshot] = {}
        refusals: list[tuple[CandidateRefusal, NodeSnapshot, CycleState]] = []
        for candidate in offered.options:
            if nodes is not None and candidate.node not in nodes:
                continue
            node = snapshots.get(candidate.node)
            if node is None:
                node = snapshot_of(candidate.node)
                if uid in node.info.uids:  # the pod itself, listed on its node already (a retry)
                    node = dataclasses.replace(node, info=node.info.without(uid))
                snapshots[candidate.node] = node
            trial = state.clone()
            for key, value in candidate.writes.items():
                trial.write(key, value)
            status = self.run_filters(trial, pod, node)
            if status.ok:
                return Decision(status, node, trial, FILTER)
            if status.code is Code.ERROR:
                return Decision(status, node, trial, FILTER)
            refusals.append((CandidateRefusal(candidate.label, candidate.node, status), node, trial))
        if not refusals:
            return Decision(unresolvable(FRAMEWORK, f"{offered.none_fits}: the PreFilter plugins allow none of its"
                                                    " nodes"), None, state, PRE_FILTER)
        helped = next((r for r in refusals if r[0].status.preemption_may_help), refusals[0])
        first = helped[0].status
        code = Code.UNSCHEDULABLE if first.preemption_may_help else Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        status = Status(code, first.plugin, _summary(offered, [r[0] for r in refusals]), first.reason)
        return Decision(status, helped[1], helped[2], FILTER, tuple(r[0] for r in refusals))

    def group_of(self, pod: Mapping[str, Any], cluster: Any, mine: PodInputs | None = None) -> PodGroup:
        """The pods that go through the cycle with `pod` (whose inputs are `mine`, worked out here
        when not given): its PodGroup plugin's group, without the members PreEnqueue holds back (a
        gated member is not there yet), or `pod` alone; each member with its inputs (the plugin's)."""
        mine = mine or PodInputs.of(pod)
        for plugin in self.profile.pod_group:
            group = plugin.pod_group(pod, mine, cluster)
            if group is not None:
                kept = [(m, i) for m, i in zip(group.pending, group.pending_inputs)
                        if i.key == mine.key or self.pre_enqueue(m).ok]
                return dataclasses.replace(group, pending=tuple(m for m, _ in kept),
                                           pending_inputs=tuple(i for _, i in kept))
        return _alone(pod, mine)

    def _quorum(self, group: PodGroup, snapshot_of: Callable[[str], NodeSnapshot], every_member: bool = False
                ) -> _Quorum:
        """Each pending member decided on its own, then the group's quorum (Permit, FILTERED).
        Members are decided only when the quorum could be met were every one placeable (enough
        exist), unless `every_member` (explain, plan: each member's own answer is shown)."""
        if not every_member and not group.alone:
            could = self._permit_group(group, PermitStage.FILTERED, len(group.pending), None)
            if could is not None and not could.ok:
                return _Quorum(could, FILTER, group, (), ())
        members = self._decide_members(group, snapshot_of)
        failed = next((m for m in members if m.decision.status.code is Code.ERROR), None)
        if failed is not None:
            return _Quorum(failed.decision.status, failed.decision.phase, group, members, (failed,))
        refused = tuple(m for m in members if not m.decision.status.ok)
        placeable = len(members) - len(refused)
        first = refused[0] if refused else None
        status = self._permit_group(group, PermitStage.FILTERED, placeable, first)
        if status is None:  # no plugin decides for the group: every member must be placeable (a pod alone)
            status = first.decision.status if first else SUCCESS
        # a member's own refusal keeps its phase; the group's quorum is asked after Filter
        phase = first.decision.phase if first and status is first.decision.status else FILTER
        return _Quorum(status, phase, group, members, refused)

    def _decide_members(self, group: PodGroup, snapshot_of: Callable[[str], NodeSnapshot]
                        ) -> tuple[MemberDecision, ...]:
        """Each pending member decided in turn, a group's on the snapshots with its earlier
        placeable members assumed: members that choose among places (a pool's entries) then take
        different ones, and what earlier members take counts for the later ones."""
        if group.alone:
            return tuple(MemberDecision(pod, mine, self.decide(pod, snapshot_of, mine))
                         for pod, mine in zip(group.pending, group.pending_inputs))
        taken: dict[str, NodeSnapshot] = {}

        def with_taken(name: str) -> NodeSnapshot:
            return taken[name] if name in taken else snapshot_of(name)

        members = []
        for pod, mine in zip(group.pending, group.pending_inputs):
            decision = self.decide(pod, with_taken, mine)
            if decision.status.ok and decision.node is not None:
                taken[decision.node.name] = self.assume(decision, pod)
            members.append(MemberDecision(pod, mine, decision))
        return tuple(members)

    def _permit_group(self, group: PodGroup, stage: PermitStage, ready: int, first: MemberDecision | None,
                      lost: tuple[str, Status] | None = None) -> Status | None:
        waits_on, refusal = (lost if lost else (_short(first.pod), first.decision.status) if first else ("", None))
        for plugin in self.profile.permit:
            status = plugin.permit_group(group, stage, ready, waits_on, refusal)
            if status.code is not Code.SKIP:
                return status
        return None

    def _refusals(self, quorum: _Quorum) -> list[Refusal]:
        """The refused members PostFilter may help: each refused on its node, every one of them."""
        refusals = [Refusal(m.pod, m.decision.state, m.decision.node, m.decision.status) for m in quorum.refused
                    if m.decision.node is not None and m.decision.status.refused]
        return refusals if quorum.refused and len(refusals) == len(quorum.refused) else []

    def evaluate(self, pod: Mapping[str, Any], cluster: Any) -> Verdict:
        """What bind's next attempt would decide for `pod` and its group, nothing written."""
        mine = PodInputs.of(pod)
        status = self.pre_enqueue(pod)
        if not status.ok:
            return Verdict(status, PRE_ENQUEUE, _alone(pod, mine), ())
        group = self.group_of(pod, cluster, mine)
        cluster.group_formed(group.pending)
        quorum = self._quorum(group, cluster.snapshot, every_member=True)
        waits_on = quorum.waits_on
        if quorum.status.ok or quorum.status.code is Code.ERROR:
            return Verdict(quorum.status, quorum.phase, group, quorum.members, waits_on)
        refusals, chosen = self._refusals(quorum), None
        for plugin in self.profile.post_filter if refusals else ():
            chosen = plugin.select(group, refusals, cluster)
            if chosen.status.code is not Code.SKIP:
                break
        status = _with_post_filter(quorum.status, chosen)
        if chosen is not None and chosen.blocked is not None:
            waits_on = next(m for m in quorum.refused if m.pod is refusals[chosen.blocked].pod)
        return Verdict(status, quorum.phase, group, quorum.members, waits_on, chosen)

    # -- bind's attempt ----------------------------------------------------------------------------
    def schedule(self, pod: Mapping[str, Any], cluster: Cluster) -> CycleOutcome:
        """bind's attempt at `pod` and its group (the module's docstring). The pod's inputs are
        worked out here, once: its group's plugins, its cycle's and the shell read them."""
        mine = PodInputs.of(pod)
        status = self.pre_enqueue(pod)
        if not status.ok:
            return CycleOutcome(status, _alone(pod, mine), (Outcome(pod, mine, status, "", PRE_ENQUEUE),))
        name = next((n for n in (p.group_name(mine) for p in self.profile.pod_group) if n is not None), None)
        if name is None:
            return self._cycle(pod, mine, _alone(pod, mine), cluster)
        with cluster.group_lock(name):  # one attempt per group at a time in this instance
            if cluster.assumed(pod):  # bound with its group by the attempt this one waited for
                done = Status(Code.SUCCESS, "", f"bound with {name}", already_bound=True)
                return CycleOutcome(done, PodGroup(name, 1, (pod,), pending_inputs=(mine,)),
                                    (Outcome(pod, mine, done, "", BIND),))
            return self._cycle(pod, mine, self.group_of(pod, cluster, mine), cluster)  # as it is after that attempt

    def _cycle(self, pod: Mapping[str, Any], mine: PodInputs, group: PodGroup, cluster: Cluster) -> CycleOutcome:
        cluster.group_formed(group.pending)
        quorum = self._quorum(group, cluster.snapshot)
        if not quorum.status.ok:
            return self._refused(quorum, cluster)
        alone = tuple(_outcome(m, m.decision.status) for m in quorum.refused)
        order = sorted((m for m in quorum.members if m.decision.status.ok),
                       key=lambda m: (m.decision.node_name, m.decision.devices))
        reserved: list[tuple[MemberDecision, list]] = []
        failure: tuple[Status, str, str, str] | None = None  # (status, member, node, phase)
        for member in order:
            member, status, plugins, phase = self._reserve(member, group, cluster)
            if status.ok:
                reserved.append((member, plugins))
                continue
            failure = (status, _short(member.pod), member.decision.node_name, phase)
            break
        if failure is None:
            permit = self._permit_group(group, PermitStage.RESERVED, len(reserved), None)
            if permit is not None and not permit.ok:
                failure = (permit, "", "", PERMIT)
        if failure is None:
            for member, _ in reserved:
                status = _first_not_ok(self.profile.pre_bind, lambda p, m=member: p.pre_bind(
                    m.decision.state, m.pod, m.decision.node, cluster))
                if not status.ok:
                    failure = (status, _short(member.pod), member.decision.node_name, PRE_BIND)
                    break
        if failure is not None:
            self._release(reserved, cluster)
            status, member, node, phase = failure
            if not group.alone and member:
                if status.refused and phase != PERMIT:
                    status = self._permit_group(group, PermitStage.RESERVED, len(reserved), None,
                                                (member, status)) or status
                elif status.code is Code.ERROR:
                    status = dataclasses.replace(status, message=f"gang {group.name}: member {member}: {status.message}")
            members = tuple(Outcome(m.pod, m.inputs, status, m.decision.node_name, phase, m.decision)
                            for m in quorum.members)
            return CycleOutcome(status, group, members, Outcome(pod, mine, status, node, phase))
        bound = cluster.each([lambda m=m, p=p: self._bind(m, p, group, cluster) for m, p in reserved])
        outcomes = tuple(Outcome(m.pod, m.inputs, status, m.decision.node_name, BIND, m.decision)
                         for (m, _), status in zip(reserved, bound)) + alone
        failed = next((o for o in outcomes if o.phase == BIND and not o.bound), None)
        return CycleOutcome(failed.status if failed else SUCCESS, group, _first(pod, outcomes), failed)

    def _refused(self, quorum: _Quorum, cluster: Cluster) -> CycleOutcome:
        """The group refused (or an ERROR while deciding): PostFilter may act for every refused
        member or none; its words are added to the refusal, whose plugin stays (its events retry
        the group). An API failure of PostFilter's is the attempt's ERROR, retried after the backoff."""
        status, waits_on, preemption, phase = quorum.status, quorum.waits_on, "", quorum.phase
        refusals = self._refusals(quorum) if status.code is not Code.ERROR else []
        for plugin in self.profile.post_filter if refusals else ():
            result = plugin.post_filter(quorum.group, refusals, cluster)
            if result.status.code is Code.SKIP:
                continue
            preemption = result.outcome
            if result.status.code is Code.ERROR:
                status, phase = result.status, POST_FILTER
                break
            status = _with_post_filter(status, result)
            if result.blocked is not None:
                waits_on = next(m for m in quorum.refused if m.pod is refusals[result.blocked].pod)
            break
        decided = {id(m.pod): m.decision for m in quorum.members}
        group = quorum.group
        members = tuple(Outcome(p, i, status, decided[id(p)].node_name if id(p) in decided else "", phase,
                                decided.get(id(p)))
                        for p, i in zip(group.pending, group.pending_inputs))
        waits = _outcome(waits_on, waits_on.decision.status) if waits_on else None
        if status.code is Code.ERROR and phase == POST_FILTER:
            waits = Outcome(group.pending[0], group.pending_inputs[0], status, "", POST_FILTER)
        return CycleOutcome(status, quorum.group, members, waits, preemption)

    def _reserve(self, member: MemberDecision, group: PodGroup, cluster: Cluster
                 ) -> tuple[MemberDecision, Status, list, str]:
        """Assume the member on its node (decided again while the node changed under the decision,
        as by earlier members of its own group), then Reserve and Permit; on a refusal, what it
        reserved is undone here."""
        for _ in range(STALE_TRIES):
            if cluster.assume(as_bound(member.pod, member.decision.state), member.decision.node,
                              member.decision.devices):
                break
            decision = self.decide(member.pod, cluster.snapshot, member.inputs)
            member = MemberDecision(member.pod, member.inputs, decision)
            if not member.decision.status.ok:
                return member, member.decision.status, [], member.decision.phase
        else:
            return member, error("", f"node {member.decision.node_name} changed {STALE_TRIES} times while deciding",
                                 RETRY), [], RESERVE
        state, node, pod, reserved = member.decision.state, member.decision.node, member.pod, []
        failure: tuple[Status, str] | None = None
        for plugin in self.profile.reserve:
            reserved.append(plugin)
            status = plugin.reserve(state, pod, node, cluster)
            if not status.ok:
                failure = (status, RESERVE)
                break
        for plugin in self.profile.permit if failure is None else ():
            status = plugin.permit(state, pod, node)
            if status.code is Code.WAIT and group.alone:
                failure = (error(plugin.name, f"Permit asked a pod alone to wait: {status.message}"), PERMIT)
            elif status.code is not Code.WAIT and not status.ok:
                failure = (status, PERMIT)
            if failure:
                break
        if failure is not None:
            for done in reversed(reserved):
                done.unreserve(state, pod, node, cluster)
            cluster.forget(pod, node.name)
            return member, failure[0], [], failure[1]
        return member, SUCCESS, reserved, RESERVE

    @staticmethod
    def _release(reserved: list[tuple[MemberDecision, list]], cluster: Cluster) -> None:
        for member, plugins in reversed(reserved):
            for plugin in reversed(plugins):
                plugin.unreserve(member.decision.state, member.pod, member.decision.node, cluster)
            cluster.forget(member.pod, member.decision.node.name)

    def _bind(self, member: MemberDecision, plugins: list, group: PodGroup, cluster: Cluster) -> Status:
        """One Binding. A pod alone whose Binding failed gives back what it reserved. A group's
        member keeps it: the others may be bound already, and its GPUs are its group's; its
        records free themselves after their grace if it is never bound (or at once when it is
        deleted), and the next attempt, which counts the bound members, binds it."""
        state, node, pod = member.decision.state, member.decision.node, member.pod
        status = _first_not_ok(self.profile.bind, lambda p: p.bind(state, pod, node, cluster), stop_at_success=True)
        if status.code is Code.SUCCESS and not status.already_bound:
            return status
        if status.code is not Code.SUCCESS and group.alone:  # already bound keeps its records: the pod holds them
            for plugin in reversed(plugins):
                plugin.unreserve(state, pod, node, cluster)
        cluster.forget(pod, node.name)
        return status


def as_bound(pod: Mapping[str, Any], state: CycleState) -> Mapping[str, Any]:
    """`pod` with the annotations its Binding will write (BOUND_ANNOTATIONS): what it holds once bound."""
    written = state.read(BOUND_ANNOTATIONS)
    if not written:
        return pod
    meta = pod.get("metadata") or {}
    return {**pod, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **written}}}


def _summary(offered: Candidates, refusals: Sequence[CandidateRefusal]) -> str:
    """`none_fits`, then each candidate's refusal (the first NAMED_CANDIDATES by name, the rest
    counted by plugin), then the fix."""
    named = "; ".join(f"{r.label}: {r.status.message}" for r in refusals[:NAMED_CANDIDATES])
    rest: dict[str, int] = {}
    for refusal in refusals[NAMED_CANDIDATES:]:
        rest[refusal.status.plugin] = rest.get(refusal.status.plugin, 0) + 1
    more = (f"; and {len(refusals) - NAMED_CANDIDATES} more, refused by "
            + ", ".join(f"{plugin} ({count})" for plugin, count in sorted(rest.items()))) if rest else ""
    fix = f". {offered.fix}" if offered.fix else ""
    return f"{offered.none_fits} ({len(refusals)} refused): {named}{more}{fix}"


def _with_post_filter(refusal: Status, result: PostFilterResult | None) -> Status:
    """The refusal, with what PostFilter said added (kube-scheduler's "...; preemption: ...")."""
    if result is None or not result.status.message or result.status.code is Code.ERROR:
        return refusal
    return dataclasses.replace(refusal, message=f"{refusal.message}; {result.status.message}")


def _same(pod: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """The same pod: by UID, or by name for pods not created yet (plan's)."""
    return other is pod or _key(other) == _key(pod)


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _first(pod: Mapping[str, Any], outcomes: Sequence[Outcome]) -> tuple[Outcome, ...]:
    return tuple(sorted(outcomes, key=lambda o: o.pod is not pod))


def _alone(pod: Mapping[str, Any], mine: PodInputs) -> PodGroup:
    """The group of a pod that goes alone."""
    return PodGroup(mine.name, 1, (pod,), pending_inputs=(mine,))


def _short(pod: Mapping[str, Any]) -> str:
    """A member in its group's messages: its name alone (the message names the namespace already)."""
    return str((pod.get("metadata") or {}).get("name"))


def _outcome(member: MemberDecision, status: Status) -> Outcome:
    return Outcome(member.pod, member.inputs, status, member.decision.node_name, member.decision.phase,
                   member.decision)


def _first_not_ok(plugins, run: Callable[[Any], Status], stop_at_success: bool = False) -> Status:
    """Each plugin in turn until one does not succeed; at Bind, until one does not skip (the first
    binder that binds is the only one, as in kube-scheduler)."""
    for plugin in plugins:
        status = run(plugin)
        if not status.ok or (stop_at_success and status.code is not Code.SKIP):
            return status
    return SUCCESS
