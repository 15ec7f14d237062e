"""What `kubectl gpu-scheduler suggest` writes, without I/O: a gpu-scheduling-map that gives every
replica of an indexed workload N GPUs on one node, chosen from snapshots of the cluster's nodes,
or exactly why none exists.

Every entry is checked by bind's own framework (`Framework.decide`, PreFilter and Filter of the
default profile) on the snapshot of its node, so bind's filters pass it at that moment. The
framework does not refuse a device to another replica of the same workload (replicas of one
workload may share), so the devices chosen for earlier replicas are taken out here, and each
replica placed is assumed on its node's snapshot by the framework (`Framework.assume`: its
requests, host ports, devices; in DRA mode the devices its claim will hold) before the next one is
chosen.

Which devices a node offers: GPU indexes 0..nvidia.com/gpu-1 (its capacity); in DRA mode the
devices its ResourceSlices publish, each as the map device bind's device rule turns into it, kept
under one `resource.kubernetes.io/pcieRoot` per replica when the driver publishes that attribute.

A pool (a Deployment's pods, which have no index and take free entries of the map) gets one entry
for each pod its rollout runs at once: replicas + maxSurge. Each entry is placed as a replica is,
by a pod of the pool whose map is that entry alone (bind's PoolEntry among the filters). The
workload's own running pods, which a rollout replaces, hold no entry of the new map here: their
GPUs are the workload's own, as a StatefulSet's running pods' are.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from . import ANNOTATION
from .devices import DRA, MODE_ANNOTATION
from .fit import DEVICES_ANNOTATION, workload as workload_of
from .plugins.config import SchedulerConfig
from .framework.interface import Status
from .framework.runtime import Decision, Framework
from .framework.snapshot import NodeSnapshot
from .nodecheck import GPU_RESOURCE, gpu_capacity
from .placement import metadata, spec
from .plan import ManifestError, Workload, pod_for, pod_name
from .records import workload_key
from .plugins.dynamicresources import allocator as dra
from .schedmap import MapError, parse_map

SPREAD, PACK = "spread", "pack"
STRATEGIES = (SPREAD, PACK)
NO_GPUS = "NoGPUs"  # a node that offers no device at all (no nvidia.com/gpu; in DRA mode no slice)
SHOWN_NODES = 8  # nodes a message names one by one; the rest are counted


class SuggestError(ValueError):
    """A request suggest cannot answer; the message names the fix."""


@dataclass(frozen=True)
class Choice:
    """One replica's entry."""

    index: int
    pod: str
    node: str
    devices: tuple[str, ...]

    @property
    def entry(self) -> str:
        return f"{self.index}={self.node}:{','.join(self.devices)}"


@dataclass(frozen=True)
class NodeFree:
    """What one node offers a replica: the devices bind's filters pass one by one (`free`), and
    when it offers none, the first refusal (`refusal`)."""

    node: str
    free: tuple[str, ...]
    refusal: Status | None = None


@dataclass(frozen=True)
class Placed:
    work: Workload
    gpus: int
    choices: tuple[Choice, ...]

    @property
    def map_text(self) -> str:
        return "".join(f"{c.entry}\n" for c in self.choices)


def _noun(work: Workload, count: int) -> str:
    """What suggest places one by one: a workload's replicas, a pool's entries."""
    if work.pool:
        return "entry" if count == 1 else "entries"
    return "replica" if count == 1 else "replicas"


