"""What a pod occupies on a node, worked out once per pod (kube-scheduler's PodInfo and
NodeInfo): its effective requests (k8s.io/component-helpers/resource.PodRequests), its host ports
(scheduler util.GetHostPorts), the GPUs it holds and its workload. The filters that compare these
are the plugins (gpu_scheduler/plugins/), each in its own module.

Every function is total on odd shapes: what is not a list or an object counts as absent, an
unparseable quantity as zero (the API server validates these fields, so only a fake pod has them).
"""
from __future__ import annotations

import math
import re
import threading
from datetime import datetime
from functools import lru_cache
from dataclasses import dataclass, field
from fractions import Fraction
from collections.abc import Iterable, Mapping
from typing import Any

from . import ANNOTATION, SCHEDULER_NAME
from .shapes import as_map as _map
from .shapes import as_maps as _list
from .placement import ENTRY_ANNOTATION, NotPlaceable, map_text, metadata, resolve, spec
from .podindex import JOBSET_NAME_LABEL, LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, is_pool
from .schedmap import Placement

# -- names users know -----------------------------------------------------------------------------

# Written on the Binding, which the API server copies onto the pod in the same write: the devices
# bind gave the pod. What counts for accounting, even if the map annotation is edited later.
DEVICES_ANNOTATION = "gpu-scheduler/devices"
# A workload's pods placed together or not at all (plugins/gang.py, which owns the rule).
GANG_ANNOTATION = "gpu-scheduler/gang"
# A workload that sets this to "true" may share its GPUs with other workloads that set it too.
SHARE_ANNOTATION = "gpu-scheduler/share-gpus"
TERMINAL_PHASES = ("Succeeded", "Failed")
# Workloads whose pods their controllers label with the workload's name (fit.workload).
# A Knative Service's pods: every revision's (each its own Deployment) share one pool.
WORKLOAD_LABELS = (("JobSet", JOBSET_NAME_LABEL), ("LeaderWorkerSet", LWS_NAME_LABEL),
                   ("Service", "serving.knative.dev/service"))
# A ReplicaSet's pods belong to the ReplicaSet's owner, whose name the ReplicaSet's is, plus
# "-<the template hash label's value>": the pods of every ReplicaSet of a rollout share one pool.
REPLICASET_OWNERS = (("pod-template-hash", "Deployment"), ("rollouts-pod-template-hash", "Rollout"))
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


def scheduler_units(resource: str, amount: Fraction) -> int:
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
    place of cpu and memory where set; plus spec.overhead. In scheduler units (cpu in millicores).
    Worked out once per shape of those fields: a workload's pods share it, and bind works it out
    for every pod it lists or watches bound (a cold start at 20,000 pods spent 0.4 s here)."""
    pod_spec = spec(pod)
    key = _requests_key(pod_spec)
    if key is None:
        return _pod_requests(pod_spec)
    known = _REQUESTS_OF_SHAPE.get(key)
    if known is None:
        known = _pod_requests(pod_spec)
        with _REQUESTS_LOCK:
            if len(_REQUESTS_OF_SHAPE) >= MAX_SHAPES:
                _REQUESTS_OF_SHAPE.pop(next(iter(_REQUESTS_OF_SHAPE)))  # the oldest
            _REQUESTS_OF_SHAPE[key] = known
    return dict(known)


MAX_SHAPES = 1024
MAX_REQUESTS_KEY = 4096  # characters: past this a pod's requests are worked out, not remembered
_REQUESTS_OF_SHAPE: dict[str, dict[str, int]] = {}
_REQUESTS_LOCK = threading.Lock()


def _requests_key(pod_spec: Mapping[str, Any]) -> str | None:
    """What pod_requests reads of the spec, as text: the repr of JSON values (strings, numbers,
    booleans, null, lists, objects) is equal only for equal values. None when it is too long to
    remember."""
    def parts(containers: Any) -> Any:
        if not isinstance(containers, list):
            return containers
        return [(c.get("resources"), c.get("restartPolicy")) if isinstance(c, Mapping) else c for c in containers]
    key = repr((parts(pod_spec.get("containers")), parts(pod_spec.get("initContainers")),
                pod_spec.get("resources"), pod_spec.get("overhead")))
    return key if len(key) <= MAX_REQUESTS_KEY else None


def _pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
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
    return {name: scheduler_units(name, amount) for name, amount in total.items()}


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: its resources, ports and GPUs are free again."""
    return _map(pod.get("status")).get("phase") in TERMINAL_PHASES


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


