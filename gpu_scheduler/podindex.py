"""Which map entry a pod uses: its index among the pods of its workload.

The index sources, first that applies wins (INDEX_SOURCES; the README's table renders them):
1. IndexLabel: the `gpu-scheduler/index-label` annotation names a label that holds the index, for
   controllers this project does not know (as KAI Scheduler lets users name theirs);
2. LeaderWorkerSet: `group-index × size + worker-index` (its labels and its `size` annotation); the
   leader is worker 0 of its group, so every pod of every group has its own entry;
3. JobSet: `job-index × the child Job's completions + job-completion-index`, so the pods of a
   replicated job's child Jobs (whose completion indexes each start at 0) have one entry each. The
   completions are not on the pod: mutate reads the JobSet when it admits the pod and writes them
   (JOB_COMPLETIONS); job 0 needs none;
4. StatefulSet: the `apps.kubernetes.io/pod-index` label (Kubernetes 1.28+);
5. Indexed Job: `batch.kubernetes.io/job-completion-index`, annotation or label;
6. the trailing `-<digits>` of `metadata.name` (StatefulSets before 1.28).
A pod with only `generateName` (Deployment pods at admission) has no index yet: we say so and
never guess. Each source reads the pod's metadata only: bind, mutate, `plan` and `explain` give one
answer.

A pod that no index source but the name applies to and whose controller is a ReplicaSet
(Deployments, Knative revisions, Argo Rollouts), or that carries `gpu-scheduler/pool: "true"`, is
a pool pod (`is_pool`): it has no index, and bind gives it a free entry of its map
(plugins/poolentry.py). A ReplicaSet's pod never reads its index from its name: its random suffix
can be all digits.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .schedmap import MAX_INDEX_DIGITS
from .schedmap import shown as _shown

STATEFULSET_INDEX_LABEL = "apps.kubernetes.io/pod-index"
JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
INDEX_LABEL_ANNOTATION = "gpu-scheduler/index-label"
# JobSet (jobset.x-k8s.io), as its controller labels the child Jobs' pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
# Written by mutate on a JobSet's pods: the completions of the pod's child Job (its replicated
# job's template), which the pod's index needs and the pod does not carry.
JOB_COMPLETIONS = "gpu-scheduler/job-completions"
# LeaderWorkerSet (leaderworkerset.x-k8s.io), as its controller and webhook label its pods.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
# `"true"` on a pod (or its template): the pod takes a free entry of its map instead of one by index.
POOL_ANNOTATION = "gpu-scheduler/pool"
# The pods of these controllers have no stable index: they always take an entry of a pool.
POOL_CONTROLLERS = ("ReplicaSet",)
_NAME_SUFFIX = re.compile(r"-(0|[1-9][0-9]*)$")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


class IndexUnknown(ValueError):
    """The pod's index cannot be known; the message says why (and what is missing)."""


def _string_map(meta: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    value = meta.get(field)
    return value if isinstance(value, Mapping) else {}


def _to_int(digits: str, where: str) -> int:
    # An index has at most MAX_INDEX_DIGITS digits (int32); longer strings are never converted.
    if len(digits) > MAX_INDEX_DIGITS:
        raise IndexUnknown(f"{where} has {len(digits)} digits, too many for an index")
    return int(digits)


def _declared_index(value: Any, where: str) -> int:
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return _to_int(value, where)
    raise IndexUnknown(f"{where} is {_shown(value)}, not a non-negative decimal integer")


@dataclass(frozen=True)
class PodMeta:
    """What the index sources read: the pod's labels, annotations and name."""

    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]
    meta: Mapping[str, Any]

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> "PodMeta":
        return cls(_string_map(meta, "labels"), _string_map(meta, "annotations"), meta)

    def label(self, key: str) -> int:
        if key not in self.labels:
            raise IndexUnknown(f"label {key} is missing")
        return _declared_index(self.labels[key], f"label {key}")

    def annotation(self, key: str) -> int:
        if key not in self.annotations:
            raise IndexUnknown(f"annotation {key} is missing")
        return _declared_index(self.annotations[key], f"annotation {key}")


@dataclass(frozen=True)
class IndexSource:
    """One rule of the index: its name (shown by `plan`), when it applies, and how it reads the
    index. `rule` is the README table's line."""

    name: str
    rule: str
    applies: Callable[[PodMeta], bool]
    read: Callable[[PodMeta], int]


def _index_label(pod: PodMeta) -> int:
    key = pod.annotations[INDEX_LABEL_ANNOTATION]
    if not isinstance(key, str) or not key:
        raise IndexUnknown(f"annotation {INDEX_LABEL_ANNOTATION} is {_shown(key)}: name the label that holds the"
                           " pod's index")
    if key not in pod.labels:
        raise IndexUnknown(f"annotation {INDEX_LABEL_ANNOTATION} names label {_shown(key)}, which the pod does not"
                           " carry: its controller sets no such label, or the annotation names another")
    return _declared_index(pod.labels[key], f"label {key} (named by {INDEX_LABEL_ANNOTATION})")


def _leader_worker_set(pod: PodMeta) -> int:
    name = _shown(pod.labels.get(LWS_NAME_LABEL))
    try:
        group, worker = pod.label(LWS_GROUP_INDEX_LABEL), pod.label(LWS_WORKER_INDEX_LABEL)
        size = pod.annotation(LWS_SIZE_ANNOTATION)
    except IndexUnknown as why:
        raise IndexUnknown(f"a pod of LeaderWorkerSet {name}: {why} (the LeaderWorkerSet controller and its webhook"
                           " set it: is its webhook running?)") from None
    if size < 1 or worker >= size:
        raise IndexUnknown(f"a pod of LeaderWorkerSet {name}: worker-index {worker} is not below its size {size}")
    return group * size + worker


