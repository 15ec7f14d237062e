"""What scheduling reads of a pending pod, worked out once per cycle (kube-scheduler's PodInfo for
the pod being scheduled): who it is, its workload (whose records and pool it shares), its gang and
what it asks of gangs, its place among its gang's members, its priority, whether it shares GPUs,
and the entries of its map it may take (its own by its index, or a pool's); and what bind tells it
(its notices, and its own entry's device warnings once it is bound). Framework.schedule works it
out at the start of the pod's cycle and gives it to the PodGroup plugins; the cycle's state
carries it (framework.interface.inputs) to every other plugin, and each Outcome to the shell, so
none of them reads the pod again."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import SCHEDULER_NAME
from .devices import device_warnings
from .fit import gang_key, pod_priority, shares_gpus, workload
from .notices import pod_notices
from .placement import ENTRY_ANNOTATION, NotPlaceable, Resolved, map_text, metadata, pool_of, resolve, spec
from .gangask import GangAsk, gang_ask, gang_name_of, member_order, upstream_pod_group
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


def held_warnings(pod: Mapping[str, Any], choice: EntryChoice) -> tuple[tuple[str, str], ...]:
    """binding.Bind's device warnings: those of the entry the pod holds by itself (its index's; a
    pool pod's, the one its Binding recorded), said once it is bound; none when it holds none."""
    if not choice.pool:
        return tuple(device_warnings(pod, choice.options[0])) if choice.options else ()
    try:  # a pool pod's choice is its pool's entries; the one it holds, if any, is its annotation's
        return tuple(device_warnings(pod, resolve(pod)))
    except NotPlaceable:
        return ()


@dataclass(frozen=True)
class PodInputs:
    uid: str
    name: str  # namespace/name
    namespace: str
    workload: tuple[str, ...]  # fit.workload
    holder: str  # the workload as device and entry records name it (records.workload_key)
    gang: tuple[str, ...]  # fit.gang_key
    gang_name: str  # the gang as users know it (gangask.gang_name_of)
    gang_ask: GangAsk  # what its gpu-scheduler/gang asks for (gang.gang_ask)
    order: tuple[int, str]  # its place among its gang's members (gang.member_order)
    priority: int
    shares: bool  # gpu-scheduler/share-gpus: "true"
    choice: EntryChoice
    notices: tuple[tuple[str, str], ...]  # (Event reason, message) said once, whatever it comes to
    warnings: tuple[tuple[str, str], ...]  # (Event reason, message) said when it is bound (held_warnings)

    @property
    def key(self) -> str:
        """Its identity: its UID, or its name for a pod not created yet (plan's)."""
        return self.uid or self.name

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> "PodInputs":
        meta = metadata(pod)
        mine, ask, gang, choice = workload(pod), gang_ask(pod), gang_key(pod), entry_choice(pod)
        gang_name = gang_name_of(gang)
        return cls(str(meta.get("uid") or ""), f"{meta.get('namespace')}/{meta.get('name')}",
                   str(meta.get("namespace") or ""), mine, workload_key(mine), gang, gang_name, ask, member_order(pod),
                   pod_priority(pod), shares_gpus(pod), choice, pod_notices(upstream_pod_group(pod), ask, gang_name),
                   held_warnings(pod, choice))
