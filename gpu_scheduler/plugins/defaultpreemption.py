"""DefaultPreemption (PostFilter): a pod refused on its map node because what it needs is taken
(an Unschedulable refusal: GPUsHeld, DynamicResources, NodeResourcesFit, NodePorts; never an
UnschedulableAndUnresolvable one, such as a taint or a missing node) takes it back from pods of lower
priority, as kube-scheduler's DefaultPreemption does (pkg/scheduler/framework/plugins/
defaultpreemption and framework/preemption), on the one node its map names.

The choice is pure, on the attempt's immutable snapshot (`select_victims`; explain asks the same):
- never when the pod's preemptionPolicy is Never;
- only pods of lower spec.priority, never one of equal or higher priority; a gang member only with
  its whole gang (plugins/gang.py), and only when every member has lower priority;
- every such pod removed, the profile's filters must pass, or nothing is evicted; then each is
  given back (reprieved), the most important first and the PodDisruptionBudget-violating ones
  before the others, while the pod still fits: the fewest victims, of the lowest priorities;
- a victim that a PodDisruptionBudget forbids to disrupt now means no preemption (the Eviction API
  would refuse it, 429), rather than a partial one;
- pods already terminating are not evicted again: the pod waits for them.

Then `post_filter` does the I/O, in an order that evicts nothing twice:
1. the claim: the preemptor is nominated on the device record of each device of its map entry, an
   update at the record's version (a create where there is none). Another bind instance or another
   preemptor that wrote first wins (409), and this attempt evicts nothing. A device nominated for
   this pod already means its victims were evicted by an earlier attempt: nothing more to do;
2. the preemptor's status.nominatedNodeName;
3. each victim evicted through the Eviction API (its PodDisruptionBudgets hold; its grace period
   is its own), then given the DisruptionTarget condition (reason PreemptionByScheduler) and a
   `Preempted` Event naming the preemptor. The condition is written after the eviction has
   returned: the Eviction API writes its own DisruptionTarget (EvictionByEvictionAPI) before it
   deletes, so only this order leaves kube-scheduler's reason on the victim.
The pod stays refused; its refusal's events (a pod leaving the node, a record freed, a claim
deleted) retry it once the victims are gone, and the nomination keeps the device for it meanwhile.
"""
from __future__ import annotations

import time
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from kubeapi.errors import APIError

from ..fit import NodeInfo, PodInfo
from ..framework.interface import (
    SUCCESS, Code, CycleState, FilterRunner, PodGroup, PostFilterPlugin, PostFilterResult, Refusal, Status,
    api_failure, error, inputs, unschedulable,
)
from ..framework.snapshot import NodeSnapshot
from ..placement import metadata, spec
from ..podinputs import PodInputs
from ..records import Record, nominated_lease, nomination, without_nomination
from .mapentry import resolved

NAME = "DefaultPreemption"
REASON = "PreemptionByScheduler"  # the victim's DisruptionTarget condition, as kube-scheduler writes it
PREEMPTED = "Preempted"  # the victim's Event
# How long a nomination keeps the devices for its pod beyond its victims' longest grace period (30 s
# by default): the watch's delay, with room. A pod still waiting after that competes again as any other.
NOMINATION_SECONDS = 90

# What select_victims found: Preemption (evict these), Waiting (victims are terminating already:
# nothing to evict) or NoPreemption (why nobody can be preempted).


@dataclass(frozen=True)
class Victim:
    """One pod to evict, and the node it is on (a gang member may be on another node)."""

    info: PodInfo
    node: str


@dataclass(frozen=True)
class Preemption:
    victims: tuple[Victim, ...]

    def describe(self) -> str:
        return ", ".join(f"{v.info.name} (priority {v.info.priority})" for v in self.victims)


@dataclass(frozen=True)
class Waiting:
    message: str


@dataclass(frozen=True)
class NoPreemption:
    reason: str
    # Nothing to say on the pod's Event: a refusal no eviction can undo (a missing node, the map),
    # or a pod of the default priority (0) with no pod of lower priority in its way, the common
    # cases, keep their refusal's message as it was.
    quiet: bool = False


