"""Gang (PodGroup, PreFilter, Permit): a workload's replicas bound together, or none of them holding
anything (docs/gangs.md). The pod template opts in with `gpu-scheduler/gang`: "true" (every pod of
the gang) or N (that many replicas). The gang is the workload (fit.gang_key: one controller in one
namespace; a whole JobSet, all its replicated jobs; one group of a LeaderWorkerSet, its leader and
workers), and its members are its non-terminal pods; bound members count toward the quorum,
as in scheduler-plugins' coscheduling, so a member re-created while the rest are bound goes alone.

This module is the one place that knows a pod's gang. PodGroup forms it from the workload's pods
(the handle's WorkloadPods lister); the framework leaves out members PreEnqueue holds back (a gated
member is not there yet). PreFilter refuses a malformed value (only the pod can fix it). Permit
is the quorum, asked of the group by the framework's one cycle: enough members exist, enough are
placeable on their own (nothing reserved yet), enough are reserved. Nothing is reserved before the
second says yes, so a gang that cannot complete holds no device while it waits; kube-scheduler's
coscheduling instead holds a waiting pod's reservation in Permit.

"Enough members exist" is coscheduling's PreEnqueue; here it is the first answer of the Permit
quorum, because bind tells each waiting member how many exist (a FailedScheduling Event, kept
current), and PreEnqueue refusals are silent by kube-scheduler's rule (a gated pod gets no Event)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from ..framework.interface import (
    ANY_NODE_RESULT, SKIP, SUCCESS, Code, CycleState, PermitPlugin, PermitStage, PodGroup, PodGroupPlugin,
    PreFilterPlugin, PreFilterResult, Status, inputs, unresolvable, unschedulable,
)
from ..fit import GANG_ANNOTATION, gang_key, workload
from ..placement import map_text, metadata, spec
from ..podindex import LWS_SIZE_ANNOTATION, IndexUnknown, pod_index
from ..schedmap import MapError, parse_map, shown

if TYPE_CHECKING:  # PodInputs.of reads gang_ask here: the core's module imports this one
    from ..podinputs import PodInputs

NAME = "Gang"
# Written by mutate on a JobSet's pods that ask for a gang: how many pods the JobSet's gang has.
GANG_SIZE = "gpu-scheduler/gang-size"
SIZE = "Gang/size"  # CycleState: the gang size the pod asks for, None when it is no gang's member
MEMBERS_MISSING, MEMBERS_REFUSED, RESERVATION_LOST = "GangMembersMissing", "GangMemberRefused", "GangReservationLost"
# kube-scheduler's own gangs (Kubernetes 1.36+, feature gate GenericWorkload): a pod names its
# PodGroup in spec.schedulingGroup.podGroupName. bind does not run them; the Warning Event it
# gives such a pod once (upstream_gang_notice) has this reason.
UPSTREAM_POD_GROUP = "UpstreamPodGroupIgnored"


class GangError(ValueError):
    """A malformed gpu-scheduler/gang value, in words that name the fix."""


@dataclass(frozen=True)
class GangAsk:
    """What a pod's gpu-scheduler/gang asks for: its gang's size (None: no gang), or, for a
    malformed value, why (`problem`, GangError's words, with which PreFilter refuses the pod)."""

    size: int | None = None
    problem: str = ""

    @property
    def asked(self) -> bool:
        """The pod names a gang, well-formed or not."""
        return self.size is not None or bool(self.problem)


def gang_ask(pod: Mapping[str, Any]) -> GangAsk:
    """gang_size as a value: the size, or the problem."""
    try:
        return GangAsk(gang_size(pod))
    except GangError as why:
        return GangAsk(problem=str(why))


def gang_size(pod: Mapping[str, Any]) -> int | None:
    """How many replicas the pod's gang needs, or None when the pod is no gang's member.
    GangError for a value that is neither "true", "false" nor a number from 1 to the gang's pods.

    "true" is every pod the gang can have: every entry of the map; a LeaderWorkerSet group's
    `size`; for a JobSet, replicas × parallelism summed over its replicated jobs that ask for the
    gang (mutate reads the JobSet and writes it, GANG_SIZE)."""
    meta = metadata(pod)
    annotations = meta.get("annotations") or {}
    value = annotations.get(GANG_ANNOTATION) if isinstance(annotations, Mapping) else None
    if value is None or value == "false":
        return None
    fix = (f'set {GANG_ANNOTATION} to "true" (the gang is every pod of the workload), to the number of replicas'
           ' the gang needs, or to "false"')
    if not isinstance(value, str) or not (value == "true" or (value.isascii() and value.isdigit())):
        raise GangError(f"{GANG_ANNOTATION}: {shown(value)} is not a gang size: {fix}")
    whole, what = _whole_gang(pod, annotations)
    if value == "true":
        return max(whole, 1)
    size = int(value[:12])  # more digits than that exceed any map
    if size < 1 or (whole and size > whole):
        raise GangError(f"{GANG_ANNOTATION}: {shown(value)} must be from 1 to {what}: {fix}")
    return size


def _whole_gang(pod: Mapping[str, Any], annotations: Mapping[str, Any]) -> tuple[int, str]:
    """How many pods the pod's whole gang has (0: unknown, for a malformed map), and what that is."""
    kind = workload(pod)
    if kind[0] == "owner" and kind[2] == "LeaderWorkerSet":
        size = annotations.get(LWS_SIZE_ANNOTATION)
        if not (isinstance(size, str) and size.isascii() and size.isdigit() and len(size) < 12):
            raise GangError(f"a pod of LeaderWorkerSet {kind[3]} without annotation {LWS_SIZE_ANNOTATION}, which its"
                            " controller sets: its group's size is unknown")
        return int(size), f"the group's size, {size}"
    if kind[0] == "owner" and kind[2] == "JobSet":
        size = annotations.get(GANG_SIZE)
        if not (isinstance(size, str) and size.isascii() and size.isdigit() and len(size) < 12):
            raise GangError(f"a pod of JobSet {kind[3]} without annotation {GANG_SIZE} (the pods of the JobSet's gang,"
                            " which gpu-scheduler's webhook writes when it admits the pod): check that the webhook"
                            " is installed and running, then delete the pod (its Job re-creates it)")
        return int(size), f"the {size} pods of the JobSet that ask for the gang"
    entries = _entries(map_text(pod) or "")
    return entries, f"the map's {entries} entries"


@functools.lru_cache(maxsize=256)
def _entries(text: str) -> int:
    """The number of entries of a map (0 for a malformed one: MapEntry refuses the map itself, with
    its own words). Kept per text: every member of a gang carries the same map, and its group is
    formed at each member's attempt."""
    try:
        return len(parse_map(text))
    except MapError:
        return 0


def upstream_pod_group(pod: Mapping[str, Any]) -> str | None:
    """The upstream PodGroup the pod names (spec.schedulingGroup.podGroupName), or None."""
    group = spec(pod).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def upstream_gang_notice(group: str | None, ask: GangAsk, gang: tuple[str, ...]) -> str | None:
    """What a pod that names an upstream PodGroup (`group`, upstream_pod_group) is told, given what
    it asks of gangs and its gang (fit.gang_key); None for any other pod: bind places it as always,
    with its gpu-scheduler/gang or alone, and never waits for the PodGroup. Not a refusal:
    kube-scheduler, whose PodGroups they are, does not place this pod either."""
    if group is None:
        return None
    placed = (f"this pod is placed with its gang {gang_name_of(gang)}" if ask.asked
              else f"this pod is placed on its own (to place replicas together, set {GANG_ANNOTATION} on the pod"
                   " template)")
    return (f"the pod names PodGroup {shown(group)} (spec.schedulingGroup.podGroupName), but gpu-scheduler does not"
            f" run upstream gangs (PodGroups): its gangs are the {GANG_ANNOTATION} annotation's; {placed}")


def gang_name(pod: Mapping[str, Any]) -> str:
    """The gang as users know it (gang_name_of the pod's gang_key)."""
    return gang_name_of(gang_key(pod))


def gang_name_of(who: tuple[str, ...]) -> str:
    """A gang (fit.gang_key) as users know it: <namespace>/<controller>, a LeaderWorkerSet's group,
    or a bare pods' map."""
    if who[0] == "owner":
        return f"{who[1]}/{who[3]}" + (f" group {who[4]}" if len(who) > 4 else "")
    return f"{who[1]}/pods of one map"


def member_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    """Where a pod stands among its gang's members: by its index (none known: last), then its name."""
    try:
        return pod_index(metadata(pod)), str(metadata(pod).get("name") or "")
    except IndexUnknown:
        return 1 << 62, str(metadata(pod).get("name") or "")


def gang_of(pod: Mapping[str, Any], mine: "PodInputs", pending: Iterable[Mapping[str, Any]], bound: Iterable[str]
            ) -> PodGroup | None:
    """The gang `pod` (whose inputs are `mine`) belongs to, from its workload's pending pods that ask
    for a gang and its bound pods' names (`pod` itself among the pending ones or not); None when it
    is no gang's member (or its ask is malformed: PreFilter refuses it)."""
    if mine.gang_ask.size is None:
        return None
    # the other members, read as they are listed; the pod's own order is its inputs'
    members = {_key(p): (member_order(p), p) for p in pending if gang_ask(p).size is not None}
    members[mine.key] = (mine.order, pod)
    ordered = tuple(p for _, p in sorted(members.values(), key=lambda member: member[0]))
    return PodGroup(gang_name_of(mine.gang), mine.gang_ask.size, ordered, tuple(sorted(bound)), NAME)


def _key(pod: Mapping[str, Any]) -> str:
    """A member's identity: its UID, or its name for a pod not created yet (plan's)."""
    meta = metadata(pod)
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


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

    def pod_group(self, pod: Mapping[str, Any], mine: "PodInputs", cluster: WorkloadPods) -> PodGroup | None:
        """The pod's gang; None when it asks for none (a malformed ask too: PreFilter refuses it)."""
        if mine.gang_ask.size is None:
            return None
        members = cluster.workload_pods(mine.gang)
        return gang_of(pod, mine, members.pending, members.bound)

    def group_name(self, mine: "PodInputs") -> str | None:
        return gang_name_of(mine.gang) if mine.gang_ask.size is not None else None

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