def _jobset(pod: PodMeta) -> int:
    name, replicated = _shown(pod.labels.get(JOBSET_NAME_LABEL)), _shown(pod.labels.get(JOBSET_REPLICATED_JOB_LABEL))
    try:
        job = pod.label(JOBSET_JOB_INDEX_LABEL)
        completion = _job_completion_index(pod)
    except IndexUnknown as why:
        raise IndexUnknown(f"a pod of JobSet {name}: {why} (the JobSet and Job controllers set it)") from None
    if job == 0:
        return completion  # the first child Job's indexes need no stride
    if JOB_COMPLETIONS not in pod.annotations:
        raise IndexUnknown(
            f"a pod of JobSet {name}, replicated job {replicated}, job {job}: its index is job-index × the Job's"
            f" completions + completion index, and annotation {JOB_COMPLETIONS} (the completions, which"
            " gpu-scheduler's webhook writes when it admits the pod) is missing: the webhook did not admit this pod."
            " Check that it is installed and running, then delete the pod: its Job re-creates it")
    completions = pod.annotation(JOB_COMPLETIONS)
    if completion >= completions:
        raise IndexUnknown(f"a pod of JobSet {name}: completion index {completion} is not below the Job's"
                           f" completions {completions}")
    return job * completions + completion


def _job_completion_index(pod: PodMeta) -> int:
    if JOB_INDEX_KEY in pod.annotations:
        return _declared_index(pod.annotations[JOB_INDEX_KEY], f"annotation {JOB_INDEX_KEY}")
    return pod.label(JOB_INDEX_KEY)


def _name_suffix(pod: PodMeta) -> int:
    name = pod.meta.get("name")
    if not isinstance(name, str) or not name:
        generate = pod.meta.get("generateName")
        if isinstance(generate, str) and generate:
            raise IndexUnknown(
                f"the pod has no name yet (only generateName {_shown(generate)}), so its index is unknown;"
                f" use a StatefulSet, an Indexed Job, a JobSet or a LeaderWorkerSet, or name the label that holds"
                f" the index in {INDEX_LABEL_ANNOTATION}"
            )
        raise IndexUnknown("the pod has no name, so its index is unknown")
    match = _NAME_SUFFIX.search(name)
    if not match:
        raise IndexUnknown(
            f"pod name {_shown(name)} does not end in -<index> and the pod has no "
            f"{STATEFULSET_INDEX_LABEL} label or {JOB_INDEX_KEY} annotation"
        )
    return _to_int(match.group(1), f"the -<index> suffix of pod name {name[:60]!r}")


INDEX_SOURCES: tuple[IndexSource, ...] = (
    IndexSource("IndexLabel", f"the label named by the pod's `{INDEX_LABEL_ANNOTATION}` annotation",
                lambda pod: INDEX_LABEL_ANNOTATION in pod.annotations, _index_label),
    IndexSource("LeaderWorkerSet", "`group-index × size + worker-index` (the leader is worker 0)",
                lambda pod: LWS_NAME_LABEL in pod.labels, _leader_worker_set),
    IndexSource("JobSet", "`job-index × the Job's completions + job-completion-index`",
                lambda pod: JOBSET_NAME_LABEL in pod.labels, _jobset),
    IndexSource("StatefulSet", f"the `{STATEFULSET_INDEX_LABEL}` label",
                lambda pod: STATEFULSET_INDEX_LABEL in pod.labels,
                lambda pod: pod.label(STATEFULSET_INDEX_LABEL)),
    IndexSource("IndexedJob", f"`{JOB_INDEX_KEY}` (annotation, then label)",
                lambda pod: JOB_INDEX_KEY in pod.annotations or JOB_INDEX_KEY in pod.labels, _job_completion_index),
    IndexSource("NameSuffix", "the trailing `-<digits>` of the pod's name", lambda pod: True, _name_suffix),
)


# The sources that name an index explicitly; NameSuffix, the fallback, is not one of them.
_EXPLICIT = tuple(source for source in INDEX_SOURCES if source.name != "NameSuffix")


def controller_kind(meta: Mapping[str, Any]) -> str:
    """The kind of the pod's controller (its ownerReference with controller: true), or ''."""
    owners = meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, Mapping) and owner.get("controller") is True:
            return str(owner.get("kind") or "")
    return ""


def is_pool(meta: Mapping[str, Any]) -> bool:
    """Whether the pod whose `metadata` is `meta` takes a free entry of its map (a pool) rather than
    the entry of its index: no explicit index source applies, and its controller is a ReplicaSet or
    it carries `gpu-scheduler/pool: "true"`."""
    pod = PodMeta.of(meta)
    if any(source.applies(pod) for source in _EXPLICIT):
        return False
    return pod.annotations.get(POOL_ANNOTATION) == "true" or controller_kind(meta) in POOL_CONTROLLERS


def index_source(meta: Mapping[str, Any]) -> IndexSource:
    """The source that gives the index of the pod whose `metadata` is `meta`."""
    pod = PodMeta.of(meta)
    return next(source for source in INDEX_SOURCES if source.applies(pod))


def pod_index(meta: Mapping[str, Any]) -> int:
    """The index of the pod whose `metadata` is `meta`, or IndexUnknown (a pool pod has none)."""
    if is_pool(meta):
        raise IndexUnknown("the pod takes a free entry of its map's pool (its controller is a ReplicaSet, or it carries"
                           f' {POOL_ANNOTATION}: "true"): it has no index of its own')
    pod = PodMeta.of(meta)
    for source in INDEX_SOURCES:
        if source.applies(pod):
            return source.read(pod)
    raise AssertionError("NameSuffix applies to every pod")  # pragma: no cover
