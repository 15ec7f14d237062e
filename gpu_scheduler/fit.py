"""Does the pod fit on its node, next to the pods already there? kube-scheduler's filters for a
pinned pod, one function per filter and named after it, with the reasons users know from
`kubectl describe pod`; and GPU accounting, which no filter of kube-scheduler's makes.

- NodeResourcesFit: the pod's effective request against allocatable minus what the node's
  non-terminal pods request (k8s.io/component-helpers/resource.PodRequests, fit.go's fitsRequest).
- NodePorts: host ports already taken on the node (scheduler util.GetHostPorts, HostPortInfo).
- NodeAffinity: the pod's nodeSelector and required node affinity against the node's labels and name.
- GPUs held by other workloads: a device of the pod's map entry that a non-terminal pod of another
  workload on the same node holds (its record from the Binding, or its map entry).

Every function is total on odd shapes: what is not a list or an object counts as absent, an
unparseable quantity as zero (the API server validates these fields, so only a fake pod has them).
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from dataclasses import dataclass, field
from fractions import Fraction
from collections.abc import Iterable, Mapping
from typing import Any

from . import ANNOTATION, SCHEDULER_NAME
from .nodecheck import _map, node_refusal
from .nodecheck import _maps as _list
from .placement import NotPlaceable, map_text, metadata, resolve, spec
from .schedmap import Placement

# -- names users know -----------------------------------------------------------------------------
NODE_AFFINITY = "NodeAffinity"
AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"
PORTS_REASON = "node(s) didn't have free ports for the requested pod ports"
TOO_MANY_PODS = "Too many pods"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# Written on the Binding, which the API server copies onto the pod in the same write: the devices
# bind gave the pod. What counts for accounting, even if the map annotation is edited later.
DEVICES_ANNOTATION = "gpu-scheduler/devices"
# A workload that sets this to "true" may share its GPUs with other workloads that set it too.
SHARE_ANNOTATION = "gpu-scheduler/share-gpus"
TERMINAL_PHASES = ("Succeeded", "Failed")
CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"
# Pod-level resources (spec.resources, beta in 1.34) replace the containers' sum for these only.
POD_LEVEL_RESOURCES = (CPU, MEMORY)


# -- quantities -----------------------------------------------------------------------------------
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]{1,3})|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)")
_SUFFIX = {"": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": 10**3,
           "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
MAX_QUANTITY_TEXT = 64  # resource.Quantity's own strings are short; a longer one is not a quantity


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes resource.Quantity (`250m`, `1.5Gi`, `1e3`, `4`), exactly; None if it is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str) or len(value) > MAX_QUANTITY_TEXT:
        return None
    return _parse_quantity_text(value)


# A cluster's pods repeat a handful of quantity strings ("100m", "1Gi"): parse each once. Keys
# are at most MAX_QUANTITY_TEXT characters, so the cache is bounded in bytes as well as entries.
@lru_cache(maxsize=1024)
def _parse_quantity_text(value: str) -> Fraction | None:
    match = _QUANTITY.fullmatch(value.strip())
    if not match:
        return None
    number, exponent, suffix = match.groups()
    amount = Fraction(number)
    return amount * Fraction(10) ** int(exponent[1:]) if exponent else amount * _SUFFIX[suffix or ""]


def _units(resource: str, amount: Fraction) -> int:
    """What the scheduler compares: millicores for cpu, whole units otherwise, rounded up
    (Quantity.MilliValue / Value round up)."""
    return math.ceil(amount * 1000) if resource == CPU else math.ceil(amount)


def show(resource: str, units: int) -> str:
    if resource == CPU:
        return f"{units // 1000}" if units % 1000 == 0 else f"{units}m"
    return str(units)


# -- NodeResourcesFit -----------------------------------------------------------------------------
def _requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """A container's requests; where only a limit is given the API server defaults the request
    to it, so a manifest read offline counts the same as the pod the API server stores."""
    resources = _map(container.get("resources"))
    amounts: dict[str, Fraction] = {}
    for kind in ("limits", "requests"):  # requests last: they win over limits
        for name, value in _map(resources.get(kind)).items():
            parsed = parse_quantity(value)
            if isinstance(name, str) and parsed is not None:
                amounts[name] = parsed
    return amounts


def _add(total: dict[str, Fraction], amounts: Mapping[str, Fraction]) -> None:
    for name, amount in amounts.items():
        total[name] = total.get(name, Fraction(0)) + amount


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective request per resource, as kube-scheduler computes it: the containers'
    sum, sidecars (init containers with restartPolicy Always) added to it; each regular init
    container with the sidecars started before it; the larger of the two; pod-level requests in
    place of cpu and memory where set; plus spec.overhead. In scheduler units (cpu in millicores)."""
    pod_spec = spec(pod)
    total: dict[str, Fraction] = {}
    for container in _list(pod_spec.get("containers")):
        _add(total, _requests(container))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in _list(pod_spec.get("initContainers")):
        amounts = _requests(container)
        if container.get("restartPolicy") == "Always":
            _add(total, amounts)
            _add(sidecars, amounts)
            during = dict(sidecars)
        else:
            during = dict(sidecars)
            _add(during, amounts)
        for name, amount in during.items():
            init_peak[name] = max(init_peak.get(name, Fraction(0)), amount)
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, Fraction(0)), amount)
    pod_level = _map(_map(pod_spec.get("resources")).get("requests"))
    for name in POD_LEVEL_RESOURCES:
        parsed = parse_quantity(pod_level.get(name))
        if parsed is not None:
            total[name] = parsed
    for name, value in _map(pod_spec.get("overhead")).items():
        parsed = parse_quantity(value)
        if isinstance(name, str) and parsed is not None:
            _add(total, {name: parsed})
    return {name: _units(name, amount) for name, amount in total.items()}


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: its resources, ports and GPUs are free again."""
    return _map(pod.get("status")).get("phase") in TERMINAL_PHASES


def node_resources_fit(pod: Mapping[str, Any], node: Mapping[str, Any], info: "NodeInfo") -> str | None:
    """NodeResourcesFit: `Insufficient cpu` and the like, with the figures; None when it fits."""
    allocatable = _map(_map(node.get("status")).get("allocatable"))
    problems = []
    allowed_pods = parse_quantity(allocatable.get(PODS))
    if allowed_pods is not None and len(info.pods) + 1 > allowed_pods:
        problems.append(f"{TOO_MANY_PODS} ({len(info.pods)} of {_units(PODS, allowed_pods)} on the node)")
    wanted = {name: units for name, units in pod_requests(pod).items() if units > 0 and name != PODS}
    for name in sorted(wanted, key=lambda n: (n not in (CPU, MEMORY, EPHEMERAL), n)):
        have = parse_quantity(allocatable.get(name))
        capacity = _units(name, have) if have is not None else 0
        in_use = info.requested.get(name, 0)
        if wanted[name] > capacity - in_use:
            problems.append(f"Insufficient {name} (the pod requests {show(name, wanted[name])}; "
                            f"{show(name, in_use)} of {show(name, capacity)} allocatable is requested by other pods)")
    return f"node {metadata(node).get('name')}: " + ", ".join(problems) if problems else None


# -- NodePorts -----------------------------------------------------------------------------------
def host_ports(pod: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(hostIP, protocol, hostPort) of the containers and sidecars; defaults as the scheduler's."""
    pod_spec = spec(pod)
    containers = [c for c in _list(pod_spec.get("initContainers")) if c.get("restartPolicy") == "Always"]
    containers += _list(pod_spec.get("containers"))
    ports = []
    for container in containers:
        for port in _list(container.get("ports")):
            number = port.get("hostPort")
            if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                ports.append((port.get("hostIP") or "0.0.0.0", port.get("protocol") or "TCP", number))
    return ports


