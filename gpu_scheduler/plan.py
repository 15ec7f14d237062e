"""What `kubectl gpu-scheduler plan` and `explain` show, without I/O.

A workload (StatefulSet, Job, Pod; a JobSet's replicated job; a LeaderWorkerSet) becomes the pods its controller will create, each as it will be
created (name, index label or annotation), and each pod goes through the same functions admission
and bind use: `placement.resolve`, `devices.device_env`, `devices.device_warnings`,
`binding.bind_decision`, and bind's own scheduling framework (`Framework.evaluate`, the dry run
of the cycle bind runs, on snapshots of the pods' nodes: `answer` below renders it). The plugin (kubectl_gpu_scheduler/) only
reads files and the API and formats what these functions return.

A Deployment's pods (a ReplicaSet's, or any pod with `gpu-scheduler/pool: "true"`) have no index:
they share the map's entries as a pool, each pod taking the first free entry when bind binds it.
Their plan (`plan_pool`) is the pool's entries, the replicas that share them and the rollout's
surge; `pool_answers` decides the replicas one after another, as bind would, each on the nodes
with the earlier ones assumed, and then says what each entry is now (`entry_states`).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from . import ANNOTATION, SCHEDULER_NAME
from .binding import Bind, Ignore, Unplaceable, bind_decision
from .devices import (
    CUDA, MODE_ANNOTATION, NVIDIA, ModeError, device_env, device_mode, device_warnings, pool_device_env,
    shared_devices,
)
from .fit import DEVICES_ANNOTATION, GANG_ANNOTATION, gang_key, is_terminal, pool_entry, workload as workload_of
from .fit import PodInfo
from .framework.interface import POD_INPUTS, Code, CycleState, Status
from .framework.runtime import FRAMEWORK as FRAMEWORK_NAME
from .framework.runtime import PRE_ENQUEUE, Framework, Verdict
from .framework.snapshot import NodeSnapshot
from .gangask import GangError, gang_size
from .plugins import gang as gangs
from .plugins.gang import WorkloadMembers
from .plugins.nodeaffinity import AFFINITY_REASON, node_affinity
from .plugins.nodeaffinity import NAME as NODE_AFFINITY
from .queueing import UNSCHEDULABLE_FLUSH_SECONDS, retried_on
from .placement import (
    ENTRY_ANNOTATION, NO_ENTRY, NotPlaceable, Resolved, map_text, metadata, pool_of, resolve, spec,
)
from .plugins.mapentry import resolved as resolved_entry
from .plugins.poolentry import NAME as POOL_ENTRY
from .podinputs import EntryChoice, PodInputs
from .templatecount import template_counts
from .podindex import (
    JOB_INDEX_KEY, JOBSET_JOB_INDEX_LABEL, JOBSET_NAME_LABEL, JOBSET_REPLICATED_JOB_LABEL, JOBSET_UID_LABEL,
    LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_SIZE_ANNOTATION, LWS_WORKER_INDEX_LABEL, STATEFULSET_INDEX_LABEL,
    index_source, is_pool,
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
# Pools (a pod without an index takes a free entry of its map: podindex.is_pool). A Deployment's
# pods are a ReplicaSet's, `<deployment>-<pod-template-hash>`: the hash is the Deployment
# controller's digest of the template, which a plan does not compute; this stands for it (the
# workload of the pod, fit.workload, is the Deployment whatever the hash).
TEMPLATE_HASH_LABEL = "pod-template-hash"
PLANNED_TEMPLATE_HASH = "planned"
# Kinds whose spec.replicas counts their pods (the others' pool pods: one row for them all).
REPLICATED_KINDS = ("Deployment", "ReplicaSet", "ReplicationController")
# The Deployment controller's defaults (apps/v1 SetDefaults_Deployment).
DEFAULT_ROLLING = "25%"
RECREATE, ROLLING_UPDATE = "Recreate", "RollingUpdate"
_PERCENT = re.compile(r"(0|[1-9][0-9]{0,9})%")


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
    # A pool (its pods have no index and take free entries of the map: a Deployment's): `indexes`
    # are then its replicas' ordinals, 0..replicas-1 (only plan numbers them); `rollout` is a
    # Deployment's update strategy as its controller resolves it (None: no rollout surges).
    pool: bool = False
    rollout: "Rollout | None" = None

    @property
    def indexed(self) -> bool:
        return self.kind in INDEXED_KINDS and None not in self.indexes and not self.pool

    @property
    def counted(self) -> str:
        if self.pool:
            return pool_counted(self.kind, self.replicas, self.rollout)
        return counted(self.kind, self.indexed, self.replicas, self.ordinals_start, self.groups, self.group_size)

    @property
    def pods_at_once(self) -> int | None:
        """A pool's most pods at once: its replicas, plus a rollout's surge (None: not known)."""
        if self.replicas is None:
            return None
        return self.replicas + (self.rollout.max_surge if self.rollout and self.replicas else 0)

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


@dataclass(frozen=True)
class Rollout:
    """A Deployment's update strategy, as its controller resolves it (deployment/util
    ResolveFenceposts): `max_surge` pods beyond replicas during a rollout (a percentage of replicas
    rounded up), `max_unavailable` below them (rounded down; 1 when both come to 0). `surge` and
    `unavailable`: as written, for messages ("25%", "1")."""

    strategy: str
    max_surge: int
    max_unavailable: int
    surge: str = ""
    unavailable: str = ""


def pool_counted(kind: str, replicas: int | None, rollout: Rollout | None) -> str:
    """How a pool's pods come about, for people: "a pool: replicas 4, maxSurge 1 (25%), maxUnavailable 1"."""
    if replicas is None:
        return f"a pool: a {kind}'s pods, each takes a free entry"
    text = f"a pool: replicas {replicas}"
    if rollout is None:
        return text
    if rollout.strategy == RECREATE:
        return f"{text}, strategy Recreate"

    def shown(value: int, written: str) -> str:
        return f"{value}" + (f" ({written})" if written.endswith("%") else "")
    return (f"{text}, maxSurge {shown(rollout.max_surge, rollout.surge)},"
            f" maxUnavailable {shown(rollout.max_unavailable, rollout.unavailable)}")


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
        if is_pool(metadata(pod)):  # a bare pod of a pool (gpu-scheduler/pool: "true")
            return Workload(kind, ns, name, pod, (0,), 1, pool=True)
        return Workload(kind, ns, name, pod, (None,), 1)
    if kind in UNINDEXED_KINDS:
        path = UNINDEXED_KINDS[kind]
        template: Any = obj
        for key in path:
            template = template.get(key) if isinstance(template, Mapping) else None
        template = _object(template, ".".join(path))
        if map_text(template) is None:
            return None
        work = Workload(kind, ns, name, template, (None,))
        if not is_pool(metadata(pod_for(work, None))):  # an index source on the template: its own index
            return work
        return _pool_workload(work, obj_spec)
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
    work = Workload(kind, ns, name, template, (None,))
    if is_pool(metadata(pod_for(work, None))):  # gpu-scheduler/pool: "true": its pods at once, a pool
        parallelism = _count(obj_spec.get("parallelism"), "spec.parallelism", 1)
        completions = _count(obj_spec.get("completions"), "spec.completions", parallelism)
        running = min(parallelism, completions)
        return dataclasses.replace(work, indexes=tuple(range(running)), replicas=running, pool=True)
    return work


