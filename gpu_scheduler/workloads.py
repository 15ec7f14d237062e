"""What a JobSet's pods need from their JobSet, written on them by mutate as they are created.

A JobSet (jobset.x-k8s.io) pod carries its job-index and completion index, but not its child Job's
completions, which its map index needs (podindex.py: `job-index × completions + completion index`),
nor how many pods the JobSet's gang has (plugins/gang.py). Both are in the JobSet's spec, which
does not change once created (the JobSet's webhook refuses updates of its replicated jobs). mutate
reads the JobSet when it admits the pod (`get` on jobsets, its one read of a workload) and writes
both on the pod (`jobset_annotations`); from then on every reader (bind, `plan`, `explain`) has
them on the pod, and gives one answer. `plan` applies the same function to a manifest.

A LeaderWorkerSet's pods need nothing: its controller writes the group's size on each of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import ANNOTATION
from .fit import GANG_ANNOTATION
from .placement import metadata
from .gangask import GANG_SIZE
from .podindex import JOB_COMPLETIONS, JOBSET_NAME_LABEL, JOBSET_REPLICATED_JOB_LABEL, JOBSET_UID_LABEL
from .shapes import as_map, as_maps

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"


class WorkloadUnreadable(Exception):
    """The pod's workload could not be read; `retry`: the same read may succeed later."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.message, self.retry = message, retry


@dataclass(frozen=True)
class JobSetPod:
    """A JobSet pod that needs its JobSet read: where the JobSet is, and the pod's replicated job."""

    namespace: str
    jobset: str
    uid: str  # the JobSet's, as its controller labels the pod: a reader may keep the JobSet by it
    replicated_job: str


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _asks_for_gang(template: Mapping[str, Any]) -> bool:
    annotations = as_map(as_map(template.get("metadata")).get("annotations"))
    return ANNOTATION in annotations and annotations.get(GANG_ANNOTATION) not in (None, "false")


def replicated_jobs(jobset: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return as_maps(as_map(jobset.get("spec")).get("replicatedJobs"))


def job_spec(replicated_job: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(as_map(replicated_job.get("template")).get("spec"))


def pod_template(replicated_job: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(job_spec(replicated_job).get("template"))


def completions(replicated_job: Mapping[str, Any]) -> int:
    """The completions of the replicated job's child Jobs (an Indexed Job requires them; a Job
    without them runs `parallelism` pods, 1 by default)."""
    spec = job_spec(replicated_job)
    return _int(spec.get("completions"), _int(spec.get("parallelism"), 1))


def gang_size(jobset: Mapping[str, Any]) -> int:
    """The pods of the JobSet's gang: replicas × parallelism over its replicated jobs whose pods ask
    for a gang (and carry a map)."""
    return sum(_int(job.get("replicas"), 1) * _int(job_spec(job).get("parallelism"), 1)
               for job in replicated_jobs(jobset) if _asks_for_gang(pod_template(job)))


def jobset_annotations(jobset: Mapping[str, Any], replicated_job: str) -> dict[str, str] | None:
    """What mutate writes on a pod of `replicated_job` of `jobset`; None when the JobSet has no
    such replicated job."""
    for job in replicated_jobs(jobset):
        if job.get("name") == replicated_job:
            written = {JOB_COMPLETIONS: str(completions(job))}
            if _asks_for_gang(pod_template(job)):
                written[GANG_SIZE] = str(gang_size(jobset))
            return written
    return None


def jobset_pod(pod: Mapping[str, Any]) -> JobSetPod | None:
    """The JobSet to read for `pod`: a JobSet's pod (its labels) that lacks what mutate writes."""
    meta = metadata(pod)
    labels, annotations = as_map(meta.get("labels")), as_map(meta.get("annotations"))
    name, job = labels.get(JOBSET_NAME_LABEL), labels.get(JOBSET_REPLICATED_JOB_LABEL)
    if not (isinstance(name, str) and name and isinstance(job, str) and job):
        return None
    if JOB_COMPLETIONS in annotations and (GANG_ANNOTATION not in annotations or GANG_SIZE in annotations):
        return None
    return JobSetPod(str(meta.get("namespace") or ""), name, str(labels.get(JOBSET_UID_LABEL) or ""), job)