def _ports_conflict(wanted: tuple[str, str, int], taken: tuple[str, str, int]) -> bool:
    (ip, protocol, number), (taken_ip, taken_protocol, taken_number) = wanted, taken
    if (protocol, number) != (taken_protocol, taken_number):
        return False
    return ip == "0.0.0.0" or taken_ip == "0.0.0.0" or ip == taken_ip


def node_ports(pod: Mapping[str, Any], info: "NodeInfo") -> str | None:
    """NodePorts: the first host port another pod on the node holds, named with its holder."""
    for port in host_ports(pod):
        for other in info.pods:
            if any(_ports_conflict(port, taken) for taken in other.ports):
                return f"{PORTS_REASON}: hostPort {port[2]}/{port[1]} is held by {other.name}"
    return None


# -- NodeAffinity ----------------------------------------------------------------------------------
def _requirement(requirement: Mapping[str, Any], value: str | None, known: bool) -> bool | None:
    """A NodeSelectorRequirement against one label (or field) value; None: cannot be known."""
    if not known:
        return None
    operator, values = requirement.get("operator"), requirement.get("values") or []
    if not isinstance(values, list):
        return False
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _all(results: Iterable[bool | None]) -> bool | None:
    results = list(results)
    return False if False in results else (None if None in results else True)