def _pool_workload(work: Workload, obj_spec: Mapping[str, Any]) -> Workload:
    """A workload whose pods take free entries of its map: its replicas (spec.replicas, default 1,
    where the kind has them) and a Deployment's rollout."""
    if work.kind not in REPLICATED_KINDS:  # a DaemonSet's (a pod a node), a CronJob's: not counted here
        return dataclasses.replace(work, pool=True)
    replicas = _count(obj_spec.get("replicas"), "spec.replicas", 1)
    rollout = _rollout(obj_spec, replicas) if work.kind == "Deployment" else None
    return dataclasses.replace(work, indexes=tuple(range(replicas)), replicas=replicas, pool=True, rollout=rollout)


def _scaled(value: Any, where: str, replicas: int, round_up: bool) -> tuple[int, str]:
    """An IntOrString of the strategy: an integer, or a percentage of `replicas` (intstr
    GetScaledValueFromIntOrPercent); with the value as written."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value, str(value)
    if isinstance(value, str) and _PERCENT.fullmatch(value):
        percent = int(value[:-1])
        scaled = percent * replicas / 100
        return (math.ceil(scaled) if round_up else math.floor(scaled)), value
    raise ManifestError(f"{where}: expected a non-negative integer or a percentage (as \"25%\"), found {found(value)}")


def _rollout(obj_spec: Mapping[str, Any], replicas: int) -> Rollout:
    """The Deployment's strategy as its controller resolves it, refused as the API server refuses it."""
    strategy = _object(obj_spec.get("strategy"), "spec.strategy", required=False)
    kind = strategy.get("type", ROLLING_UPDATE)
    rolling = strategy.get("rollingUpdate")
    if kind == RECREATE:
        if rolling is not None:
            raise ManifestError("spec.strategy.rollingUpdate: may not be given when spec.strategy.type is Recreate")
        return Rollout(RECREATE, 0, replicas)
    if kind != ROLLING_UPDATE:
        raise ManifestError(f"spec.strategy.type: expected RollingUpdate or Recreate, found {found(kind)}")
    rolling = _object(rolling, "spec.strategy.rollingUpdate", required=False)
    where = "spec.strategy.rollingUpdate"
    surge, surge_text = _scaled(rolling.get("maxSurge", DEFAULT_ROLLING), f"{where}.maxSurge", replicas, True)
    unavailable, unavailable_text = _scaled(rolling.get("maxUnavailable", DEFAULT_ROLLING), f"{where}.maxUnavailable",
                                            replicas, False)
    if unavailable_text.endswith("%") and int(unavailable_text[:-1]) > 100:
        raise ManifestError(f"{where}.maxUnavailable: {unavailable_text} is more than 100%")
    if surge_text.rstrip("%") == "0" and unavailable_text.rstrip("%") == "0":
        raise ManifestError(f"{where}: maxSurge and maxUnavailable may not both be 0 (the API server refuses it);"
                            " set maxUnavailable: 1 to replace one pod at a time")
    if surge == 0 and unavailable == 0:  # rounded down to 0: the controller takes one pod down at a time
        unavailable = 1
    return Rollout(ROLLING_UPDATE, surge, unavailable, surge_text, unavailable_text)