@dataclass(frozen=True)
class Shortfall:
    """Not every replica fits: which did, which did not, and what each node had free before
    (`before`) and after the replicas that fit (`after`)."""

    work: Workload
    gpus: int
    strategy: str
    placed: tuple[Choice, ...]
    unplaced: tuple[int, ...]
    before: tuple[NodeFree, ...]
    after: tuple[NodeFree, ...]
    one_root: bool = False  # DRA: the driver publishes pcieRoot, so a replica's devices share one

    @property
    def message(self) -> str:
        work, n = self.work, self.gpus
        count = len(self.placed) + len(self.unplaced)
        need = f"{count} {_noun(work, count)} x {n} GPU{'s' if n != 1 else ''}"
        free = sum(len(f.free) for f in self.before)
        where = _free_listing(self.before)
        unplaced = ", ".join(map(str, self.unplaced[:SHOWN_NODES])) + (
            f", ... ({len(self.unplaced)} in all)" if len(self.unplaced) > SHOWN_NODES else "")
        together = f"{n} on one node" + (" under one PCIe root (resource.kubernetes.io/pcieRoot)" if self.one_root else "")
        left = sum(len(f.free) for f in self.after)
        one, many = _noun(work, 1), _noun(work, count)
        label = ("entry", "entries") if work.pool else ("index", "indexes")
        text = (f"{work.title}: {need} = {count * n} GPU{'s' if count * n != 1 else ''} do not fit: {free} GPU"
                f"{'s are' if free != 1 else ' is'} free now{': ' + where if where else ''}; each {one} needs"
                f" {together}. {len(self.placed)} of {count} {many} fit; "
                + (f"{label[0]} {unplaced} does not" if len(self.unplaced) == 1 else f"{label[1]} {unplaced} do not"))
        if self.placed:
            text += f" (after the {len(self.placed)} that fit, {left} GPU{'s' if left != 1 else ''} left"
            text += f": {_free_listing(self.after)})" if left else ")"
        refused = _refusals(self.before)
        if refused:
            text += f"; no GPU free on {refused}"
        return text


def _free_listing(nodes: Iterable[NodeFree]) -> str:
    offered = [f for f in nodes if f.free]
    shown = [f"{f.node} {','.join(f.free)}" for f in offered[:SHOWN_NODES]]
    if len(offered) > SHOWN_NODES:
        shown.append(f"and {len(offered) - SHOWN_NODES} more nodes")
    return "; ".join(shown)


def _refusals(nodes: Iterable[NodeFree]) -> str:
    """Nodes without a free GPU, grouped by the plugin that refused them: `node1, node2
    (NodeAffinity: ...)`."""
    groups: dict[str, list[NodeFree]] = {}
    for f in nodes:
        if not f.free and f.refusal is not None:
            groups.setdefault(f.refusal.plugin or f.refusal.reason, []).append(f)
    parts = []
    for plugin, members in groups.items():
        names = ", ".join(m.node for m in members[:SHOWN_NODES]) + (
            f" and {len(members) - SHOWN_NODES} more" if len(members) > SHOWN_NODES else "")
        parts.append(f"{names} ({plugin}: {members[0].refusal.message})")
    return "; ".join(parts)


Result = Placed | Shortfall


# -- checks of the request ------------------------------------------------------------------------
def check(work: Workload, gpus: int) -> None:
    """SuggestError naming the fix for a request no map can answer."""
    what = work.title
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise SuggestError(f"--gpus {gpus}: each replica needs at least 1 GPU; give --gpus 1 or more")
    if work.kind == "Pod":
        raise SuggestError(f"{what}: a bare Pod is not a set of replicas; suggest places the replicas of {PLACED}")
    if work.pool:
        _check_pool(work)
    elif not work.indexed:
        raise SuggestError(f"{what}: {work.counted}, so a map cannot name them; suggest places the replicas of"
                           f" {PLACED}")
    if not placed_indexes(work):
        field = {"Job": "spec.completions", "JobSet": f"replicated job {work.part}'s replicas and completions"}.get(
            work.kind, "spec.replicas")
        if work.pool and work.kind == "Job":
            field = "spec.parallelism"
        raise SuggestError(f"{what}: {field} is 0, so there is nothing to place; set {field} to 1 or more")
    for where, template in zip(_template_fields(work), work.templates):
        scheduler = spec(template).get("schedulerName")
        if scheduler != "gpu-scheduler":
            raise SuggestError(f"{what}: {where}.spec.schedulerName is {scheduler or 'not set'}, so bind would"
                               " not place the replicas; set it to gpu-scheduler")


PLACED = ("a StatefulSet, a Job with completionMode: Indexed, a JobSet's replicated jobs, a"
          " LeaderWorkerSet or a Deployment (its pool)")