# -- GPUs held by other workloads ----------------------------------------------------------------
def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = metadata(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def workload(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Who a pod belongs to: its controller (StatefulSet, Job, ...) by namespace, kind and name
    (so a pod `plan` expects, before its controller has a UID, belongs with the live ones); a bare
    pod by its namespace and map (bare pods written from one map are one workload).

    A JobSet's pods belong to the JobSet, not to their child Job, and a LeaderWorkerSet's to the
    LeaderWorkerSet, not to their group's StatefulSet: one map indexes all of them, and they share
    the devices their entries name, as the replicas of one StatefulSet do."""
    meta = metadata(pod)
    namespace = str(meta.get("namespace"))
    labels = _map(meta.get("labels"))
    for kind, label in WORKLOAD_LABELS:
        name = labels.get(label)
        if isinstance(name, str) and name:
            return ("owner", namespace, kind, name)
    for owner in _list(meta.get("ownerReferences")):
        if owner.get("controller") is True:
            kind, name = str(owner.get("kind")), str(owner.get("name"))
            if kind == "ReplicaSet":
                kind, name = _replicaset_owner(labels, name)
            return ("owner", namespace, kind, name)
    text = map_text(pod)
    return ("map", namespace, text if isinstance(text, str) else "")


def _replicaset_owner(labels: Mapping[str, Any], name: str) -> tuple[str, str]:
    """The Deployment (or Argo Rollout) a ReplicaSet of `name` belongs to, known from the pod's
    template-hash label; the ReplicaSet itself when the name does not end in it (a bare ReplicaSet)."""
    for label, kind in REPLICASET_OWNERS:
        digest = labels.get(label)
        if isinstance(digest, str) and digest and name.endswith(f"-{digest}"):
            return kind, name[: -len(digest) - 1]
    return "ReplicaSet", name


def pool_entry(pod: Mapping[str, Any]) -> int | None:
    """The pool entry a pool pod holds (its Binding's annotation), or None."""
    value = _map(metadata(pod).get("annotations")).get(ENTRY_ANNOTATION)
    if isinstance(value, str) and value.isdigit() and len(value) <= 10 and is_pool(metadata(pod)):
        return int(value)
    return None


def _pool_holding(pod: Mapping[str, Any]) -> tuple[int | None, str]:
    """(the pool entry the pod holds, its map's text), or (None, '') for a pod that holds none."""
    entry = pool_entry(pod)
    if entry is None:
        return None, ""
    text = map_text(pod)
    return entry, text if isinstance(text, str) else ""


def gang_key(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The pods a gang is formed from: the workload's, except that each group of a
    LeaderWorkerSet (its leader and workers) is a gang of its own."""
    return _gang_of(pod, workload(pod))


def _gang_of(pod: Mapping[str, Any], key: tuple[str, ...]) -> tuple[str, ...]:
    """gang_key, given the pod's workload (PodInfo.of has it already)."""
    if key[0] == "owner" and key[2] == "LeaderWorkerSet":
        return (*key, str(_map(metadata(pod).get("labels")).get(LWS_GROUP_INDEX_LABEL)))
    return key


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
    # What preemption (plugins/defaultpreemption.py) asks of a pod it might evict: its priority, its
    # labels (PodDisruptionBudgets select by them), whether it is terminating, and its gang.
    priority: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    terminating: bool = False
    gang: bool = False
    group: tuple[str, ...] = ()  # gang_key: the pods preemption evicts together with this one
    grace_seconds: int = 30  # spec.terminationGracePeriodSeconds: how long an eviction may take
    # status.startTime (epoch seconds): of two victims of equal priority the longer-running is the more
    # important, as kube-scheduler's util.MoreImportantPod; a pod not started counts as started now.
    started: float = math.inf
    entry: int | None = None  # the pool entry it holds (pool pods: plugins/poolentry.py)
    pool_map: str = ""  # and the map it was taken from (a rollout may change the map)
    # namespace/name of each ResourceClaim the pod references: in DRA mode, preemption frees the
    # devices of a victim's claims. A pool pod's claim is named from its admission, not its name.
    claims: tuple[str, ...] = ()

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> "PodInfo":
        meta = metadata(pod)
        labels = _map(meta.get("labels"))
        mine = workload(pod)
        return cls(str(meta.get("uid") or ""), _pod_name(pod), pod_requests(pod),
                   tuple(host_ports(pod)), held_devices(pod), mine, shares_gpus(pod),
                   pod_priority(pod), tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                   bool(meta.get("deletionTimestamp")), GANG_ANNOTATION in _map(meta.get("annotations")),
                   _gang_of(pod, mine), _grace_seconds(pod), _start_time(pod), *_pool_holding(pod), _claims(pod))


def _claims(pod: Mapping[str, Any]) -> tuple[str, ...]:
    namespace = metadata(pod).get("namespace")
    return tuple(f"{namespace}/{c['resourceClaimName']}" for c in _list(spec(pod).get("resourceClaims"))
                 if isinstance(c.get("resourceClaimName"), str))


def _grace_seconds(pod: Mapping[str, Any]) -> int:
    value = spec(pod).get("terminationGracePeriodSeconds")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 30


def _start_time(pod: Mapping[str, Any]) -> float:
    status = pod.get("status") if isinstance(pod, Mapping) else None
    value = status.get("startTime") if isinstance(status, Mapping) else None
    if not isinstance(value, str):
        return math.inf
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return math.inf


def pod_priority(pod: Mapping[str, Any]) -> int:
    """spec.priority, which the API server's Priority admission sets from the PriorityClass (0 when none)."""
    value = spec(pod).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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