def pod_for(work: Workload, index: int | None) -> dict[str, Any]:
    """The pod `work`'s controller creates for `index`, with the name, labels and annotations
    that decide its index (what admission and bind will see)."""
    if work.kind == "Pod":
        return copy.deepcopy(dict(work.template))
    if work.kind == "JobSet" and index is not None:
        return _jobset_pod(work, index)
    if work.kind == "LeaderWorkerSet" and index is not None:
        return _lws_pod(work, index)
    if work.pool:  # a pool's replicas are alike: `index` only numbers them
        index = None
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
    owner_kind, owner_name = work.kind, work.name
    if work.kind == "Deployment":  # a ReplicaSet's pod, whose workload is the Deployment (fit.workload)
        labels.setdefault(TEMPLATE_HASH_LABEL, PLANNED_TEMPLATE_HASH)
        owner_kind, owner_name = "ReplicaSet", f"{work.name}-{labels[TEMPLATE_HASH_LABEL]}"
    meta["ownerReferences"] = [{"apiVersion": CONTROLLER_API_VERSIONS.get(owner_kind, "v1"), "kind": owner_kind,
                                "name": owner_name, "controller": True}]
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
    replica: int | None = None  # a pool's replica: its ordinal in the plan (its pods have no index)

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
    return _answer(pod, framework, view)[0]