def _check_pool(work: Workload) -> None:
    what = work.title
    if work.replicas is None:
        raise SuggestError(f"{what}: a {work.kind} runs as many pods as its controller decides, so suggest cannot"
                           f" size its pool; suggest places the replicas of {PLACED}")
    if dra_mode(work):
        raise SuggestError(f"{what}: suggest does not write a pool's map in device mode dra yet (bind places such"
                           f" pods); write the map by hand, or set the template's {MODE_ANNOTATION} to cuda or nvidia"
                           " to have one suggested")


def placed_indexes(work: Workload) -> tuple[int, ...]:
    """The map indexes suggest writes: a workload's pod indexes; a pool's entries, one for each pod
    its rollout runs at once (replicas + maxSurge)."""
    if not work.pool:
        return tuple(i for i in work.indexes if i is not None)
    return tuple(range(work.pods_at_once or 0))


def _template_fields(work: Workload) -> tuple[str, ...]:
    """Where each of `work.templates` is in its manifest, for messages."""
    if work.kind == "JobSet":
        return (f"replicated job {work.part}'s template.spec.template",)
    if work.kind == "LeaderWorkerSet":
        lwt = "spec.leaderWorkerTemplate"
        return (f"{lwt}.workerTemplate",) if work.leader_template is None else (
            f"{lwt}.leaderTemplate", f"{lwt}.workerTemplate")
    return ("spec.template",)


def dra_mode(work: Workload) -> bool:
    annotations = metadata(work.template).get("annotations") or {}
    return isinstance(annotations, Mapping) and annotations.get(MODE_ANNOTATION) == DRA


# -- the pods, as bind sees them --------------------------------------------------------------------
def candidate_pod(work: Workload, index: int, entry: str) -> dict[str, Any]:
    """Replica `index` of `work` as bind will see it, its map the one `entry`: named as its
    controller names it and, in DRA mode, with the claim entry mutate adds."""
    pod = pod_for(work, index)
    meta = pod["metadata"]
    meta["annotations"] = {**meta.get("annotations", {}), ANNOTATION: entry}
    if not meta.get("name"):  # an Indexed Job's pod: named by the API server; the claim needs a name
        meta["name"] = f"{meta.get('generateName') or work.name + '-'}suggest" + (f"-{index}" if work.pool else "")
    if dra_mode(work) and not dra.uses_dra(pod):
        pod_spec = pod["spec"]
        pod_spec["resourceClaims"] = [*(pod_spec.get("resourceClaims") or []),
                                      {"name": dra.POD_CLAIM, "resourceClaimName": dra.claim_name(meta["name"])}]
    return pod


# -- what a node offers ------------------------------------------------------------------------------
def _valid_map_device(device: str) -> bool:
    try:
        parse_map(f"0=n:{device}")
    except MapError:
        return False
    return True


def _device_order(device: str) -> tuple[int, int, str]:
    return (0, int(device), "") if device.isdigit() else (1, 0, device)


@dataclass(frozen=True)
class Offer:
    """The devices a node could give, as map devices, each with its group: one group for a
    node's GPUs, or one per PCIe root in DRA mode when the driver publishes it. `why`: the node
    offers nothing, and why."""

    devices: tuple[str, ...] = ()
    groups: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    dra_devices: Mapping[str, dra.Device] = dataclasses.field(default_factory=dict)
    why: str = ""

    @property
    def by_root(self) -> bool:
        return any(g is not None for g in self.groups.values())


