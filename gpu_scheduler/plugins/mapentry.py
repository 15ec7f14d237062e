"""MapEntry (PreFilter): the pod's entry in its gpu-scheduling-map, which names its one node and
its devices; or why it has none. Its result names that node, the only one the pod may go to. A
pool pod (podindex.is_pool: a Deployment's, which has no index) may take any entry of its map:
the result offers every entry as a candidate, in map order, and the framework gives the pod the
first that passes every filter (PoolEntry refuses those its workload's other pods hold). Every
refusal here is the pod's own (its map, its name), so only a change of the pod can undo it: it
registers no cluster event."""
from __future__ import annotations

from typing import Any, Mapping

from .. import ANNOTATION, SCHEDULER_NAME
from ..framework.interface import (
    BOUND_ANNOTATIONS, DEVICES, Candidate, Candidates, CycleState, PreFilterPlugin, PreFilterResult, inputs,
    unresolvable,
)
from ..fit import DEVICES_ANNOTATION
from ..placement import ENTRY_ANNOTATION, ORDINALS_ANNOTATION, Bounded, NotPlaceable, Resolved, map_text, resolve
from ..podinputs import NO_ANNOTATION

NAME = "MapEntry"
RESOLVED = "MapEntry/resolved"  # CycleState key: the pod's Resolved entry
NO_FREE_ENTRY = "no entry of the pool is free"
POOL_FIX = (f"Add entries to {ANNOTATION}, or set maxSurge: 0 on the Deployment so that an old pod leaves before a"
            " new one is created")


def entry(pod: Mapping[str, Any]) -> Resolved:
    """The pod's index and map entry, or NotPlaceable with the reason users see."""
    if map_text(pod) is None:
        raise NotPlaceable(NO_ANNOTATION, f"pod has schedulerName {SCHEDULER_NAME!r} but no map annotation")
    return resolve(pod)


def resolved(state: CycleState) -> Resolved:
    """What pre_filter found (for a pool pod, the candidate being tried): read by the later
    plugins of the same attempt."""
    return state.read(RESOLVED)


def entry_label(found: Resolved) -> str:
    """An entry as a refusal names it: `entry 2 (node3:0,1,2)`."""
    return f"entry {found.index} ({found.placement.node}:{found.placement.visible_devices})"


def bound_annotations(found: Resolved) -> dict[str, str]:
    """What a pool pod's Binding writes beside its devices: the entry and its devices' ordinals."""
    ordinals = ",".join(str(i) for i in range(len(found.placement.devices)))
    return {ENTRY_ANNOTATION: str(found.index), ORDINALS_ANNOTATION: ordinals}


def _writes(found: Resolved) -> dict[str, Any]:
    writes: dict[str, Any] = {RESOLVED: found, DEVICES: found.placement.devices}
    if found.pooled:
        writes[BOUND_ANNOTATIONS] = {DEVICES_ANNOTATION: found.placement.visible_devices, **bound_annotations(found)}
    return writes


class MapEntry(PreFilterPlugin):
    name = NAME

    def pre_filter(self, state: CycleState, pod: Mapping[str, Any]) -> PreFilterResult:
        """The entry's one node is the pod's only candidate (the result names it); its devices are
        what the cache counts once the pod is assumed. A pool pod's candidates are its map's entries."""
        found = inputs(state, pod).choice
        if not found.options:
            return PreFilterResult(unresolvable(NAME, found.message, found.reason))
        if found.pool:
            return _pool_result(found.options)
        for key, value in _writes(found.options[0]).items():
            state.write(key, value)
        return PreFilterResult(node_names=frozenset({found.options[0].placement.node}))


# A pool's result from the entries offered (all of its map's, kept per map by
# placement.Pool.candidates; one alone for plan's verdict on an entry), kept by map and entries:
# the same for every pod of the pool (its writes are read, never changed).
_pool_results = Bounded()


def _pool_result(entries: tuple[Resolved, ...]) -> PreFilterResult:
    key = (entries[0].map_text, tuple(c.index for c in entries))  # a pool offers one entry or more
    kept = _pool_results.get(key)
    if kept is None:
        options = tuple(Candidate(c.placement.node, entry_label(c), _writes(c)) for c in entries)
        kept = PreFilterResult(node_names=frozenset(c.node for c in options),
                               candidates=Candidates(options, NO_FREE_ENTRY, POOL_FIX))
        _pool_results.put(key, kept, len(entries))
    return kept
