"""What a pod asks of gangs (docs/gangs.md), read from the pod alone: the size its
`gpu-scheduler/gang` asks for (or why the value is malformed), its place among its gang's members,
its gang's name as users know it, and the upstream PodGroup it may name. PodInputs.of reads them
once per cycle; the Gang plugin (plugins/gang.py), which forms and permits gangs, reads PodInputs.
Pure functions of the pod, below the framework: the plugin imports PodInputs, which imports these."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

from .fit import GANG_ANNOTATION, workload
from .placement import map_text, metadata, spec
from .podindex import LWS_SIZE_ANNOTATION, IndexUnknown, pod_index
from .schedmap import MapError, parse_map, shown

# Written by mutate on a JobSet's pods that ask for a gang: how many pods the JobSet's gang has.
GANG_SIZE = "gpu-scheduler/gang-size"
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


def upstream_gang_notice(group: str | None, ask: GangAsk, gang: str) -> str | None:
    """What a pod that names an upstream PodGroup (`group`, upstream_pod_group) is told, given what
    it asks of gangs and its gang's name (gang_name_of); None for any other pod: bind places it as
    always, with its gpu-scheduler/gang or alone, and never waits for the PodGroup. Not a refusal:
    kube-scheduler, whose PodGroups they are, does not place this pod either."""
    if group is None:
        return None
    placed = (f"this pod is placed with its gang {gang}" if ask.asked
              else f"this pod is placed on its own (to place replicas together, set {GANG_ANNOTATION} on the pod"
                   " template)")
    return (f"the pod names PodGroup {shown(group)} (spec.schedulingGroup.podGroupName), but gpu-scheduler does not"
            f" run upstream gangs (PodGroups): its gangs are the {GANG_ANNOTATION} annotation's; {placed}")


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
