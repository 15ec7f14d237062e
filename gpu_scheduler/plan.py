"""What `kubectl gpu-scheduler plan` and `explain` show, without I/O.

A workload (StatefulSet, Job, Pod; a JobSet's replicated job; a LeaderWorkerSet) becomes the pods its controller will create, each as it will be
created (name, index label or annotation), and each pod goes through the same functions admission
and bind use: `placement.resolve`, `devices.device_env`, `devices.device_warnings`,
`binding.bind_decision`, and bind's own scheduling framework (`Framework.evaluate`, the dry run
of the cycle bind runs, on snapshots of the pods' nodes: `answer` below renders it). The plugin (kubectl_gpu_scheduler/) only
reads files and the API and formats what these functions return.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from . import ANNOTATION, SCHEDULER_NAME
from .binding import Bind, Ignore, Unplaceable, bind_decision
from .devices import CUDA, MODE_ANNOTATION, NVIDIA, ModeError, device_env, device_mode, device_warnings
from .fit import gang_key, is_terminal, workload as workload_of
from .fit import PodInfo
from .framework.runtime import PRE_ENQUEUE, Framework, Verdict
from .framework.snapshot import NodeSnapshot
from .plugins import gang as gangs
from .plugins.gang import GANG_ANNOTATION, GangError, WorkloadMembers, gang_size
from .plugins.nodeaffinity import AFFINITY_REASON, node_affinity
from .plugins.nodeaffinity import NAME as NODE_AFFINITY
from .queueing import UNSCHEDULABLE_FLUSH_SECONDS, retried_on
from .placement import NO_ENTRY, NotPlaceable, map_text, metadata, resolve, spec
from .templatecount import template_counts
from .podindex import (
    JOB_INDEX_KEY, JOBSET_JOB_INDEX_LABEL, JOBSET_NAME_LABEL, JOBSET_REPLICATED_JOB_LABEL, JOBSET_UID_LABEL,
    LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_SIZE_ANNOTATION, LWS_WORKER_INDEX_LABEL, STATEFULSET_INDEX_LABEL,
    index_source,
)
from .schedmap import MapError, Placement, parse_map
from .workloads import jobset_annotations, replicated_jobs

# A plan shows one row per replica; a manifest asking for more is refused rather than listed
# for minutes (StatefulSet replicas and Job completions are int32 in the API).
MAX_REPLICAS = 10_000
STATEFULSET_POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CONTROLLER_API_VERSIONS = {"StatefulSet": "apps/v1", "Job": "batch/v1", "Deployment": "apps/v1",
                           "ReplicaSet": "apps/v1", "DaemonSet": "apps/v1"}
# JobSet v0.10.1 (jobset.x-k8s.io/v1alpha2): what its controller writes on a child Job's pods (labels
# and annotations alike), besides the Job controller's own.
JOBSET_REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOBSET_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
LEGACY_JOB_NAME_LABEL = "job-name"
# LeaderWorkerSet v0.7.0 (leaderworkerset.x-k8s.io/v1): a worker's annotation naming its leader.
LWS_LEADER_NAME_ANNOTATION = "leaderworkerset.sigs.k8s.io/leader-name"
# Kinds whose pods are indexed by the map (a JobSet's replicated job, a LeaderWorkerSet's groups).
INDEXED_KINDS = ("StatefulSet", "Job", "JobSet", "LeaderWorkerSet")
# Row problems beyond placement's (MalformedMap, UnknownIndex, NoMapEntry).
NOT_OUR_SCHEDULER = "NotOurScheduler"
UNSCHEDULABLE = "Unschedulable"
# Kinds whose pods are created from a template with generateName: they have no index.
UNINDEXED_KINDS = {"Deployment": ("spec", "template"), "ReplicaSet": ("spec", "template"),
                   "DaemonSet": ("spec", "template"), "ReplicationController": ("spec", "template"),
                   "CronJob": ("spec", "jobTemplate", "spec", "template")}


class ManifestError(ValueError):
    """A manifest the plan cannot use; the message names the field (or the map's line)."""


# -- workloads -> the pods they create -------------------------------------------------------
def found(value: Any, shown: int = 60) -> str:
    """`value` as a manifest's reader knows it (YAML/JSON terms), for messages: nothing, true,
    -1, "3", a list, an object; never Python's None, True or 'quotes'."""
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, (bool, int, float, str)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= shown else f"{text[:shown]}..."
    return f"a {type(value).__name__}"  # YAML timestamps and binary: only safe_load's types remain


def _object(value: Any, where: str, required: bool = True) -> Mapping[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where}: expected an object, found {found(value)}")
    return value


def _count(value: Any, where: str, default: int | None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{where}: expected a non-negative integer, found {found(value)}")
    if value > MAX_REPLICAS:
        raise ManifestError(f"{where} is {value}; a plan lists at most {MAX_REPLICAS} pods")
    return value


@dataclass(frozen=True)
class Workload:
    """A pod-creating object: its pod template and the indexes its pods will have (None: a pod
    whose index is its own business, or pods created with generateName, which have none)."""

    kind: str
    namespace: str
    name: str
    template: Mapping[str, Any] = field(repr=False)
    indexes: tuple[int | None, ...]
    # The pods the manifest asks for: spec.replicas, an Indexed Job's spec.completions, 1 for a
    # Pod; None for pods named with generateName (one row stands for all of them).
    replicas: int | None = None
    ordinals_start: int | None = None  # a StatefulSet's spec.ordinals.start
    pod_management_policy: Any = None  # a StatefulSet's spec.podManagementPolicy, as written (None: unset)
    # A JobSet: the replicated job (`part`), its child Jobs (`groups`, its replicas) and their
    # completions (`group_size`); the JobSet itself (`source`), which mutate reads for its pods.
    # A LeaderWorkerSet: its groups (spec.replicas) and their size; `template` is its workerTemplate
    # and `leader_template` its leaderTemplate (None: the leader is created from the workerTemplate).
    part: str | None = None
    groups: int | None = None
    group_size: int | None = None
    leader_template: Mapping[str, Any] | None = field(default=None, repr=False)
    source: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def indexed(self) -> bool:
        return self.kind in INDEXED_KINDS and None not in self.indexes

    @property
    def counted(self) -> str:
        return counted(self.kind, self.indexed, self.replicas, self.ordinals_start, self.groups, self.group_size)

    @property
    def title(self) -> str:
        """The workload as people name it: "JobSet team/train, replicated job workers"."""
        return f"{self.kind} {self.namespace}/{self.name}" + (f", replicated job {self.part}" if self.part else "")

    @property
    def templates(self) -> tuple[Mapping[str, Any], ...]:
        """Every pod template of the workload (a LeaderWorkerSet's leader's, then its workers')."""
        return (self.template,) if self.leader_template is None else (self.leader_template, self.template)

    @property
    def placed_together(self) -> int:
        """How many consecutive indexes suggest keeps on as few nodes as fit: a LeaderWorkerSet's
        group, a JobSet's whole replicated job, else one pod."""
        if self.kind == "LeaderWorkerSet":
            return max(self.group_size or 1, 1)
        if self.kind == "JobSet":
            return max(len(self.indexes), 1)
        return 1


def counted(kind: str, indexed: bool, replicas: int | None, ordinals_start: int | None,
            groups: int | None = None, group_size: int | None = None) -> str:
    """How a workload's pods and indexes come about, for people: "replicas 5, ordinals.start 2"."""
    if kind == "Pod":
        return "the pod itself"
    if kind in ("JobSet", "LeaderWorkerSet"):
        per = "completions" if kind == "JobSet" else "size"
        return f"replicas {groups} × {per} {group_size} = {replicas} pod{'s' if replicas != 1 else ''}"
    if not indexed:
        return f"a {'NonIndexed Job' if kind == 'Job' else kind}'s pods are named with generateName"
    if kind == "Job":
        return f"Indexed, completions {replicas}"
    return f"replicas {replicas}" + (f", ordinals.start {ordinals_start}" if ordinals_start else "")


def objects_in(document: Any) -> list[Mapping[str, Any]]:
    """The objects of one YAML/JSON document: itself, or the items of a `kind: List`."""
    if document is None:
        return []
    if not isinstance(document, Mapping):
        raise ManifestError(f"expected a Kubernetes object, found {found(document)}")
    if document.get("kind") == "List":
        items = document.get("items")
        if not isinstance(items, list):
            raise ManifestError("items: a List needs a list of items")
        for position, item in enumerate(items):
            _object(item, f"items[{position}]")
        return list(items)
    return [document]


def workload(obj: Mapping[str, Any], namespace: str = "default") -> Workload | None:
    """The workload an object describes, or None for objects that create no pods of ours
    (a Service, a ConfigMap, a Deployment without the annotation). `namespace` applies to an
    object that names none, as `kubectl apply -n` does. A JobSet may describe several (one per
    replicated job with the map): this is the first; `workloads` gives them all."""
    found = workloads(obj, namespace)
    return found[0] if found else None


def workloads(obj: Mapping[str, Any], namespace: str = "default") -> list[Workload]:
    """Every workload an object describes: one per JobSet replicated job whose pod template
    carries the map, else the one `_workload` gives (none for objects that create no pods of ours)."""
    kind = obj.get("kind")
    if kind not in ("JobSet", "LeaderWorkerSet"):
        work = _workload(obj, namespace)
        return [] if work is None else [work]
    meta = _object(obj.get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"metadata.name: a {kind} needs a name")
    ns = meta.get("namespace") or namespace
    if not isinstance(ns, str):
        raise ManifestError(f"metadata.namespace: expected a string, found {found(ns)}")
    obj_spec = _object(obj.get("spec"), "spec")
    if kind == "JobSet":
        return _jobset_workloads(obj, obj_spec, ns, name)
    work = _lws_workload(obj_spec, ns, name)
    return [] if work is None else [work]


def _pod_template(value: Any, where: str, required: bool = True) -> Mapping[str, Any] | None:
    """A pod template at `where`, its metadata and spec checked as the API server would."""
    if value is None and not required:
        return None
    template = _object(value, where)
    _object(template.get("metadata"), f"{where}.metadata", required=False)
    _object(template.get("spec"), f"{where}.spec")
    return template


def _pods(count: int, where: str) -> int:
    if count > MAX_REPLICAS:
        raise ManifestError(f"{where} = {count} pods; a plan lists at most {MAX_REPLICAS} pods")
    return count


def _jobset_workloads(obj: Mapping[str, Any], obj_spec: Mapping[str, Any], ns: str, name: str) -> list[Workload]:
    """A JobSet's replicated jobs whose pod template carries the map: each makes `replicas` child
    Jobs of `completions` indexed pods (JobSet defaults completionMode to Indexed)."""
    jobs = obj_spec.get("replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        raise ManifestError(f"spec.replicatedJobs: expected a list of replicated jobs, found {found(jobs)}")
    checked = []
    for position, job in enumerate(jobs):
        where = f"spec.replicatedJobs[{position}]"
        job = _object(job, where)
        job_name = job.get("name")
        if not isinstance(job_name, str) or not job_name:
            raise ManifestError(f"{where}.name: a replicated job needs a name, found {found(job_name)}")
        replicas = _count(job.get("replicas"), f"{where}.replicas", 1)
        job_template = _object(job.get("template"), f"{where}.template")
        job_spec = _object(job_template.get("spec"), f"{where}.template.spec")
        template = _pod_template(job_spec.get("template"), f"{where}.template.spec.template")
        mode = job_spec.get("completionMode")
        if mode not in (None, "Indexed"):
            raise ManifestError(f"{where}.template.spec.completionMode: a JobSet's pods have an index only with"
                                f" Indexed (JobSet's default), found {found(mode)}")
        parallelism = _count(job_spec.get("parallelism"), f"{where}.template.spec.parallelism", 1)
        completions = _count(job_spec.get("completions"), f"{where}.template.spec.completions", parallelism)
        checked.append((job_name, replicas, completions, template))
    found_works = []
    for position, (job_name, replicas, completions, template) in enumerate(checked):
        if map_text(template) is None:
            continue
        pods = _pods(replicas * completions, f"spec.replicatedJobs[{position}]: replicas {replicas} ×"
                                             f" template.spec.completions {completions}")
        found_works.append(Workload("JobSet", ns, name, template, tuple(range(pods)), pods, part=job_name,
                                    groups=replicas, group_size=completions, source=obj))
    return found_works


def _lws_workload(obj_spec: Mapping[str, Any], ns: str, name: str) -> Workload | None:
    """A LeaderWorkerSet: `replicas` groups of `size` pods, the leader (worker 0) from the
    leaderTemplate when there is one, else from the workerTemplate."""
    replicas = _count(obj_spec.get("replicas"), "spec.replicas", 1)
    lwt = _object(obj_spec.get("leaderWorkerTemplate"), "spec.leaderWorkerTemplate")
    size = _count(lwt.get("size"), "spec.leaderWorkerTemplate.size", 1)
    if size < 1:
        raise ManifestError(f"spec.leaderWorkerTemplate.size: expected at least 1 (the leader), found {size}")
    workers = _pod_template(lwt.get("workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate")
    leader = _pod_template(lwt.get("leaderTemplate"), "spec.leaderWorkerTemplate.leaderTemplate", required=False)
    if all(map_text(t) is None for t in (workers, leader) if t is not None):
        return None
    pods = _pods(replicas * size, f"spec.replicas {replicas} × spec.leaderWorkerTemplate.size {size}")
    return Workload("LeaderWorkerSet", ns, name, workers, tuple(range(pods)), pods, groups=replicas,
                    group_size=size, leader_template=leader)


def _workload(obj: Mapping[str, Any], namespace: str) -> Workload | None:
    kind = obj.get("kind")
    meta = _object(obj.get("metadata"), "metadata")
    name = meta.get("name")
    if kind not in ("Pod", "StatefulSet", "Job", *UNINDEXED_KINDS):
        return None
    if not isinstance(name, str) or not name:
        if kind != "Pod" or not meta.get("generateName"):
            raise ManifestError(f"metadata.name: a {kind} needs a name")
        name = f"{meta['generateName']}*"
    ns = meta.get("namespace") or namespace
    if not isinstance(ns, str):
        raise ManifestError(f"metadata.namespace: expected a string, found {found(ns)}")
    obj_spec = _object(obj.get("spec"), "spec")
    if kind == "Pod":
        pod = {**obj, "metadata": {**meta, "namespace": ns}}
        return Workload(kind, ns, name, pod, (None,), 1)
    if kind in UNINDEXED_KINDS:
        path = UNINDEXED_KINDS[kind]
        template: Any = obj
        for key in path:
            template = template.get(key) if isinstance(template, Mapping) else None
        template = _object(template, ".".join(path))
        if map_text(template) is None:
            return None
        return Workload(kind, ns, name, template, (None,))
    template = _object(obj_spec.get("template"), "spec.template")
    _object(template.get("metadata"), "spec.template.metadata", required=False)
    _object(template.get("spec"), "spec.template.spec")
    if kind == "StatefulSet":
        replicas = _count(obj_spec.get("replicas"), "spec.replicas", 1)
        ordinals = _object(obj_spec.get("ordinals"), "spec.ordinals", required=False)
        start = _count(ordinals.get("start"), "spec.ordinals.start", 0)
        return Workload(kind, ns, name, template, tuple(range(start, start + replicas)), replicas, start,
                        obj_spec.get("podManagementPolicy"))
    mode = obj_spec.get("completionMode") or "NonIndexed"
    if mode == "Indexed":
        completions = _count(obj_spec.get("completions"), "spec.completions", None)
        return Workload(kind, ns, name, template, tuple(range(completions)), completions)
    if mode != "NonIndexed":
        raise ManifestError(f"spec.completionMode: expected Indexed or NonIndexed, found {found(mode)}")
    return Workload(kind, ns, name, template, (None,))


def pod_for(work: Workload, index: int | None) -> dict[str, Any]:
    """The pod `work`'s controller creates for `index`, with the name, labels and annotations
    that decide its index (what admission and bind will see)."""
    if work.kind == "Pod":
        return copy.deepcopy(dict(work.template))
    if work.kind == "JobSet" and index is not None:
        return _jobset_pod(work, index)
    if work.kind == "LeaderWorkerSet" and index is not None:
        return _lws_pod(work, index)
    meta = dict(metadata(work.template))
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    meta.pop("name", None)
    meta["namespace"] = work.namespace
    if work.kind == "StatefulSet" and index is not None:
        meta["name"] = f"{work.name}-{index}"
        labels.update({STATEFULSET_INDEX_LABEL: str(index), STATEFULSET_POD_NAME_LABEL: meta["name"]})
    elif work.kind == "Job":
        labels[JOB_NAME_LABEL] = work.name
        if index is None:
            meta["generateName"] = f"{work.name}-"
        else:
            meta["generateName"] = f"{work.name}-{index}-"
            labels[JOB_INDEX_KEY] = annotations[JOB_INDEX_KEY] = str(index)
    else:
        meta["generateName"] = f"{work.name}-"
    meta["labels"], meta["annotations"] = labels, annotations
    # As its controller sets it: the workload GPU accounting counts the pod in (fit.workload).
    meta["ownerReferences"] = [{"apiVersion": CONTROLLER_API_VERSIONS.get(work.kind, "v1"), "kind": work.kind,
                                "name": work.name, "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(dict(spec(work.template)))}


def _from_template(template: Mapping[str, Any], namespace: str) -> tuple[dict, dict, dict, dict]:
    """A copy of the template's metadata (no name), its labels and annotations, and its spec."""
    meta = dict(metadata(template))
    meta.pop("name", None)
    meta.pop("generateName", None)
    meta["namespace"] = namespace
    return (meta, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}),
            copy.deepcopy(dict(spec(template))))


def _pod(meta: dict, labels: dict, annotations: dict, pod_spec: dict, owner: Mapping[str, Any]) -> dict[str, Any]:
    meta["labels"], meta["annotations"] = labels, annotations
    meta["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _jobset_pod(work: Workload, index: int) -> dict[str, Any]:
    """Pod `index` of a JobSet's replicated job, as JobSet v0.10.1 labels its child Job
    `<jobset>-<replicated job>-<job index>` and the Job controller its pods, with what mutate
    writes on them (workloads.jobset_annotations: the Job's completions, the gang's size)."""
    completions = work.group_size or 1
    job_index, completion = divmod(index, completions)
    jobs = replicated_jobs(work.source or {})
    replicas = [(job.get("name"), _count(job.get("replicas"), "replicas", 1)) for job in jobs]
    before = sum(count for job_name, count in replicas[:[n for n, _ in replicas].index(work.part)])
    job_name = f"{work.name}-{work.part}-{job_index}"
    meta, labels, annotations, pod_spec = _from_template(work.template, work.namespace)
    jobset = {JOBSET_NAME_LABEL: work.name, JOBSET_REPLICATED_JOB_LABEL: str(work.part),
              JOBSET_REPLICATED_JOB_REPLICAS: str(work.groups), JOBSET_JOB_INDEX_LABEL: str(job_index),
              JOBSET_GLOBAL_INDEX: str(before + job_index),
              JOBSET_GLOBAL_REPLICAS: str(sum(count for _, count in replicas))}
    uid = metadata(work.source or {}).get("uid")
    if isinstance(uid, str) and uid:
        jobset[JOBSET_UID_LABEL] = uid
    labels.update(jobset)
    annotations.update(jobset)
    labels.update({JOB_NAME_LABEL: job_name, LEGACY_JOB_NAME_LABEL: job_name, JOB_INDEX_KEY: str(completion)})
    annotations[JOB_INDEX_KEY] = str(completion)
    annotations.update(jobset_annotations(work.source or {}, str(work.part)) or {})
    meta["generateName"] = f"{job_name}-{completion}-"
    return _pod(meta, labels, annotations, pod_spec, {"apiVersion": "batch/v1", "kind": "Job", "name": job_name})


def _lws_pod(work: Workload, index: int) -> dict[str, Any]:
    """Pod `index` of a LeaderWorkerSet, as v0.7.0 creates it: group g = index // size, worker
    w = index % size; the leader (w = 0) `<lws>-<g>` of StatefulSet `<lws>`, from the leaderTemplate
    if there is one; worker `<lws>-<g>-<w>` of StatefulSet `<lws>-<g>`, from the workerTemplate."""
    size = work.group_size or 1
    group, worker = divmod(index, size)
    leader_name = f"{work.name}-{group}"
    leader = worker == 0
    template = work.leader_template if leader and work.leader_template is not None else work.template
    meta, labels, annotations, pod_spec = _from_template(template, work.namespace)
    meta["name"] = leader_name if leader else f"{leader_name}-{worker}"
    labels.update({LWS_NAME_LABEL: work.name, LWS_GROUP_INDEX_LABEL: str(group), LWS_WORKER_INDEX_LABEL: str(worker),
                   STATEFULSET_INDEX_LABEL: str(group if leader else worker),
                   STATEFULSET_POD_NAME_LABEL: meta["name"]})
    annotations[LWS_SIZE_ANNOTATION] = str(size)
    if not leader:
        annotations[LWS_LEADER_NAME_ANNOTATION] = leader_name
    owner = work.name if leader else leader_name
    return _pod(meta, labels, annotations, pod_spec, {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner})


def pod_name(pod: Mapping[str, Any]) -> str:
    """The pod's name, or `<generateName>*` for one the API server will name."""
    meta = metadata(pod)
    return meta.get("name") or f"{meta.get('generateName') or ''}*"


# -- a plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Note:
    reason: str
    message: str


@dataclass(frozen=True)
class Row:
    """One pod of a workload: where it goes, the env it gets, and why it would not be placed."""

    index: int | None
    pod: str
    node: str = ""
    devices: tuple[str, ...] = ()
    mode: str | None = None  # the pod's device-env annotation; None: the webhook's DEVICE_ENV_MODE
    env: Mapping[str, str] = field(default_factory=dict)         # cuda mode
    nvidia_env: Mapping[str, str] = field(default_factory=dict)  # nvidia mode
    problems: tuple[Note, ...] = ()
    warnings: tuple[Note, ...] = ()
    gang: str = ""  # the gang the pod belongs to (gangs.gang_name), "" for none
    pod_object: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def placeable(self) -> bool:
        return not self.problems

    @property
    def placement(self) -> Placement:
        return Placement(self.node, self.devices)


# -- gangs (docs/gangs.md) ---------------------------------------------------------------------
BOUND, PLACEABLE, REFUSED, EXPECTED = "bound", "placeable", "refused", "expected"  # a member's state


@dataclass(frozen=True)
class GangMember:
    """One member of a gang: `name` is namespace/name (as bind's messages name members); `state`
    bound (on `node`), placeable (on `node`, now), refused (by `plugin`, `message`), or expected
    (plan without --cluster: a pod its controller will create, nothing decided)."""

    name: str
    state: str
    node: str = ""
    plugin: str = ""
    message: str = ""


@dataclass(frozen=True)
class Gang:
    """A gang as plan and explain show it; `verdict`: what bind decides for the gang as a whole
    (Framework.evaluate), None when nothing was decided (plan without --cluster)."""

    name: str
    size: int
    members: tuple[GangMember, ...]
    verdict: Scheduling | None = None

    @property
    def bound(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members if m.state == BOUND)

    @property
    def missing(self) -> int:
        """Members the gang needs that do not exist (or that the manifest does not create)."""
        return max(0, self.size - len(self.members))


def _name_of(pod: Mapping[str, Any]) -> str:
    return f"{metadata(pod).get('namespace')}/{metadata(pod).get('name')}"


class Lazy:
    """Pods read once, when first asked for (the namespace's pods: only a pod's group needs them)."""

    def __init__(self, read: Callable[[], Iterable[Mapping[str, Any]]]):
        self._read, self._pods = read, None

    def __iter__(self):
        if self._pods is None:
            self._pods = tuple(self._read())
        return iter(self._pods)


class ReadView:
    """What bind's framework reads, from what explain and plan read (the handle of `evaluate`):
    node snapshots (`snapshot_of(node, pods)`: the node as read, with the claims of `pods`, each
    node read once), the PodDisruptionBudgets read, and the pods of the namespace (a manifest's
    pods for plan: pending, none bound)."""

    def __init__(self, snapshot_of: Callable[[str, tuple[Mapping[str, Any], ...]], NodeSnapshot],
                 pods: Iterable[Mapping[str, Any]] = (), pdbs: Iterable[Mapping[str, Any]] = ()):
        self._snapshot_of, self._pods, self._pdbs = snapshot_of, pods, tuple(pdbs)
        self._deciding: tuple[Mapping[str, Any], ...] = ()
        self._snapshots: dict[str, NodeSnapshot] = {}

    def group_formed(self, pods) -> None:
        if tuple(pods) != self._deciding:
            self._deciding, self._snapshots = tuple(pods), {}

    def snapshot(self, node: str) -> NodeSnapshot:
        if node not in self._snapshots:
            self._snapshots[node] = self._snapshot_of(node, self._deciding)
        return self._snapshots[node]

    def pdbs(self, node: NodeSnapshot) -> tuple[Mapping[str, Any], ...]:
        return self._pdbs

    def members_of(self, key: tuple[str, ...]) -> tuple[tuple[str, PodInfo], ...]:
        return ()  # a victim's gang members on other nodes are not looked up here (bind does)

    def workload_pods(self, key: tuple[str, ...]) -> WorkloadMembers:
        pending, bound = [], []
        for other in self._pods:
            if gang_key(other) != key or is_terminal(other):
                continue
            if spec(other).get("nodeName"):
                bound.append(_name_of(other))
            elif spec(other).get("schedulerName") == SCHEDULER_NAME and not metadata(other).get("deletionTimestamp"):
                pending.append(other)
        return WorkloadMembers(pending, bound)

    def nodes(self) -> dict[str, str]:
        """Each bound pod's node, by namespace/name."""
        return {_name_of(p): str(spec(p)["nodeName"]) for p in self._pods if spec(p).get("nodeName")}


@dataclass(frozen=True)
class Answer:
    """What bind would do with one pod now (`scheduling`), and with its gang (`gang`, None for a
    pod alone): one rendering of one Verdict."""

    scheduling: Scheduling
    gang: Gang | None = None


def answer(pod: Mapping[str, Any], framework: Framework, view: ReadView) -> Answer:
    """What bind's next attempt would decide for `pod`: its framework's dry run (PreEnqueue, the
    pod's group, PreFilter, Filter, the group's quorum and PostFilter's choice), rendered as bind
    words it: the message of a refusal is the one bind's FailedScheduling Event gives the pod."""
    decision = bind_decision(pod)
    if isinstance(decision, Ignore):  # bind's own words quote schedulerName as Python would
        said = Scheduling("nothing", spec(pod).get("nodeName") or "", "", "Ignored", not_ours(pod) or decision.why)
        return Answer(said, _bound_member_gang(pod, framework, view) if spec(pod).get("nodeName") else None)
    verdict = framework.evaluate(pod, view)
    gang = None if verdict.group.alone else _gang_of(verdict, view.nodes())
    return Answer(_scheduling(pod, verdict), gang)


def _bound_member_gang(pod: Mapping[str, Any], framework: Framework, view: ReadView) -> Gang | None:
    """A bound pod's gang, as its pending members' cycle sees it (the pod among the bound)."""
    group = framework.group_of(pod, view)
    if group.alone:
        return None
    uid = metadata(pod).get("uid")
    others = [p for p in group.pending if p is not pod and (not uid or metadata(p).get("uid") != uid)]
    if others:
        return _gang_of(framework.evaluate(others[0], view), view.nodes())
    nodes = view.nodes()
    return Gang(group.name, group.min_count, tuple(GangMember(name, BOUND, nodes.get(name, "")) for name in group.bound))


def _scheduling(pod: Mapping[str, Any], verdict: Verdict, as_gang: bool = False) -> Scheduling:
    """The verdict for `pod` (or, `as_gang`, for its whole gang)."""
    status = verdict.status
    mine = verdict.of(pod)
    node = mine.decision.node_name if mine else ""
    if status.ok:
        if not as_gang:
            return Scheduling("bind", node, "", "Bind", f"bind to {node}")
        placeable = sum(1 for m in verdict.members if m.decision.status.ok)
        return Scheduling("bind", "", "", "Bind", f"bind {placeable} members together"
                          + (f" ({len(verdict.group.bound)} bound already)" if verdict.group.bound else ""))
    if verdict.phase == PRE_ENQUEUE:
        return Scheduling("wait", "", status.plugin, status.reason, status.message, tuple(retried_on(status.plugin)))
    waits = verdict.waits_on
    if waits is not None and not verdict.group.alone:
        node = waits.decision.node_name
    again = tuple(retried_on(waits.decision.status.plugin if waits else status.plugin))
    if status.reason == gangs.MEMBERS_MISSING:
        again = (*again, "a member of the gang created")
    preemption = verdict.post_filter.explained if verdict.post_filter else ""
    return Scheduling("wait", node, status.plugin, status.reason, status.message, again, preemption)


def _gang_of(verdict: Verdict, nodes: Mapping[str, str]) -> Gang:
    """The gang as plan and explain show it: each member's own state, and the gang's verdict."""
    group = verdict.group
    members = [GangMember(name, BOUND, nodes.get(name, "")) for name in group.bound]
    for member in verdict.members:
        node, status = member.decision.node_name, member.decision.status
        members.append(GangMember(member.name, PLACEABLE, node) if status.ok else
                       GangMember(member.name, REFUSED, node, status.plugin, status.message))
    return Gang(group.name, group.min_count, tuple(members),
                _scheduling(group.pending[0], verdict, as_gang=True) if group.pending else None)


@dataclass(frozen=True)
class WorkloadPlan:
    work: Workload
    rows: tuple[Row, ...]
    warnings: tuple[Note, ...] = ()
    gang: Gang | None = None  # the gang its pods form (gpu-scheduler/gang), as expected: none decided
    gangs: tuple[Gang, ...] = ()  # every gang (a LeaderWorkerSet: one per group); gang is the first
    index_source: str | None = None  # podindex's source of its pods' indexes (IndexSource.name)
    # What mutate writes on the template for queues that count templates (Kueue): the largest entry's
    # GPUs (templatecount.py), and whether that is every entry's (exact) or an upper bound.
    template_counts: Mapping[str, str] | None = None
    template_counts_exact: bool = True

    @property
    def placeable(self) -> bool:
        return all(row.placeable for row in self.rows)


def _listing(indexes: list[int], shown: int = 10) -> str:
    head = ", ".join(map(str, indexes[:shown]))
    return head if len(indexes) <= shown else f"{head}, ... ({len(indexes)} in all)"


def not_ours(pod: Mapping[str, Any]) -> str | None:
    """Why gpu-scheduler does not place `pod` (another scheduler does); None: it does."""
    name = spec(pod).get("schedulerName")
    if name == SCHEDULER_NAME:
        return None
    given = "is not set (the default scheduler's)" if name is None else f"is {found(name)}"
    return (f"spec.schedulerName {given}, not {SCHEDULER_NAME}: another scheduler places this pod"
            " and the map's node is not enforced")


def _row(pod: Mapping[str, Any], index: int | None) -> Row:
    name = pod_name(pod)
    problems: list[Note] = []
    other_scheduler = not_ours(pod)
    if other_scheduler:
        problems.append(Note(NOT_OUR_SCHEDULER, other_scheduler))
    try:
        resolved = resolve(pod)
    except NotPlaceable as why:
        return Row(index, name, problems=(*problems, Note(why.reason, why.message)), pod_object=pod)
    placement = resolved.placement
    contradiction = node_affinity(pod, placement.node)
    if contradiction:
        problems.append(Note(NODE_AFFINITY, contradiction))
    annotations = metadata(pod).get("annotations") or {}
    return Row(resolved.index, name, placement.node, placement.devices, annotations.get(MODE_ANNOTATION),
               device_env(placement, CUDA), device_env(placement, NVIDIA), tuple(problems),
               tuple(Note(r, m) for r, m in device_warnings(pod, resolved)), pod_object=pod)


def _template_where(work: Workload) -> str:
    if work.kind == "Pod":
        return ""
    if work.kind == "JobSet":
        return f"spec.replicatedJobs[{work.part}].template.spec.template."
    if work.kind == "LeaderWorkerSet":
        return "spec.leaderWorkerTemplate.workerTemplate."
    return "spec.template."


def plan(work: Workload) -> WorkloadPlan:
    """Every pod of `work` and where it goes. A malformed map or device-env annotation is the
    workload's error (every pod would be refused at admission): ManifestError, naming the line."""
    texts = [map_text(t) for t in work.templates]
    if all(text is None for text in texts):
        raise ManifestError(f"{_template_where(work)}metadata.annotations has no {ANNOTATION}")
    pods = {index: pod_for(work, index) for index in work.indexes}
    try:
        entries: dict = {}
        for template, text in zip(work.templates, texts):
            if text is not None:
                entries.update(parse_map(text))
            device_mode(template)
        # As bind reads it: on the pod (a JobSet's carries the gang's size, an LWS's its group's).
        sizes = {index: gang_size(pod) for index, pod in pods.items()} or {None: gang_size(work.template)}
    except (MapError, ModeError, GangError) as error:
        raise ManifestError(str(error)) from None
    rows = tuple(_row(pods[index], index) for index in work.indexes)
    size = next((s for s in sizes.values() if s is not None), None)
    formed = tuple(_gangs(work, rows, sizes))
    rows = tuple(dataclasses.replace(row, gang=name) for row, name in zip(rows, _row_gangs(work, rows, sizes)))
    warnings = list(_gang_warnings(work, size, formed))
    if work.indexed:
        beyond = sorted(set(entries) - set(work.indexes))
        if beyond:
            warnings.append(Note("UnusedEntries", f"map entries {_listing(beyond)} are beyond the pod indexes of "
                                 f"{work.counted}: no pod uses them"))
        missing = [row.index for row in rows if any(p.reason == NO_ENTRY for p in row.problems)]
        if missing:
            warnings.append(Note("ReplicasWithoutEntry", f"pod indexes {_listing(missing)} have no map entry:"
                                 " those pods will stay Pending"))
    source = index_source(metadata(pods[work.indexes[0]])).name if work.indexes and work.indexed else None
    counts = template_counts(next(t for t in texts if t is not None), None) if work.kind != "Pod" else None
    exact = len({len(p.devices) for p in entries.values()}) <= 1
    return WorkloadPlan(work, rows, tuple(warnings), formed[0] if formed else None, formed, source, counts, exact)


def _row_gangs(work: Workload, rows: tuple[Row, ...], sizes: Mapping[Any, int | None]) -> list[str]:
    return [gangs.gang_name(row.pod_object) if sizes.get(row.index) is not None else "" for row in rows]


def _gangs(work: Workload, rows: tuple[Row, ...], sizes: Mapping[Any, int | None]) -> Iterable[Gang]:
    """The gangs the workload's pods form, as expected (none decided): the workload's one gang;
    one per group of a LeaderWorkerSet; a JobSet's one gang, its members every pod that asks for
    it in every replicated job of the JobSet (this one's and the others')."""
    members: dict[str, list[GangMember]] = {}
    size_of: dict[str, int] = {}
    for row, name in zip(rows, _row_gangs(work, rows, sizes)):
        if name:
            members.setdefault(name, []).append(GangMember(f"{work.namespace}/{row.pod}", EXPECTED, row.node))
            size_of[name] = int(sizes[row.index] or 0)
    if work.kind == "JobSet" and members:
        [name] = members
        members[name] = []
        for other in workloads(work.source or {}, work.namespace):
            other_rows = rows if other.part == work.part else [
                _row(pod_for(other, index), index) for index in other.indexes]
            for row in other_rows:
                if gangs.gang_size_or_none(row.pod_object) is not None:
                    members[name].append(GangMember(f"{work.namespace}/{row.pod}", EXPECTED, row.node))
    if not members and None in sizes and sizes[None] is not None:  # a workload of no pods
        yield Gang(f"{work.namespace}/{work.name}", sizes[None], ())
        return
    for name, listed in members.items():
        yield Gang(name, size_of[name], tuple(listed))


ORDERED_READY = ("a StatefulSet with podManagementPolicy: OrderedReady creates one pod at a time and never forms a"
                 " gang; set podManagementPolicy: Parallel")


def _gang_warnings(work: Workload, size: int | None, gangs_of: tuple[Gang, ...] = ()) -> Iterable[Note]:
    """What keeps a gang from ever forming, known from the manifest alone."""
    if size is None:
        return
    if work.kind == "StatefulSet":
        if work.pod_management_policy in (None, "OrderedReady"):
            yield Note("GangOrderedReady", ORDERED_READY)
    if work.kind in ("JobSet", "LeaderWorkerSet"):
        for gang in gangs_of:
            if gang.missing:
                yield Note("GangNeverForms", f"gang {gang.name} needs {gang.size} members ({GANG_ANNOTATION}) but"
                                             f" the manifest creates {len(gang.members)}: bind places none of them")
        return
    if work.replicas is not None and work.replicas < size:
        yield Note("GangNeverForms", f"the gang needs {size} members ({GANG_ANNOTATION}) but {work.counted}"
                                     f" creates {work.replicas}: bind places none of them")


# -- explain: one pod in the cluster ------------------------------------------------------------
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def device_env_of(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{container: {variable: value}} for the device variables each container was given."""
    found = {}
    for kind in ("initContainers", "containers"):
        for container in spec(pod).get(kind) or []:
            if not isinstance(container, Mapping):
                continue
            env = {v.get("name"): v.get("value") for v in container.get("env") or []
                   if isinstance(v, Mapping) and v.get("name") in ENV_NAMES}
            found[str(container.get("name"))] = env
    return found


def scheduler_events(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """gpu-scheduler's Events among `events`, oldest first."""
    ours = [e for e in events if isinstance(e, Mapping) and (
        (e.get("source") or {}).get("component") == SCHEDULER_NAME or e.get("reportingComponent") == SCHEDULER_NAME)]
    return sorted(ours, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def pod_scheduled(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    status = pod.get("status")
    for condition in (status.get("conditions") or []) if isinstance(status, Mapping) else []:
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled":
            return condition
    return None


@dataclass(frozen=True)
class Scheduling:
    """What bind does with the pod now, by its own framework: `action` is bind, wait (stays
    Pending, refused by `plugin`) or nothing (not bind's to place); `retried_on`: the cluster
    events that bind's queue tries a waiting pod again on (besides a change of the pod itself,
    and UNSCHEDULABLE_FLUSH_SECONDS in any case)."""

    action: str
    node: str = ""
    plugin: str = ""
    reason: str = ""
    message: str = ""
    retried_on: tuple[str, ...] = ()
    preemption: str = ""  # refused on its node: who bind would preempt, or why nobody can be

    @property
    def placeable(self) -> bool:
        return self.action != "wait"


RETRIED_ANYWAY = f"and within {UNSCHEDULABLE_FLUSH_SECONDS:g} s in any case"