@dataclass(frozen=True)
class _Unit:
    """What is evicted together: one pod, or a gang's every bound member (`here`: those on this node)."""

    here: tuple[PodInfo, ...]
    elsewhere: tuple[Victim, ...]

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.here + tuple(v.info for v in self.elsewhere))

    @property
    def name(self) -> str:
        return self.here[0].name

    @property
    def started(self) -> float:
        return min(p.started for p in self.here)

    @property
    def pods(self) -> tuple[PodInfo, ...]:
        return self.here + tuple(v.info for v in self.elsewhere)


MembersOf = Callable[[tuple[str, ...]], Sequence[tuple[str, PodInfo]]]  # a workload -> (node, pod) of each bound pod


def preemption_policy_never(pod: Mapping[str, Any]) -> bool:
    return spec(pod).get("preemptionPolicy") == "Never"


def node_without(node: NodeSnapshot, removed: Iterable[PodInfo]) -> NodeSnapshot:
    """The snapshot as it would be with `removed` gone: off the node, seen deleted (their records'
    grace ends), and, in DRA mode, their claims' devices free."""
    removed = tuple(removed)
    uids = frozenset(p.uid for p in removed)
    claims = {claim for p in removed for claim in p.claims}
    return NodeSnapshot(
        name=node.name, node=node.node, info=NodeInfo.of(p for p in node.info.pods if p.uid not in uids),
        records=node.records, gone=node.gone | uids, now=node.now, slices=node.slices,
        held={device: claim for device, claim in node.held.items() if claim not in claims},
        claims=node.claims, dra=node.dra, generation=node.generation)


def _fits(run_filters: FilterRunner, state: CycleState, pod: Mapping[str, Any], node: NodeSnapshot) -> Status:
    """The framework's filter loop on a trial snapshot, on a copy of the attempt's state."""
    return run_filters(state.clone(), pod, node)


def _selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against labels. An empty or absent selector
    selects nothing here, as for a PodDisruptionBudget (policy/v1: an empty selector matches no pod)."""
    if not isinstance(selector, Mapping) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, Mapping):
            return False
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def _violations(units: Sequence[_Unit], pdbs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """kube-scheduler's filterPodsWithPDBViolation: going through `units` in order, each matching
    budget's disruptionsAllowed counted down; unit name -> the budget it would take below zero."""
    allowed: dict[int, int] = {}
    violating: dict[str, str] = {}
    for unit in units:
        for pod in unit.pods:
            namespace = pod.name.split("/", 1)[0]
            labels = dict(pod.labels)
            for i, pdb in enumerate(pdbs):
                meta = metadata(pdb)
                if meta.get("namespace") != namespace or not _selects((pdb.get("spec") or {}).get("selector"), labels):
                    continue
                status = pdb.get("status") or {}
                if pod.name.split("/", 1)[-1] in (status.get("disruptedPods") or {}):
                    continue  # already counted as disrupted by the budget
                left = allowed.get(i, int(status.get("disruptionsAllowed") or 0)) - 1
                allowed[i] = left
                if left < 0 and unit.name not in violating:
                    violating[unit.name] = (f"PodDisruptionBudget {namespace}/{meta.get('name')} allows"
                                            f" {status.get('disruptionsAllowed') or 0} disruptions now")
    return violating


def _units(uid: str, node: NodeSnapshot, priority: int, members_of: MembersOf
           ) -> tuple[list[_Unit], list[PodInfo]]:
    """The node's pods that may be preempted, as units (a gang whole), and those of equal or higher
    priority (or in a gang that has such a member), which may not; `uid`: the preemptor's."""
    units: list[_Unit] = []
    kept: list[PodInfo] = []
    seen_gangs: set[tuple[str, ...]] = set()
    for info in node.info.pods:
        if info.uid == uid or info.terminating:
            continue
        if info.priority >= priority:
            kept.append(info)
            continue
        if not info.gang:
            units.append(_Unit((info,), ()))
            continue
        if info.group in seen_gangs:
            continue
        seen_gangs.add(info.group)
        members = ([(where, member) for where, member in members_of(info.group) if not member.terminating]
                   or [(node.name, info)])
        here = tuple(m for where, m in members if where == node.name)
        elsewhere = tuple(Victim(m, where) for where, m in members if where != node.name)
        unit = _Unit(here or (info,), elsewhere)
        if unit.priority >= priority:
            kept.extend(here)
        else:
            units.append(unit)
    return units, kept


