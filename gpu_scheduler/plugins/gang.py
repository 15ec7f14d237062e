"""Gang (PodGroup, PreFilter, Permit): a workload's replicas bound together, or none of them holding
anything (docs/gangs.md). The pod template opts in with `gpu-scheduler/gang`: "true" (every pod of
the gang) or N (that many replicas). The gang is the workload (fit.gang_key: one controller in one
namespace; a whole JobSet, all its replicated jobs; one group of a LeaderWorkerSet, its leader and
workers), and its members are its non-terminal pods; bound members count toward the quorum,
as in scheduler-plugins' coscheduling, so a member re-created while the rest are bound goes alone.

This module is the one place that knows a pod's gang; what a pod asks of it (gangask.py) is read
once per cycle with the rest of its inputs (PodInputs), which every part here reads. PodGroup forms
the gang from the workload's pods (the handle's WorkloadPods lister), each member with its inputs;
the framework leaves out members PreEnqueue holds back (a gated member is not there yet).
PreFilter refuses a malformed value (only the pod can fix it). Permit
is the quorum, asked of the group by the framework's one cycle: enough members exist, enough are
placeable on their own (nothing reserved yet), enough are reserved. Nothing is reserved before the
second says yes, so a gang that cannot complete holds no device while it waits; kube-scheduler's
coscheduling instead holds a waiting pod's reservation in Permit.

"Enough members exist" is coscheduling's PreEnqueue; here it is the first answer of the Permit
quorum, because bind tells each waiting member how many exist (a FailedScheduling Event, kept
current), and PreEnqueue refusals are silent by kube-scheduler's rule (a gated pod gets no Event)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from ..framework.interface import (
    ANY_NODE_RESULT, SKIP, SUCCESS, Code, CycleState, PermitPlugin, PermitStage, PodGroup, PodGroupPlugin,
    PreFilterPlugin, PreFilterResult, Status, inputs, unresolvable, unschedulable,
)
from ..fit import gang_key
from ..gangask import gang_ask, gang_name_of
from ..podinputs import PodInputs

NAME = "Gang"
SIZE = "Gang/size"  # CycleState: the gang size the pod asks for, None when it is no gang's member
MEMBERS_MISSING, MEMBERS_REFUSED, RESERVATION_LOST = "GangMembersMissing", "GangMemberRefused", "GangReservationLost"


def gang_name(pod: Mapping[str, Any]) -> str:
    """The gang as users know it (gang_name_of the pod's gang_key)."""
    return gang_name_of(gang_key(pod))


def gang_of(pod: Mapping[str, Any], mine: PodInputs, pending: Iterable[Mapping[str, Any]], bound: Iterable[str]
            ) -> PodGroup | None:
    """The gang `pod` (whose inputs are `mine`) belongs to, from its workload's pending pods that ask
    for a gang and its bound pods' names (`pod` itself among the pending ones or not), each member
    with its inputs; None when it is no gang's member (or its ask is malformed: PreFilter refuses it)."""
    if mine.gang_ask.size is None:
        return None
    # each listed pod read once, here: its inputs say whether it asks for a gang, and its order
    listed = ((p, PodInputs.of(p)) for p in pending)
    members = {m.key: (p, m) for p, m in listed if m.gang_ask.size is not None}
    members[mine.key] = (pod, mine)
    ordered = sorted(members.values(), key=lambda member: member[1].order)
    return PodGroup(mine.gang_name, mine.gang_ask.size, tuple(p for p, _ in ordered), tuple(sorted(bound)),
                    NAME, tuple(m for _, m in ordered))


def gang_size_or_none(pod: Mapping[str, Any]) -> int | None:
    return gang_ask(pod).size


def members_exist(gang: PodGroup) -> Status:
    """The first quorum: enough members exist at all (bound or pending)."""
    have = len(gang.pending) + len(gang.bound)
    if have >= gang.min_count:
        return SUCCESS
    return unschedulable(NAME, f"gang {gang.name}: {have} of {gang.min_count} members exist; bind places none until"
                               f" {gang.min_count} do (a StatefulSet creates them together only with podManagementPolicy:"
                               " Parallel)", MEMBERS_MISSING)


def members_placeable(gang: PodGroup, placeable: int, refused_member: str, refusal: Status) -> Status:
    """The second quorum: enough members pass the filters on their own nodes, nothing reserved
    yet. `refused_member` and `refusal`: the first member refused, the one the gang waits on."""
    have = placeable + len(gang.bound)
    if have >= gang.min_count:
        return SUCCESS
    bound = f" ({len(gang.bound)} bound)" if gang.bound else ""
    return Status(refusal.code if refusal.refused else Code.UNSCHEDULABLE, NAME,
                  f"gang {gang.name}: {have} of {gang.min_count} members placeable{bound}; member {refused_member}:"
                  f" {refusal.message}", MEMBERS_REFUSED)


def members_reserved(gang: PodGroup, reserved: int, lost_member: str = "", refusal: Status | None = None) -> Status:
    """The third quorum: enough members reserved (their devices recorded, their claims allocated)."""
    if reserved + len(gang.bound) >= gang.min_count:
        return SUCCESS
    why = f"; member {lost_member}: {refusal.message}" if refusal is not None else ""
    return unschedulable(NAME, f"gang {gang.name}: {reserved + len(gang.bound)} of {gang.min_count} members reserved,"
                               f" the rest released{why}", RESERVATION_LOST)


@dataclass(frozen=True)
class WorkloadMembers:
    """A workload's pods as a lister sees them: its pending pods of ours, and its bound ones' names."""

    pending: Sequence[Mapping[str, Any]]
    bound: Sequence[str]


class WorkloadPods(Protocol):
    """What Gang reads of the handle: the pods of one gang (fit.gang_key: a workload, or one group
    of a LeaderWorkerSet)."""

    def workload_pods(self, key: tuple[str, ...]) -> WorkloadMembers: ...


class Gang(PodGroupPlugin, PreFilterPlugin, PermitPlugin):
    name = NAME
    # A gang waits on its members: their own refusals are retried on their plugins' events, and a
    # new member is a new pod (always tried). Nothing else can undo a gang's refusal.

    def pod_group(self, pod: Mapping[str, Any], mine: PodInputs, cluster: WorkloadPods) -> PodGroup | None:
        """The pod's gang; None when it asks for none (a malformed ask too: PreFilter refuses it)."""
        if mine.gang_ask.size is None:
            return None
        members = cluster.workload_pods(mine.gang)
        return gang_of(pod, mine, members.pending, members.bound)

    def group_name(self, mine: PodInputs) -> str | None:
        return mine.gang_name if mine.gang_ask.size is not None else None

    def pre_filter(self, state: CycleState, pod) -> PreFilterResult:
        ask = inputs(state, pod).gang_ask
        if ask.problem:
            return PreFilterResult(unresolvable(NAME, ask.problem, "InvalidGang"))
        state.write(SIZE, ask.size)
        return ANY_NODE_RESULT

    def permit(self, state: CycleState, pod, node) -> Status:
        """A member goes with its gang: the quorum (permit_group) decides for all of them."""
        if state.read(SIZE) is None:
            return SKIP
        return Status(Code.WAIT, NAME, "a gang member is placed with its gang")

    def permit_group(self, group: PodGroup, stage: PermitStage, ready: int, waits_on: str = "",
                     refusal: Status | None = None) -> Status:
        if group.plugin != NAME:
            return SKIP
        if stage is PermitStage.RESERVED:
            return members_reserved(group, ready, waits_on, refusal)
        exist = members_exist(group)
        if not exist.ok:
            return exist
        if refusal is None:
            return SUCCESS if ready + len(group.bound) >= group.min_count else unschedulable(
                NAME, f"gang {group.name}: {ready + len(group.bound)} of {group.min_count} members placeable",
                MEMBERS_REFUSED)
        return members_placeable(group, ready, waits_on, refusal)
