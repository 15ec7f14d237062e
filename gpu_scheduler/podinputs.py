"""What scheduling reads of a pending pod, worked out once when its cycle decides it (kube-scheduler's
PodInfo for the pod being scheduled): who it is, its workload (whose records and pool it shares),
its gang, its priority, whether it shares GPUs, and the entries of its map it may take (its own by
its index, or a pool's). The framework writes it in the cycle's state (framework.interface.inputs)
before PreFilter, and every plugin reads it there rather than reading the pod again."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import SCHEDULER_NAME
from .fit import gang_key, pod_priority, shares_gpus, workload
from .placement import ENTRY_ANNOTATION, NotPlaceable, Resolved, map_text, metadata, pool_of, resolve, spec
from .records import workload_key

NO_ANNOTATION = "NoAnnotation"


@dataclass(frozen=True)
class EntryChoice:
    """The entries a pod may take, in the order to try them: its own entry, or (a pool pod not
    bound yet) every entry of its map; none, with the reason and the message users see, when it
    has none (no map, a malformed map, no index, no entry for its index)."""

    options: tuple[Resolved, ...]
    pool: bool = False
    reason: str = ""
    message: str = ""


def entry_choice(pod: Mapping[str, Any]) -> EntryChoice:
    """What the pod may take (MapEntry's answer)."""
    if map_text(pod) is None:
        return EntryChoice((), reason=NO_ANNOTATION,
                           message=f"pod has schedulerName {SCHEDULER_NAME!r} but no map annotation")
    try:
        pool = pool_of(pod)
        annotations = metadata(pod).get("annotations") or {}
        if pool is None or (spec(pod).get("nodeName") and ENTRY_ANNOTATION in annotations):
            return EntryChoice((resolve(pod),))
        return EntryChoice(pool.candidates(), pool=True)
    except NotPlaceable as why:
        return EntryChoice((), reason=why.reason, message=why.message)


@dataclass(frozen=True)
class PodInputs:
    uid: str
    name: str  # namespace/name
    workload: tuple[str, ...]  # fit.workload
    holder: str  # the workload as device and entry records name it (records.workload_key)
    gang: tuple[str, ...]  # fit.gang_key
    priority: int
    shares: bool  # gpu-scheduler/share-gpus: "true"
    choice: EntryChoice

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> "PodInputs":
        meta = metadata(pod)
        mine = workload(pod)
        return cls(str(meta.get("uid") or ""), f"{meta.get('namespace')}/{meta.get('name')}", mine,
                   workload_key(mine), gang_key(pod), pod_priority(pod), shares_gpus(pod), entry_choice(pod))
