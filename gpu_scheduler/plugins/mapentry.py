"""MapEntry (PreFilter): the pod's entry in its gpu-scheduling-map, which names its one node and
its devices; or why it has none. Its result names that node, the only one the pod may go to. Every refusal here is the pod's own (its map, its name), so only
a change of the pod can undo it: it registers no cluster event."""
from __future__ import annotations

from typing import Any, Mapping

from .. import SCHEDULER_NAME
from ..framework.interface import DEVICES, CycleState, PreFilterPlugin, PreFilterResult, unresolvable
from ..placement import NotPlaceable, Resolved, map_text, resolve

NAME = "MapEntry"
NO_ANNOTATION = "NoAnnotation"
RESOLVED = "MapEntry/resolved"  # CycleState key: the pod's Resolved entry


def entry(pod: Mapping[str, Any]) -> Resolved:
    """The pod's index and map entry, or NotPlaceable with the reason users see."""
    if map_text(pod) is None:
        raise NotPlaceable(NO_ANNOTATION, f"pod has schedulerName {SCHEDULER_NAME!r} but no map annotation")
    return resolve(pod)


def resolved(state: CycleState) -> Resolved:
    """What pre_filter found: read by the later plugins of the same attempt."""
    return state.read(RESOLVED)


class MapEntry(PreFilterPlugin):
    name = NAME

    def pre_filter(self, state: CycleState, pod: Mapping[str, Any]) -> PreFilterResult:
        """The entry's one node is the pod's only candidate (the result names it); its devices are
        what the cache counts once the pod is assumed."""
        try:
            found = entry(pod)
        except NotPlaceable as why:
            return PreFilterResult(unresolvable(NAME, why.message, why.reason))
        state.write(RESOLVED, found)
        state.write(DEVICES, found.placement.devices)
        return PreFilterResult(node_names=frozenset({found.placement.node}))
