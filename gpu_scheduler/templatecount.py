"""What a pinned workload's pod templates request, for queues that count templates (Kueue).

Kueue decides whether a workload fits its ClusterQueue from what the workload's **templates**
request (a StatefulSet's, a Job's, each replicated job's of a JobSet, the leader's and workers' of a
LeaderWorkerSet) times their pod counts, when the workload is created: before any pod exists. A
pinned pod's GPUs are requests mutate adds to each pod at its creation (quota.py), too late for
that. So mutate also admits the workload objects (CREATE and UPDATE) whose templates carry a map,
and writes on each such template, in its first container's requests and limits, what the largest
entry of its map pins: `gpu-scheduler.io/gpu: <most devices of one entry>`, and per GPU type
`product.gpu-scheduler.io/<type>: <most devices of one entry on a node of that type>`. For a
uniform map (every entry the same count, one type) that is exact; otherwise an upper bound, which
`plan` shows. The counts are also written on the template as TEMPLATE_COUNTS, so that mutate
recognises them on the pods made from it (they are mutate's, not a dodge) and replaces them with
the pod's own entry's: each pod's requests stay within what its template declared.

Pure: mutate hands in each node's GPU type (`product_of`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from . import ANNOTATION
from .quota import GPU_RESOURCE, is_quota_resource, product_resource, resources_patch
from .schedmap import MapError, parse_map
from .shapes import as_map, as_maps

TEMPLATE_COUNTS = "gpu-scheduler/template-counts"
# Kueue's Topology-Aware Scheduling: it chooses the nodes of the pods that carry one of these, which
# a map pins (mutate refuses the two together).
TOPOLOGY_ANNOTATIONS = ("kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology",
                        "kueue.x-k8s.io/podset-unconstrained-topology")
# The workload kinds mutate admits, by the resource their AdmissionReview names.
WORKLOAD_RESOURCES = ("statefulsets", "jobs", "jobsets", "leaderworkersets")


def pod_templates(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(JSON pointer, template) of each pod template of a workload object."""
    spec = as_map(obj.get("spec"))
    kind = obj.get("kind")
    if kind in ("StatefulSet", "Job"):
        yield "/spec/template", as_map(spec.get("template"))
    elif kind == "JobSet":
        for i, job in enumerate(as_maps(spec.get("replicatedJobs"))):
            yield (f"/spec/replicatedJobs/{i}/template/spec/template",
                   as_map(as_map(as_map(job.get("template")).get("spec")).get("template")))
    elif kind == "LeaderWorkerSet":
        lwt = as_map(spec.get("leaderWorkerTemplate"))
        for field in ("workerTemplate", "leaderTemplate"):
            if isinstance(lwt.get(field), Mapping):
                yield f"/spec/leaderWorkerTemplate/{field}", lwt[field]


def template_counts(map_text: Any, product_of: Callable[[str], str | None] | None) -> dict[str, str] | None:
    """The requests a template of `map_text` declares: the most devices one entry pins, in total and
    per GPU type of the entries' nodes; None for a malformed map (its pods are refused anyway)."""
    try:
        entries = parse_map(map_text)
    except MapError:
        return None
    if not entries:
        return None
    most: dict[str, int] = {GPU_RESOURCE: 0}
    types: dict[str, str | None] = {}
    for placement in entries.values():
        count = len(placement.devices)
        most[GPU_RESOURCE] = max(most[GPU_RESOURCE], count)
        if product_of is not None:
            if placement.node not in types:
                types[placement.node] = product_resource(product_of(placement.node))
            resource = types[placement.node]
            if resource:
                most[resource] = max(most.get(resource, 0), count)
    return {name: str(value) for name, value in most.items()}


def declared(template: Mapping[str, Any]) -> dict[str, str]:
    """The counts a template (or a pod made from it) says mutate wrote on it (TEMPLATE_COUNTS)."""
    text = as_map(as_map(template.get("metadata")).get("annotations")).get(TEMPLATE_COUNTS)
    if not isinstance(text, str):
        return {}
    counts = {}
    for part in text.split(",")[:64]:
        name, _, value = part.partition("=")
        if is_quota_resource(name) and value.isascii() and value.isdigit():
            counts[name] = value
    return counts


def shown(counts: Mapping[str, str]) -> str:
    return ",".join(f"{name}={value}" for name, value in sorted(counts.items()))


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def template_patch(pointer: str, template: Mapping[str, Any], counts: Mapping[str, str]) -> list[dict[str, Any]]:
    """JSONPatch operations that make the template at `pointer` declare `counts`: its annotation, and
    its first container's quota requests and limits exactly `counts` (others removed); empty when
    it does already."""
    ops: list[dict[str, Any]] = []
    meta = as_map(template.get("metadata"))
    annotations = meta.get("annotations")
    if as_map(annotations).get(TEMPLATE_COUNTS) != shown(counts):
        ops.append({"op": "add", "path": f"{pointer}/metadata/annotations/{_escape(TEMPLATE_COUNTS)}",
                    "value": shown(counts)})
    containers = as_map(template.get("spec")).get("containers")
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], Mapping):
        return ops
    return ops + resources_patch(f"{pointer}/spec/containers/0/resources", containers[0].get("resources"), counts)


def workload_patch(obj: Mapping[str, Any], product_of: Callable[[str], str | None] | None) -> list[dict[str, Any]]:
    """What mutate writes on a workload object: on each template that carries a map, its counts."""
    ops = []
    for pointer, template in pod_templates(obj):
        text = as_map(as_map(template.get("metadata")).get("annotations")).get(ANNOTATION)
        counts = template_counts(text, product_of) if text is not None else None
        if counts:
            ops += template_patch(pointer, template, counts)
    return ops