def _label(key: Any, node: str, labels: Mapping[str, str] | None, requirement: Mapping[str, Any]) -> bool | None:
    if labels is not None:
        return _requirement(requirement, labels.get(key), True)
    return _requirement(requirement, node, key == HOSTNAME_LABEL)


def _term(term: Any, node: str, labels: Mapping[str, str] | None) -> bool | None:
    if not isinstance(term, Mapping):
        return False
    expressions = _list(term.get("matchExpressions"))
    fields = _list(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    return _all([_label(e.get("key"), node, labels, e) for e in expressions]
                + [_requirement(f, node, f.get("key") == "metadata.name") for f in fields])


def node_affinity(pod: Mapping[str, Any], node: str, labels: Mapping[str, str] | None = None) -> str | None:
    """NodeAffinity: why the pod's nodeSelector or required node affinity excludes `node` (None:
    it does not, or cannot be known). With `labels` None (admission, a plan offline: no node object
    at hand) only what the name tells is known: `metadata.name` fields and the
    `kubernetes.io/hostname` label, taken to be the name (as kubelets register it)."""
    pod_spec = spec(pod)
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, Mapping) and selector:
        met = _all(_label(k, node, labels, {"operator": "In", "values": [v]}) for k, v in selector.items())
        if met is False:
            shown = ", ".join(f"{k}={v}" for k, v in selector.items())
            return f"{AFFINITY_REASON}: nodeSelector {{{shown}}} excludes node {node}"
    required = _map(_map(_map(pod_spec.get("affinity")).get("nodeAffinity"))
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if "nodeSelectorTerms" in required:
        terms = required.get("nodeSelectorTerms")
        results = [_term(t, node, labels) for t in (terms if isinstance(terms, list) else [])]
        if True not in results and None not in results:
            return f"{AFFINITY_REASON}: no term of requiredDuringSchedulingIgnoredDuringExecution matches node {node}"
    return None


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    labels = _map(metadata(node).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


# -- GPUs held by other workloads ----------------------------------------------------------------
def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = metadata(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def workload(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Who a pod belongs to: its controller (StatefulSet, Job, ...) by namespace, kind and name
    (so a pod `plan` expects, before its controller has a UID, belongs with the live ones); a bare
    pod by its namespace and map (bare pods written from one map are one workload)."""
    namespace = str(metadata(pod).get("namespace"))
    for owner in _list(metadata(pod).get("ownerReferences")):
        if owner.get("controller") is True:
            return ("owner", namespace, str(owner.get("kind")), str(owner.get("name")))
    text = map_text(pod)
    return ("map", namespace, text if isinstance(text, str) else "")


def held_devices(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The GPUs a pod on a node holds: the record bind wrote with its Binding, or, for a pod bound
    before records were written, its map entry when that entry names the pod's node."""
    annotations = _map(metadata(pod).get("annotations"))
    record = annotations.get(DEVICES_ANNOTATION)
    if isinstance(record, str):
        return tuple(d for d in (part.strip() for part in record.split(",")) if d)
    if spec(pod).get("schedulerName") != SCHEDULER_NAME or ANNOTATION not in annotations:
        return ()
    try:
        placement = resolve(pod).placement
    except NotPlaceable:
        return ()
    return placement.devices if placement.node == spec(pod).get("nodeName") else ()


def shares_gpus(pod: Mapping[str, Any]) -> bool:
    return _map(metadata(pod).get("annotations")).get(SHARE_ANNOTATION) == "true"


def gpus_held(pod: Mapping[str, Any], placement: Placement, info: "NodeInfo") -> str | None:
    """The first device of `placement` that a pod of another workload on the node holds, named
    with its holder; None when all are free to this pod. Two workloads that both set
    gpu-scheduler/share-gpus: "true" may share."""
    mine, sharing = workload(pod), shares_gpus(pod)
    for device in placement.devices:
        for other in info.pods:
            if device in other.devices and other.workload != mine and not (sharing and other.shares):
                return (f"GPU {device} on {placement.node} is held by {other.name} (another workload; "
                        f'both may set {SHARE_ANNOTATION}: "true" to share)')
    return None


# -- what the pods on a node occupy (kube-scheduler's NodeInfo) -------------------------------------
@dataclass(frozen=True)
class PodInfo:
    """What one non-terminal pod on a node occupies, worked out once per pod."""

    uid: str
    name: str  # namespace/name, to name a holder
    requests: Mapping[str, int]
    ports: tuple[tuple[str, str, int], ...]
    devices: tuple[str, ...]
    workload: tuple[str, ...]
    shares: bool

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> "PodInfo":
        return cls(str(metadata(pod).get("uid") or ""), _pod_name(pod), pod_requests(pod),
                   tuple(host_ports(pod)), held_devices(pod), workload(pod), shares_gpus(pod))


@dataclass(frozen=True)
class NodeInfo:
    """The non-terminal pods on a node and the sum of their requests."""

    pods: tuple[PodInfo, ...] = ()
    requested: Mapping[str, int] = field(default_factory=dict)
    uids: frozenset[str] = frozenset()

    @classmethod
    def of(cls, pods: Iterable[Mapping[str, Any] | PodInfo]) -> "NodeInfo":
        infos = tuple(p if isinstance(p, PodInfo) else PodInfo.of(p) for p in pods
                      if isinstance(p, PodInfo) or not is_terminal(p))
        requested: dict[str, int] = {}
        for info in infos:
            for name, units in info.requests.items():
                requested[name] = requested.get(name, 0) + units
        return cls(infos, requested, frozenset(i.uid for i in infos))

    def plus(self, info: PodInfo) -> "NodeInfo":
        """The node with one more pod on it (one this instance is binding)."""
        requested = dict(self.requested)
        for name, units in info.requests.items():
            requested[name] = requested.get(name, 0) + units
        return NodeInfo(self.pods + (info,), requested, self.uids | {info.uid})

    def without(self, uid: str) -> "NodeInfo":
        """The node as it is for a pod that may already be listed on it (a resync, a retry)."""
        return NodeInfo.of(p for p in self.pods if p.uid != uid) if uid in self.uids else self


# -- all of them -----------------------------------------------------------------------------------
NODE_PORTS, NODE_RESOURCES_FIT, GPUS_HELD = "NodePorts", "NodeResourcesFit", "GPUsHeld"


def fit_refusal(pod: Mapping[str, Any], node: Mapping[str, Any], placement: Placement,
                pods_on_node: "Iterable[Mapping[str, Any]] | NodeInfo") -> tuple[str, str] | None:
    """Why `pod` does not fit on `node` next to the pods on it, as (filter, message); None: it
    fits. In the order kube-scheduler runs its filters; GPU accounting last. Terminal pods and the
    pod itself do not count."""
    info = pods_on_node if isinstance(pods_on_node, NodeInfo) else NodeInfo.of(pods_on_node)
    info = info.without(str(metadata(pod).get("uid") or ""))
    for name, problem in ((NODE_AFFINITY, lambda: node_affinity(pod, placement.node, node_labels(node))),
                          (NODE_PORTS, lambda: node_ports(pod, info)),
                          (NODE_RESOURCES_FIT, lambda: node_resources_fit(pod, node, info)),
                          (GPUS_HELD, lambda: gpus_held(pod, placement, info))):
        message = problem()
        if message:
            return name, message
    return None


def fit_problem(pod: Mapping[str, Any], node: Mapping[str, Any], placement: Placement,
                pods_on_node: "Iterable[Mapping[str, Any]] | NodeInfo") -> str | None:
    """Why `pod` does not fit on `node` next to the pods on it (None: it fits)."""
    refusal = fit_refusal(pod, node, placement, pods_on_node)
    return refusal[1] if refusal else None


def bind_refusal(pod: Mapping[str, Any], node: Mapping[str, Any] | None, placement: Placement,
                 pods_on_node: "Iterable[Mapping[str, Any]] | NodeInfo" = ()) -> tuple[str, str] | None:
    """Why bind would not bind `pod` to `node` now, as (filter, message); None: it would. The
    node's own state (nodecheck), then the fit next to the pods already on it."""
    return node_refusal(pod, node, placement) or (fit_refusal(pod, node, placement, pods_on_node) if node else None)


def bind_problem(pod: Mapping[str, Any], node: Mapping[str, Any] | None, placement: Placement,
                 pods_on_node: "Iterable[Mapping[str, Any]] | NodeInfo" = ()) -> str | None:
    """Why bind would not bind `pod` to `node` now (None: it would). bind, `plan --cluster` and
    `explain` all ask this one question."""
    refusal = bind_refusal(pod, node, placement, pods_on_node)
    return refusal[1] if refusal else None