def select_victims(pod: Mapping[str, Any], node: NodeSnapshot, refusal: Status, state: CycleState,
                   filters: FilterRunner, pdbs: Sequence[Mapping[str, Any]] = (),
                   members_of: MembersOf = lambda key: ()) -> Preemption | Waiting | NoPreemption:
    """Who must go so that `pod` fits on `node`, decided on the snapshot alone (no I/O)."""
    if not refusal.preemption_may_help:
        # quiet: no pod's removal changes such a refusal, and its message is best left as it is
        return NoPreemption(f"{refusal.plugin}'s refusal is not one that evicting pods can undo", quiet=True)
    if preemption_policy_never(pod):
        return NoPreemption("the pod's preemptionPolicy is Never")
    me = inputs(state, pod)
    priority = me.priority
    terminating = [p for p in node.info.pods if p.terminating]
    units, kept = _units(me.uid, node, priority, members_of)
    every = [p for unit in units for p in unit.here] + terminating
    if every:
        alone = _fits(filters, state, pod, node_without(node, every))
        if not alone.ok:
            return NoPreemption(f"even with every pod of lower priority than {priority} gone from {node.name}, the"
                                f" pod would not fit: {alone.message}", quiet=priority == 0 and not units)
    if terminating and _fits(filters, state, pod, node_without(node, terminating)).ok:
        return Waiting(f"{', '.join(p.name for p in terminating)} terminating on {node.name}; the pod is placed"
                       " once they are gone")
    if not units:
        if kept:
            return NoPreemption(f"no pod on {node.name} has a priority lower than this pod's {priority}"
                                f" ({', '.join(f'{p.name}: {p.priority}' for p in kept[:3])}"
                                f"{', ...' if len(kept) > 3 else ''})", quiet=priority == 0)
        return NoPreemption(f"no other pod on {node.name} to preempt", quiet=priority == 0)
    # kube-scheduler's selectVictimsOnNode: the most important first (util.MoreImportantPod: higher
    # priority, then the earlier status.startTime; the name where those tie), those a
    # PodDisruptionBudget protects tried first for a reprieve.
    units.sort(key=lambda u: (-u.priority, u.started, u.name))
    violating = _violations(units, pdbs)
    removed = {p.uid: p for p in every}
    victims: list[_Unit] = []
    for unit in [u for u in units if u.name in violating] + [u for u in units if u.name not in violating]:
        for p in unit.here:
            removed.pop(p.uid, None)
        if _fits(filters, state, pod, node_without(node, removed.values())).ok:
            continue  # reprieved
        for p in unit.here:
            removed[p.uid] = p
        victims.append(unit)
    blocked = [u for u in victims if u.name in violating]
    if blocked:
        return NoPreemption(f"evicting {blocked[0].name} would violate its {violating[blocked[0].name]}")
    chosen = (tuple(Victim(p, node.name) for unit in victims for p in unit.here)
              + tuple(v for unit in victims for v in unit.elsewhere))
    return Preemption(chosen)


def _release(written: Sequence[Mapping[str, Any]], cluster) -> None:
    """The nominations this attempt wrote, taken back as written (a record written since is left:
    its nomination ends with its time)."""
    for lease in written:
        try:
            cluster.update_record(str(metadata(lease).get("name")), without_nomination(lease))
        except APIError:
            pass


def preempted_message(me: PodInputs, node: str) -> str:
    return f"Preempted by {me.name} (priority {me.priority}) on node {node}"


@dataclass(frozen=True)
class _Plan:
    """One preemptor's part: its victims, on its node, and the claim written for it."""

    pod: Mapping[str, Any]
    node: NodeSnapshot
    state: CycleState
    chosen: Preemption

    @property
    def inputs(self) -> PodInputs:
        """The preemptor as its cycle read it (its uid, name, priority, workload)."""
        return inputs(self.state, self.pod)


class PreemptionListers(Protocol):
    """What choosing victims reads through the handle."""

    def pdbs(self, node: NodeSnapshot) -> Sequence[Mapping[str, Any]]:
        """The PodDisruptionBudgets of the namespaces of the node's pods."""

    def members_of(self, group: tuple[str, ...]) -> Sequence[tuple[str, PodInfo]]:
        """(node, PodInfo) of each bound pod of the gang `group` (fit.gang_key: a workload, or one group
        of a LeaderWorkerSet)."""