def _answer(pod: Mapping[str, Any], framework: Framework, view: Any) -> tuple[Answer, Verdict | None]:
    decision = bind_decision(pod)
    if isinstance(decision, Ignore):  # bind's own words quote schedulerName as Python would
        said = Scheduling("nothing", spec(pod).get("nodeName") or "", "", "Ignored", not_ours(pod) or decision.why,
                          entry=pool_entry(pod) if spec(pod).get("nodeName") else None)
        return Answer(said, _bound_member_gang(pod, framework, view) if spec(pod).get("nodeName") else None), None
    verdict = framework.evaluate(pod, view)
    gang = None if verdict.group.alone else _gang_of(verdict, view.nodes())
    return Answer(_scheduling(pod, verdict), gang), verdict


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
    if status.ok and not as_gang and mine is not None and not mine.decision.status.ok:
        # its group binds without it (enough others are placeable): it stays, refused on its own
        refusal = mine.decision.status
        return Scheduling("wait", node, refusal.plugin, refusal.reason, refusal.message,
                          _retried(mine, refusal.plugin))
    if status.ok:
        if not as_gang:
            found = resolved_entry(mine.decision.state) if mine else None
            if found is not None and found.pooled:  # a pool's entry, which its Binding writes on it
                return Scheduling("bind", node, "", "Bind", f"bind to {node}, pool entry {found.index} (GPUs"
                                  f" {found.placement.visible_devices})", entry=found.index)
            return Scheduling("bind", node, "", "Bind", f"bind to {node}")
        placeable = sum(1 for m in verdict.members if m.decision.status.ok)
        return Scheduling("bind", "", "", "Bind", f"bind {placeable} members together"
                          + (f" ({len(verdict.group.bound)} bound already)" if verdict.group.bound else ""))
    if verdict.phase == PRE_ENQUEUE:
        return Scheduling("wait", "", status.plugin, status.reason, status.message, tuple(retried_on(status.plugin)))
    waits = verdict.waits_on
    if waits is not None and not verdict.group.alone:
        node = waits.decision.node_name
    again = _retried(waits or mine, waits.decision.status.plugin if waits else status.plugin)
    if status.reason == gangs.MEMBERS_MISSING:
        again = (*again, "a member of the gang created")
    preemption = verdict.post_filter.explained if verdict.post_filter else ""
    return Scheduling("wait", node, status.plugin, status.reason, status.message, again, preemption)


def _retried(member: Any, plugin: str) -> tuple[str, ...]:
    """What bind's queue retries a pod refused by `plugin` on; a pod refused on each of several
    candidates (a pool's entries): on any one's events."""
    if member is not None and member.decision.diagnosis:
        return tuple(sorted({e for r in member.decision.diagnosis for e in retried_on(r.status.plugin)}))
    return tuple(retried_on(plugin))


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
    pool: "PoolPlan | None" = None  # a pool's entries (its rows are then its replicas)

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
    if work.pool:
        return plan_pool(work)
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
            who = metadata(row.pod_object).get("name") if work.pool else row.pod  # a pool's: its stand-in
            members.setdefault(name, []).append(GangMember(f"{work.namespace}/{who}", EXPECTED, row.node))
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


# -- pools: a Deployment's pods share the map's entries ------------------------------------------
ROLLOUT_WAITS = ("the rollout would wait: a new pod gets an entry only when an old one leaves; add entries or set"
                 " maxSurge: 0")
# An entry as bind sees it now (pool_answers): given to a replica of the plan, free beyond them,
# held by a pod of the workload (PoolEntry), or refused by another plugin.
TAKEN, FREE, HELD, REFUSED_ENTRY = "taken", "free", "held", "refused"