def offer(node: NodeSnapshot, in_dra: bool, device_class: str, rules: Mapping[str, dra.Rule]) -> Offer:
    if node.node is None:
        return Offer(why=f"node {node.name} does not exist")
    if not in_dra:
        capacity = gpu_capacity(node.node)
        if not capacity:
            return Offer(why=f"node {node.name} advertises no {GPU_RESOURCE}")
        devices = tuple(str(i) for i in range(capacity))
        return Offer(devices, {d: None for d in devices})
    chosen = dra.rule_for(device_class, rules, node.slices, node.name)
    if isinstance(chosen, str):
        return Offer(why=chosen)
    driver, rule = chosen
    groups: dict[str, str | None] = {}
    named: dict[str, dra.Device] = {}
    published = dra.node_devices(node.slices, node.name, driver)
    if not published:
        return Offer(why=f"no ResourceSlice of node {node.name} publishes a device of driver {driver}"
                         f" (DeviceClass {device_class})")
    for device, body in published:
        mapped = dra.map_device(rule, node.name, device, body)
        if mapped is None or mapped in groups or not _valid_map_device(mapped):
            continue
        groups[mapped] = dra.pcie_root(device, body)
        named[mapped] = device
    if not groups:
        return Offer(why=f"no device of driver {driver} on node {node.name} is named by a map device (device rule"
                         f" of {device_class})")
    return Offer(tuple(sorted(groups, key=_device_order)), groups, named)


def pick(free: Sequence[str], groups: Mapping[str, str | None], count: int) -> tuple[str, ...] | None:
    """`count` of the `free` devices, all of one group (one PCIe root, or the node's GPUs): of
    the groups with enough free, the one with fewest (the rest stay together for larger
    replicas), then the lowest devices of it. None when no group has `count` free."""
    members: dict[str | None, list[str]] = {}
    for device in sorted(free, key=_device_order):
        members.setdefault(groups.get(device), []).append(device)
    fitting = [devices for devices in members.values() if len(devices) >= count]
    if not fitting:
        return None
    return tuple(min(fitting, key=len)[:count])


# -- choosing ----------------------------------------------------------------------------------------
class _Node:
    """One node while suggest chooses: its snapshot with the replicas placed so far, the devices
    given to them, and each device's verdict for a workload (kept until a replica is placed here)."""

    def __init__(self, snapshot: NodeSnapshot, position: int):
        # The manifest's pods and claims do not exist yet: no claim of theirs is read.
        self.snapshot = dataclasses.replace(snapshot, claims={})
        self.position = position
        self.given: set[str] = set()
        self.replicas = 0
        self.verdicts: dict[tuple[str, str], Status] = {}

    def take(self, snapshot: NodeSnapshot, choice: Choice) -> None:
        """The replica placed here: the node as the framework assumes it (its devices counted, its
        claim's devices held)."""
        self.snapshot = snapshot
        self.given.update(choice.devices)
        self.replicas += 1
        self.verdicts.clear()  # the node changed: its devices are decided again


def _is_leader(work: Workload, index: int) -> bool:
    """A LeaderWorkerSet's leader made from its own template (its verdicts are its own)."""
    return work.leader_template is not None and index % max(work.group_size or 1, 1) == 0


def _verdict(framework: Framework, pod: Mapping[str, Any], node: _Node) -> Decision:
    return framework.decide(pod, lambda _: node.snapshot)


def _free(framework: Framework, work: Workload, index: int, node: _Node, offered: Offer) -> NodeFree:
    """The devices of the node's offer that bind's filters pass for the workload one by one,
    less those given already; with the first refusal when none passes."""
    free, refusal = [], None
    for device in offered.devices:
        if device in node.given:
            continue
        key = (f"{work.title}/{'leader' if _is_leader(work, index) else 'pod'}", device)
        status = node.verdicts.get(key)
        if status is None:
            status = _verdict(framework, candidate_pod(work, index, f"{index}={node.snapshot.name}:{device}"), node).status
            node.verdicts[key] = status
        if status.ok:
            free.append(device)
        elif refusal is None:
            refusal = status
    if not offered.devices:
        refusal = Status(plugin=NO_GPUS, message=offered.why or f"node {node.snapshot.name} offers no GPU",
                         reason=NO_GPUS)
    return NodeFree(node.snapshot.name, tuple(free), refusal if not free else None)