class Preemptor(PreemptionListers, Protocol):
    """What preempting writes through the handle."""

    def create_record(self, body: Mapping[str, Any]) -> Any: ...
    def update_record(self, name: str, body: Mapping[str, Any]) -> Any: ...
    def read_record(self, node: str, device: str) -> Record | None: ...
    def nominate(self, pod: Mapping[str, Any], node: str) -> None: ...
    def evict(self, namespace: str, name: str, uid: str) -> None: ...
    def mark_preempted(self, namespace: str, name: str, uid: str, reason: str, condition_message: str,
                       event_message: str) -> None:
        """After its eviction: the victim's DisruptionTarget condition, then its Preempted Event."""


@dataclass(frozen=True)
class _Choice:
    """The victims of every refused member (plans), or what stands in the way (result)."""

    plans: tuple[_Plan, ...] = ()
    result: PostFilterResult | None = None


class DefaultPreemption(PostFilterPlugin):
    name = NAME

    def __init__(self, run_filters: FilterRunner):
        self.run_filters = run_filters

    def _choose(self, group: PodGroup, refused: Sequence[Refusal], cluster: PreemptionListers) -> _Choice:
        """Victims for every refused member, each member's chosen on its node with the victims of
        the members before it gone; if any member cannot be made placeable, nobody is evicted, and
        the result names that member (the group waits on its events)."""
        plans: list[_Plan] = []
        chosen_on: dict[str, list[PodInfo]] = {}
        for index, refusal in enumerate(refused):
            pod, node = refusal.pod, refusal.node
            trial = node_without(node, chosen_on.get(node.name, ()))
            chosen = select_victims(pod, trial, refusal.status, refusal.state, self.run_filters, cluster.pdbs(node),
                                    cluster.members_of)
            who = "" if group.alone else f"member {inputs(refusal.state, pod).name.split('/', 1)[-1]}: "
            if isinstance(chosen, NoPreemption):
                said = "" if chosen.quiet else f"{who}{chosen.reason}"
                return _Choice(result=PostFilterResult(
                    unschedulable(NAME, f"preemption: nobody preempted: {said}" if said else "", "None"), "None", index,
                    f"nobody can be preempted: {said}" if said else ""))
            if isinstance(chosen, Waiting) and group.alone:
                return _Choice(result=PostFilterResult(unschedulable(NAME, f"preemption: {chosen.message}", "Waiting"),
                                                       "Waiting", None, chosen.message))
            if isinstance(chosen, Preemption):
                plans.append(_Plan(pod, node, refusal.state, chosen))
                chosen_on.setdefault(node.name, []).extend(v.info for v in chosen.victims if v.node == node.name)
        if not plans:
            message = "the gang's victims are terminating; it is placed once they are gone"
            return _Choice(result=PostFilterResult(unschedulable(NAME, f"preemption: {message}", "Waiting"), "Waiting",
                                                   None, message))
        return _Choice(tuple(plans))

    def select(self, group: PodGroup, refused: Sequence[Refusal], cluster: PreemptionListers) -> PostFilterResult:
        """Who bind would preempt for the group now, or why nobody (explain's `Preemption:` line)."""
        choice = self._choose(group, refused, cluster)
        if choice.result is not None:
            return choice.result
        line = "; ".join(f"would preempt {p.chosen.describe()} on {p.node.name}" for p in choice.plans)
        return PostFilterResult(unschedulable(NAME, f"preemption: {line}", "Preempted"), "Preempted", None, line)

    def post_filter(self, group: PodGroup, refused: Sequence[Refusal], cluster: Preemptor) -> PostFilterResult:
        choice = self._choose(group, refused, cluster)
        if choice.result is not None:
            return choice.result
        status = self._preempt(choice.plans, cluster)
        if status.code is Code.ERROR:
            return PostFilterResult(status, "Error")
        return PostFilterResult(dataclasses.replace(status, message=f"preemption: {status.message}"), status.reason)

    def _preempt(self, plans: Sequence[_Plan], cluster) -> Status:
        """The claims of every plan, then the nominations, then the evictions."""
        already = [p for p in plans if _nominated_already(p)]
        if len(already) == len(plans):
            return unschedulable(NAME, f"{'; '.join(p.chosen.describe() for p in plans)} preempted for this pod"
                                       " already; it is placed once they are gone", "Waiting")
        written: list[Mapping[str, Any]] = []
        longest = max((v.info.grace_seconds for p in plans for v in p.chosen.victims), default=0)
        until = time.time() + longest + NOMINATION_SECONDS
        for plan in plans:  # the claim: a write at the version decided from; the first writer wins
            me, node = plan.inputs, plan.node
            who = me.name
            for device in resolved(plan.state).placement.devices:
                record = node.records.get(device)
                if _nominated_for(me, record, node):
                    # already claimed for this pod (or its workload), by an earlier attempt or another
                    # instance: that claim stands for ours, and is not ours to take back if a later write fails
                    continue
                try:
                    body = nominated_lease(record, node.name, device, who, me.uid, me.priority, until, me.holder)
                    written.append(cluster.create_record(body) if record is None else
                                   cluster.update_record(record.name, body))
                    continue
                except APIError as failure:
                    if not failure.conflict:
                        _release(written, cluster)
                        return api_failure(NAME, f"nominating {who} on the record of GPU {device} on {node.name}",
                                           failure)
                try:  # another writer was first: for this pod too, or for another?
                    current = cluster.read_record(node.name, device)
                except APIError as failure:
                    _release(written, cluster)
                    return api_failure(NAME, f"reading the record of GPU {device} on {node.name}", failure)
                if _nominated_for(me, current, node):
                    # Another instance preempting for this pod: it evicts (once), and relies on what this
                    # attempt wrote, which stays. Both writing devices in the entries' order, the first
                    # conflict stops one of them only.
                    return unschedulable(NAME, f"GPU {device} on {node.name} was claimed for this pod by another"
                                               " bind instance, which evicts; the pod is placed once its victims"
                                               " are gone", "Waiting")
                _release(written, cluster)
                return unschedulable(NAME, f"GPU {device} on {node.name} was claimed by another preemptor or"
                                           " bind instance first; nothing evicted", "Lost")
        for plan in plans:
            try:
                cluster.nominate(plan.pod, plan.node.name)
            except APIError as failure:
                _release(written, cluster)
                return api_failure(NAME, f"setting status.nominatedNodeName to {plan.node.name}", failure)
        evicted: list[str] = []
        unmarked: list[str] = []
        for plan in plans:
            message = preempted_message(plan.inputs, plan.node.name)
            for victim in plan.chosen.victims:
                if victim.info.name in evicted:
                    continue
                namespace, name = victim.info.name.split("/", 1)
                try:
                    cluster.evict(namespace, name, victim.info.uid)
                except APIError as failure:
                    if failure.not_found:
                        continue  # gone already
                    # Not now: the devices are released for whoever comes first, and the pod tries
                    # again after its backoff (a PodDisruptionBudget's status the snapshot had not seen yet).
                    _release(written, cluster)
                    if failure.status == 429:
                        return error(NAME, f"the Eviction API refused to evict {victim.info.name} now (429:"
                                           f" {failure.message}); evicted {', '.join(evicted) or 'nobody'}")
                    return api_failure(NAME, f"evicting {victim.info.name}", failure)
                evicted.append(victim.info.name)
                try:
                    cluster.mark_preempted(namespace, name, victim.info.uid, REASON,
                                           f"{spec(plan.pod).get('schedulerName')}: preempting to accommodate a"
                                           " higher priority pod", message)
                except APIError:
                    unmarked.append(victim.info.name)  # evicted all the same: its condition is all that is missing
        said = "; ".join(f"preempted {p.chosen.describe()} on {p.node.name}" for p in plans)
        if unmarked:
            said += f" (the DisruptionTarget condition of {', '.join(unmarked)} could not be written)"
        return Status(SUCCESS.code, NAME, f"{said}; placed once they are gone", "Preempted")


def _nominated_already(plan: _Plan) -> bool:
    """Every device of the plan's pod is nominated for it, or for a pod of its workload (which
    shares its devices): an earlier attempt, instance or sibling evicted the victims."""
    devices = resolved(plan.state).placement.devices
    return bool(devices) and all(_nominated_for(plan.inputs, plan.node.records.get(d), plan.node) for d in devices)


def _nominated_for(me: PodInputs, record: Record | None, node: NodeSnapshot) -> bool:
    """`record` is nominated, while that lasts (by the node snapshot's clock and the pods it saw
    gone), for the pod or a pod of its workload."""
    nominee = nomination(record, node.now, node.gone)
    return bool(nominee) and (nominee == me.uid or record.nominee_holder == me.holder)