@dataclass(frozen=True)
class EntryRow:
    """One entry of a pool: where a pod that takes it goes, the env it then gets, and why no pod
    would ever take it (`problems`: bind's NodeAffinity refuses its node for the template)."""

    entry: int
    node: str
    devices: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)         # cuda mode
    nvidia_env: Mapping[str, str] = field(default_factory=dict)  # nvidia mode
    problems: tuple[Note, ...] = ()
    warnings: tuple[Note, ...] = ()

    @property
    def usable(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class PoolPlan:
    """A pool: its entries, the replicas that share them (None: as many as the controller runs, a
    DaemonSet's), the rollout's surge, and the workload whose pods share it (as bind keys it)."""

    entries: tuple[EntryRow, ...]
    replicas: int | None
    rollout: Rollout | None
    workload: Mapping[str, str | None]  # pool_workload

    @property
    def usable(self) -> int:
        return sum(1 for e in self.entries if e.usable)

    @property
    def pods_at_once(self) -> int | None:
        if self.replicas is None:
            return None
        return self.replicas + (self.rollout.max_surge if self.rollout and self.replicas else 0)


def replica_name(work: Workload, replica: int) -> str:
    """The name plan gives a pool's replica, which the API server names `<generateName><random>`:
    its gang's messages and bind's decisions name it."""
    meta = metadata(pod_for(work, replica))
    return str(meta.get("name") or f"{meta.get('generateName') or work.name + '-'}replica-{replica}")


def pool_workload(pod: Mapping[str, Any]) -> dict[str, str | None]:
    """The workload whose pods share the pod's pool (fit.workload), as data: its kind, namespace
    and name; bare pods share the pool of their map (kind and name None)."""
    key = workload_of(pod)
    if key[0] == "owner":
        return {"kind": key[2], "namespace": key[1], "name": key[3]}
    return {"kind": None, "namespace": key[1], "name": None}


def pool_workload_name(workload: Mapping[str, Any]) -> str:
    """pool_workload's, for people: "Deployment team/vllm"."""
    if workload.get("kind"):
        return f"{workload['kind']} {workload['namespace']}/{workload['name']}"
    return f"the pods of namespace {workload.get('namespace')} with this map"


def plan_pool(work: Workload) -> WorkloadPlan:
    """A pool's plan: each entry (its node, GPUs and env, and whether bind could ever give it),
    the replicas that share them (one row each, none placed before bind binds it), and what keeps
    them or a rollout from getting entries."""
    text = map_text(work.template)
    sample = pod_for(work, 0)
    annotations = metadata(work.template).get("annotations") or {}
    try:
        entries = parse_map(text)
        device_mode(work.template)
        size = gang_size(sample)
    except (MapError, ModeError, GangError) as error:
        raise ManifestError(str(error)) from None
    entry_rows = tuple(_entry_row(sample, index, entries, str(text)) for index in sorted(entries))
    pool = PoolPlan(entry_rows, work.replicas, work.rollout, pool_workload(sample))
    usable = pool.usable
    shared: list[Note] = []
    if not_ours(sample):
        shared.append(Note(NOT_OUR_SCHEDULER, str(not_ours(sample))))
    rows = []
    for replica in (work.indexes if work.replicas is not None else (None,)):
        pod = pod_for(work, replica or 0)
        if not metadata(pod).get("name"):  # a stand-in name: its gang's messages name it
            pod["metadata"]["name"] = replica_name(work, replica or 0)
        problems = list(shared)
        if (replica or 0) >= usable:
            why = (f"replica {replica}: the pool has {_entries_text(usable)} for {work.replicas} replicas"
                   if replica is not None else f"the pool has {_entries_text(usable)}")
            problems.append(Note("NoPoolEntry", f"{why}: the pod finds no entry and stays Pending"))
        rows.append(Row(None, pod_name(pod_for(work, replica or 0)), "", (), annotations.get(MODE_ANNOTATION)
                        if isinstance(annotations, Mapping) else None, _env_vars(CUDA), _env_vars(NVIDIA),
                        tuple(problems), replica=replica, pod_object=pod))
    rows_t = tuple(rows)
    sizes: dict[Any, int | None] = {None: size}
    formed = tuple(_gangs(work, rows_t, sizes))
    rows_t = tuple(dataclasses.replace(row, gang=name) for row, name in zip(rows_t, _row_gangs(work, rows_t, sizes)))
    warnings = [*_gang_warnings(work, size, formed), *_pool_warnings(work, pool, sample, entries, str(text))]
    counts = template_counts(text, None) if work.kind != "Pod" else None
    exact = len({len(p.devices) for p in entries.values()}) <= 1
    return WorkloadPlan(work, rows_t, tuple(warnings), formed[0] if formed else None, formed, None, counts, exact,
                        pool)


def _env_vars(mode: str) -> dict[str, Any]:
    """A pool pod's device variables as mutate writes them: a value, or {"valueFrom": ...}."""
    return {name: ({"valueFrom": dict(value)} if isinstance(value, Mapping) else value)
            for name, value in pool_device_env(mode).items()}


def _entries_text(count: int) -> str:
    return f"{count} usable entr{'y' if count == 1 else 'ies'}"


def _entry_row(sample: Mapping[str, Any], index: int, entries: Mapping[int, Placement], text: str) -> EntryRow:
    placement = entries[index]
    problems = []
    contradiction = node_affinity(sample, placement.node)
    if contradiction:
        problems.append(Note(NODE_AFFINITY, contradiction))
    warnings = []
    shared = shared_devices(Resolved(index, placement, entries, text, pooled=True))
    if shared:
        listed = "; ".join(f"device {device} also in entr{'y' if len(others) == 1 else 'ies'}"
                           f" {', '.join(map(str, others[:10]))}" for device, others in list(shared.items())[:10])
        warnings.append(Note("SharedDevices", f"entry {index} shares GPUs on {placement.node}: {listed}: two pods of"
                                              " the pool may run on them at once"))
    return EntryRow(index, placement.node, placement.devices, device_env(placement, CUDA),
                    device_env(placement, NVIDIA), tuple(problems), tuple(warnings))


def _pool_warnings(work: Workload, pool: PoolPlan, sample: Mapping[str, Any], entries: Mapping[int, Placement],
                   text: str) -> Iterable[Note]:
    """What keeps a pool's replicas, or its rollout, from getting entries, known from the manifest."""
    usable, replicas, rollout = pool.usable, pool.replicas, pool.rollout
    if replicas is not None and replicas > usable:
        missing = list(range(usable, replicas))
        which = f"replica {missing[0]} finds" if len(missing) == 1 else f"replicas {_listing(missing)} find"
        yield Note("ReplicasWithoutEntry", f"{replicas} replicas share {_entries_text(usable)}: {which} none and"
                                           f" stays Pending; add entries to {ANNOTATION} or lower spec.replicas"
                   .replace("find none and stays", "find none and stay"))
    elif replicas and rollout is not None and rollout.max_surge and replicas + rollout.max_surge > usable:
        surge = f"{rollout.max_surge}" + (f" ({rollout.surge} of {replicas})" if rollout.surge.endswith("%") else "")
        said = (f"replicas {replicas} + maxSurge {surge} = {replicas + rollout.max_surge} pods at once during a"
                f" rollout, but the pool has {_entries_text(usable)}: {ROLLOUT_WAITS}")
        if rollout.max_unavailable == 0:
            said += (" (with maxUnavailable 0 no old pod leaves before a new one is ready: the rollout never"
                     " completes; with maxSurge: 0 set maxUnavailable: 1)")
        yield Note("RolloutWaits", said)
    sizes = sorted({len(e.devices) for e in pool.entries})
    if len(sizes) > 1:
        yield Note("EntrySizesDiffer", f"the entries give {sizes[0]} to {sizes[-1]} GPUs: the pods of a pool run one"
                                       " template, and each sees the GPUs of whichever entry it takes; give every"
                                       " entry the same number")
    first = min(entries)
    for reason, message in device_warnings(sample, Resolved(first, entries[first], entries, text, pooled=True)):
        if reason != "SharedDevices":  # said per entry
            yield Note(reason, message)


@dataclass(frozen=True)
class EntryState:
    """An entry of a pool as bind sees it now: `taken` by a replica of the plan (`replica`),
    `free` beyond them, `held` by a pod of the workload, or `refused` by another plugin; with the
    refusal (plugin, reason, message) in the last two."""

    entry: int
    state: str
    replica: int | None = None
    plugin: str = ""
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class PoolAnswer:
    """What bind would decide now for each replica of a pool (in order), and each entry's state after."""

    answers: tuple["Answer", ...]
    entries: tuple[EntryState, ...]


class _Assumed:
    """A ReadView whose nodes hold the replicas decided before (Framework.assume), as bind's cache
    holds the pods it bound moments ago: each replica is decided on what the earlier ones took."""

    def __init__(self, view: Any, taken: Mapping[str, NodeSnapshot]):
        self._view, self._taken = view, taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def snapshot(self, node: str) -> NodeSnapshot:
        return self._taken[node] if node in self._taken else self._view.snapshot(node)


def pool_answers(pods: list[Mapping[str, Any]], framework: Framework, view: Any) -> PoolAnswer:
    """A pool's replicas (`pods`, in order, each with a name of its own) as bind would decide them
    now: one after another, each on the nodes with the earlier ones placed (a gang's: together,
    as bind decides them); then each entry's state, with them placed."""
    taken: dict[str, NodeSnapshot] = {}
    given: dict[int, int] = {}  # entry -> the replica bind gives it now
    held = {pool_entry(pod): replica for replica, pod in enumerate(pods)  # entry -> the bound replica holding it
            if spec(pod).get("nodeName") and pool_entry(pod) is not None}
    answers = []
    ganged = any(gangs.gang_size_or_none(p) is not None for p in pods)
    position = {_pod_key(pod): replica for replica, pod in enumerate(pods)}
    group_verdict: Verdict | None = None
    for replica, pod in enumerate(pods):
        said, verdict = _answer(pod, framework, view if ganged else _Assumed(view, taken))
        answers.append(said)
        if verdict is None:
            continue
        if ganged:
            group_verdict = group_verdict or verdict
            continue
        mine = verdict.of(pod)
        if mine is not None and mine.decision.status.ok and mine.decision.node is not None:
            taken[mine.decision.node.name] = framework.assume(mine.decision, pod)
            given[resolved_entry(mine.decision.state).index] = replica
    if group_verdict is not None:
        for member in group_verdict.members:
            if member.decision.status.ok and member.decision.node is not None:
                taken[member.decision.node.name] = framework.assume(member.decision, member.pod)
                found = resolved_entry(member.decision.state)
                if found is not None and _pod_key(member.pod) in position:
                    given[found.index] = position[_pod_key(member.pod)]
    states = entry_states(_pending_like(pods[0]), framework, _Assumed(view, taken), given) if pods else ()
    return PoolAnswer(tuple(answers), tuple(dataclasses.replace(s, replica=held.get(s.entry)) if s.state == HELD
                                            else s for s in states))


def _pending_like(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pod of the pool as one not bound yet (a bound replica stands for the workload's pods)."""
    meta = {k: v for k, v in metadata(pod).items() if k not in ("uid", "deletionTimestamp")}
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k not in (ENTRY_ANNOTATION, DEVICES_ANNOTATION)}
    return {**pod, "metadata": meta, "spec": {k: v for k, v in spec(pod).items() if k != "nodeName"},
            "status": {}}


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = metadata(pod)
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def entry_states(pod: Mapping[str, Any], framework: Framework, view: Any, given: Mapping[int, int | None]
                  ) -> Iterable[EntryState]:
    """Each entry of `pod`'s pool: `given` to a replica (or, None, to `pod` itself) now, or what
    bind's filters say of it for one more pod of the workload (each entry's own verdict: the
    framework's PreFilter offering that entry alone, then its filters on the entry's node)."""
    try:
        pool = pool_of(pod)
    except NotPlaceable:
        return
    if pool is None:
        return
    meta = {k: v for k, v in metadata(pod).items() if k != "uid"}
    meta["name"] = f"{meta.get('generateName') or meta.get('name') or 'pod'}-probe"
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != GANG_ANNOTATION}
    probe = {**pod, "metadata": meta}
    mine = PodInputs.of(probe)
    for candidate in pool.candidates():
        if candidate.index in given:
            yield EntryState(candidate.index, TAKEN, given[candidate.index])
            continue
        status = _entry_verdict(framework, probe, dataclasses.replace(
            mine, choice=EntryChoice((candidate,), pool=True)), view.snapshot)
        if status.ok:
            yield EntryState(candidate.index, FREE)
        else:
            yield EntryState(candidate.index, HELD if status.plugin == POOL_ENTRY else REFUSED_ENTRY, None,
                             status.plugin, status.reason, status.message)


def _entry_verdict(framework: Framework, pod: Mapping[str, Any], inputs: PodInputs,
                   snapshot_of: Callable[[str], NodeSnapshot]) -> Status:
    """The framework's PreFilter and Filter for `pod` on the one entry `inputs` offers (as
    Framework.decide runs them for the candidate of that entry)."""
    state = CycleState()
    state.write(POD_INPUTS, inputs)
    offered = None
    for plugin in framework.profile.pre_filter:
        result = plugin.pre_filter(state, pod)
        if not result.status.ok:
            return result.status
        offered = result.candidates or offered
    [option] = offered.options if offered is not None else (None,)
    if option is None:
        return Status(Code.ERROR, FRAMEWORK_NAME, "no PreFilter plugin offered the entry")
    for key, value in option.writes.items():
        state.write(key, value)
    return framework.run_filters(state, pod, snapshot_of(option.node))


# -- explain: one pod in the cluster ------------------------------------------------------------
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


_ANNOTATION_PATH = re.compile(r"""metadata\.annotations\[(?:'([^']*)'|"([^"]*)")\]""")


def annotation_ref(var: Mapping[str, Any]) -> str | None:
    """The annotation an EnvVar reads through the downward API (`valueFrom.fieldRef`), if any: a
    pool pod's device variables (mutate: devices.pool_device_env)."""
    source = var.get("valueFrom")
    ref = source.get("fieldRef") if isinstance(source, Mapping) else None
    path = ref.get("fieldPath") if isinstance(ref, Mapping) else None
    match = _ANNOTATION_PATH.fullmatch(path) if isinstance(path, str) else None
    return (match.group(1) if match.group(1) is not None else match.group(2)) if match else None


def _device_vars(pod: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    found = {}
    for kind in ("initContainers", "containers"):
        for container in spec(pod).get(kind) or []:
            if not isinstance(container, Mapping):
                continue
            found[str(container.get("name"))] = [v for v in container.get("env") or []
                                                 if isinstance(v, Mapping) and v.get("name") in ENV_NAMES]
    return found


def device_env_of(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{container: {variable: value}} for the device variables each container was given; one read
    from an annotation (a pool pod's) has the annotation's value, as the kubelet resolves it (None
    while the pod does not carry it: its Binding writes it)."""
    annotations = metadata(pod).get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    found = {}
    for container, env in _device_vars(pod).items():
        found[container] = {v.get("name"): (annotations.get(annotation_ref(v)) if annotation_ref(v) else v.get("value"))
                            for v in env}
    return found


def device_env_refs(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{container: {variable: annotation}} for the device variables read from annotations (a pool
    pod's); containers without any left out."""
    refs = {container: {v.get("name"): annotation_ref(v) for v in env if annotation_ref(v)}
            for container, env in _device_vars(pod).items()}
    return {container: found for container, found in refs.items() if found}


def pool_env_mode(pod: Mapping[str, Any]) -> str | None:
    """The device mode (cuda, nvidia) whose variables mutate gives a pool pod (devices.pool_device_env:
    read from the annotations its Binding writes) every container of `pod` has; None if not."""
    given = [{v.get("name"): (("annotation", annotation_ref(v)) if annotation_ref(v) else ("value", v.get("value")))
              for v in env} for env in _device_vars(pod).values()]
    for mode in (CUDA, NVIDIA):
        wanted = {name: (("annotation", annotation_ref({"valueFrom": value})) if isinstance(value, Mapping)
                         else ("value", value)) for name, value in pool_device_env(mode).items()}
        if given and all(env == wanted for env in given):
            return mode
    return None


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
    entry: int | None = None  # a pool pod: the entry bind gives it now, or the one it holds (bound)

    @property
    def placeable(self) -> bool:
        return self.action != "wait"


RETRIED_ANYWAY = f"and within {UNSCHEDULABLE_FLUSH_SECONDS:g} s in any case"