def suggest(works: Sequence[Workload], gpus: int, strategy: str, snapshots: Sequence[NodeSnapshot],
            framework: Framework, config: SchedulerConfig) -> list[Result]:
    """A map for each workload (in order; later ones do not get devices earlier ones were given),
    or its Shortfall. `snapshots`: the nodes to choose from, in the order to try them."""
    if strategy not in STRATEGIES:
        raise SuggestError(f"strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    nodes = [_Node(snapshot, position) for position, snapshot in enumerate(snapshots)]
    results: list[Result] = []
    for work in works:
        check(work, gpus)
        in_dra = dra_mode(work)
        device_class = dra.device_class(work.template, config.dra_device_class)
        offers = {n.snapshot.name: offer(n.snapshot, in_dra, device_class, config.dra_rules) for n in nodes}
        indexes = placed_indexes(work)
        if work.pool:  # the workload's running pods hold entries of its old map, which a rollout replaces
            for node in nodes:
                node.snapshot = _without_entries(node.snapshot, workload_of(pod_for(work, 0)))
        first = indexes[0]
        before = tuple(_free(framework, work, first, n, offers[n.snapshot.name]) for n in nodes)
        counts = {n.snapshot.name: 0 for n in nodes}  # this workload's replicas on each node
        placed: list[Choice] = []
        unplaced: list[int] = []
        together = work.placed_together
        for start in range(0, len(indexes), together):
            group = indexes[start:start + together]
            if len(group) == 1:
                choice = _place(framework, work, group[0], gpus, strategy, nodes, offers, counts)
                (placed.append(choice) if choice else unplaced.append(group[0]))
                continue
            chosen = _place_group(framework, work, group, gpus, strategy, nodes, offers, counts)
            placed += [c for c in chosen if c is not None]
            unplaced += [index for index, c in zip(group, chosen) if c is None]
        if unplaced:
            after = tuple(_free(framework, work, unplaced[0], n, offers[n.snapshot.name]) for n in nodes)
            results.append(Shortfall(work, gpus, strategy, tuple(placed), tuple(unplaced), before, after,
                                     any(o.by_root for o in offers.values())))
        else:
            results.append(Placed(work, gpus, tuple(placed)))
    return results


def _without_entries(snapshot: NodeSnapshot, key: tuple[str, ...]) -> NodeSnapshot:
    """The node with the pool entries of workload `key` free: its pods holding none (they keep
    their GPUs, which the workload's own pods may share) and its entry records gone."""
    pods = tuple(dataclasses.replace(p, entry=None) if p.entry is not None and p.workload == key else p
                 for p in snapshot.info.pods)
    entries = {k: v for k, v in snapshot.entries.items() if k[0] != workload_key(key)}
    if pods == snapshot.info.pods and len(entries) == len(snapshot.entries):
        return snapshot
    return dataclasses.replace(snapshot, info=dataclasses.replace(snapshot.info, pods=pods), entries=entries)


def _order(strategy: str, nodes: Sequence[_Node], counts: Mapping[str, int]) -> list[_Node]:
    if strategy == SPREAD:  # fewest replicas of this workload first: one per node, round-robin
        return sorted(nodes, key=lambda n: (counts[n.snapshot.name], n.position))
    return sorted(nodes, key=lambda n: n.position)  # fill a node before the next


def _place_group(framework: Framework, work: Workload, group: Sequence[int], gpus: int, strategy: str,
                 nodes: list[_Node], offers: Mapping[str, Offer], counts: dict[str, int]) -> list[Choice | None]:
    """The entries of a group of replicas kept together (a LeaderWorkerSet's group, a JobSet's
    replicated job), on as few nodes as fit: the whole group on the first node in the strategy's
    order that holds all of it; else each replica on a node the group uses already, then on the
    node with the most devices free (one choice per index, None for one that fits nowhere)."""
    for node in _order(strategy, nodes, counts):
        saved = (node.snapshot, set(node.given), node.replicas, dict(node.verdicts), counts[node.snapshot.name])
        chosen = []
        for index in group:
            choice = _place(framework, work, index, gpus, strategy, [node], offers, counts)
            if choice is None:
                break
            chosen.append(choice)
        if len(chosen) == len(group):
            return chosen
        node.snapshot, node.given, node.replicas, node.verdicts, counts[node.snapshot.name] = saved
    used: dict[str, int] = {}
    chosen_any: list[Choice | None] = []
    for index in group:
        free = {n.snapshot.name: len(_free(framework, work, index, n, offers[n.snapshot.name]).free) // gpus
                for n in nodes}
        order = sorted(_order(strategy, nodes, counts),
                       key=lambda n: (n.snapshot.name not in used, -free[n.snapshot.name]))
        choice = _place(framework, work, index, gpus, strategy, order, offers, counts, ordered=True)
        if choice is not None:
            used[choice.node] = used.get(choice.node, 0) + 1
        chosen_any.append(choice)
    return chosen_any


def _place(framework: Framework, work: Workload, index: int, gpus: int, strategy: str, nodes: list[_Node],
           offers: Mapping[str, Offer], counts: dict[str, int], ordered: bool = False) -> Choice | None:
    """Replica `index`'s entry: the first node in the strategy's order (`ordered`: in the order
    of `nodes`) where `gpus` devices pass bind's filters together; the node's snapshot then holds
    the replica."""
    for node in (nodes if ordered else _order(strategy, nodes, counts)):
        offered = offers[node.snapshot.name]
        free = _free(framework, work, index, node, offered).free
        devices = pick(free, offered.groups, gpus)
        if devices is None:
            continue
        entry = f"{index}={node.snapshot.name}:{','.join(devices)}"
        pod = candidate_pod(work, index, entry)
        decision = _verdict(framework, pod, node)
        if not decision.status.ok:
            continue
        choice = Choice(index, pod_name(pod_for(work, index)), node.snapshot.name, devices)
        who = f"{choice.pod}/{index}" if work.pool else choice.pod  # a pool's pods share one name pattern
        meta = {**pod["metadata"], "uid": f"suggested/{pod['metadata'].get('namespace')}/{who}",
                "annotations": {**pod["metadata"].get("annotations", {}), DEVICES_ANNOTATION: ",".join(devices)}}
        node.take(framework.assume(decision, {**pod, "metadata": meta}), choice)
        counts[node.snapshot.name] += 1
        return choice
    return None


# -- the manifest ------------------------------------------------------------------------------------
# Where each kind keeps the pod templates the map is written on (a LeaderWorkerSet: its leader's,
# when it has one, and its workers'; one map indexes both). A JobSet's are its replicated jobs'.
TEMPLATE_PATHS = {"StatefulSet": (("spec", "template"),), "Job": (("spec", "template"),),
                  "Deployment": (("spec", "template"),), "ReplicaSet": (("spec", "template"),),
                  "ReplicationController": (("spec", "template"),),
                  "LeaderWorkerSet": (("spec", "leaderWorkerTemplate", "leaderTemplate"),
                                      ("spec", "leaderWorkerTemplate", "workerTemplate"))}
JOBSET_TEMPLATE_PATH = ("template", "spec", "template")  # in a replicated job


def template_at(value: Any, path: Sequence[str]) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def annotate(obj: dict[str, Any], text: str, part: str | None = None) -> None:
    """Write `text` as the gpu-scheduling-map of the workload `obj`'s pod templates (in place):
    for a JobSet, replicated job `part`'s; for a LeaderWorkerSet, its leaderTemplate (if any) and
    its workerTemplate."""
    kind = str(obj.get("kind"))
    if kind == "JobSet":
        jobs = template_at(obj, ("spec", "replicatedJobs"))
        templates = [template_at(job, JOBSET_TEMPLATE_PATH) for job in (jobs if isinstance(jobs, list) else [])
                     if isinstance(job, dict) and job.get("name") == part]
        if not templates:
            raise ManifestError(f"JobSet: no replicated job {part!r} with a pod template to annotate")
    else:
        templates = [template_at(obj, path) for path in TEMPLATE_PATHS.get(kind, ((),))]
        if kind == "LeaderWorkerSet":
            templates = [t for t in templates if t is not None] or [None]
    for template in templates:
        if not isinstance(template, dict):
            raise ManifestError(f"{kind}: no pod template to annotate")
        _write(template, text)


def _write(template: dict[str, Any], text: str) -> None:
    meta = template.get("metadata")
    if not isinstance(meta, dict):
        meta = template["metadata"] = {}
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        annotations = meta["annotations"] = {}
    annotations[ANNOTATION] = text
