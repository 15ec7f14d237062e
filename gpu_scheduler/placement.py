"""Where a pod goes: its map entry, or the precise reason it has none."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from . import ANNOTATION
from .podindex import IndexUnknown, is_pool, pod_index
from .schedmap import MapError, Placement, parse_map

# Reasons a pod carrying the annotation cannot be placed. All are permanent for that pod
# object: retrying the same pod gives the same answer.
MALFORMED_MAP = "MalformedMap"
UNKNOWN_INDEX = "UnknownIndex"
NO_ENTRY = "NoMapEntry"
# A pool pod (podindex.is_pool) that bind has not given an entry yet: it has none of its own.
POOL_UNASSIGNED = "PoolUnassigned"
# Written on a pool pod by its Binding (with gpu-scheduler/devices): the map index of the entry
# bind gave it, which holds that entry for the pod's workload while the pod lives; and the
# ordinals its containers see its devices by where they see only those (nvidia and dra modes).
ENTRY_ANNOTATION = "gpu-scheduler/entry"
ORDINALS_ANNOTATION = "gpu-scheduler/device-ordinals"


# Not frozen: Python assigns __traceback__/__notes__ on exceptions (contextlib, add_note), and a
# frozen dataclass refuses that with FrozenInstanceError.
@dataclass(eq=False)
class NotPlaceable(Exception):
    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


def metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}  # dict first: shapes.as_map


def spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("spec")
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def map_text(pod: Mapping[str, Any]) -> str | None:
    """The annotation's value, or None when the pod does not carry it."""
    annotations = metadata(pod).get("annotations")
    if not isinstance(annotations, Mapping):
        return None
    return annotations.get(ANNOTATION)


@dataclass(frozen=True)
class Resolved:
    """A pod's place in its map: its index, its entry, and the whole map (for device checks)."""

    index: int
    placement: Placement
    entries: Mapping[int, Placement]
    map_text: str = ""
    pooled: bool = False  # a pool's entry, chosen by bind (not the pod's own index)


@dataclass(frozen=True)
class Pool:
    """A pool pod's map: every entry is a candidate; bind gives the pod the first free one that fits."""

    entries: Mapping[int, Placement]
    map_text: str

    def candidates(self) -> tuple[Resolved, ...]:
        """Each entry as the pod would hold it, in map order: the same tuple for the same map while
        it is among the last asked (every cycle of a pool pod asks; see CANDIDATES_KEPT)."""
        kept = _candidates.get(self.map_text)
        if kept is None:
            kept = tuple(Resolved(i, self.entries[i], self.entries, self.map_text, pooled=True)
                         for i in sorted(self.entries))
            _candidates.put(self.map_text, kept, len(kept))
        return kept


# A pool pod's cycle tried its map's entries as new objects each time: with MapEntry's candidates
# built from them, 0.5 ms of a 100-entry pool's cycle before the first entry's filters ran (issue
# 53). The last maps' are kept (Bounded: CANDIDATES_KEPT entries in all, about 1 KiB each with
# MapEntry's).
CANDIDATES_KEPT = 4096


class Bounded:
    """Values kept by key, each with its size (in entries), at most `limit` in all, the oldest
    dropped first; a value larger than the limit is not kept. Shared by bind's placement threads:
    one lock (two threads building the same key's value at once build equal ones)."""

    def __init__(self, limit: int = CANDIDATES_KEPT):
        self.limit, self._kept, self._size = limit, {}, 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            kept = self._kept.get(key)
        return None if kept is None else kept[0]

    def put(self, key: Any, value: Any, size: int) -> None:
        with self._lock:
            if size > self.limit or key in self._kept:
                return
            self._kept[key] = (value, size)
            self._size += size
            while self._size > self.limit:  # never the one just kept: it alone is within the limit
                _, dropped = self._kept.pop(next(iter(self._kept)))
                self._size -= dropped


_candidates = Bounded()


def _listing(indexes: list[int], shown: int = 10) -> str:
    head = ", ".join(map(str, indexes[:shown]))
    return head if len(indexes) <= shown else f"{head}, ... ({len(indexes)} entries)"


def _entries(pod: Mapping[str, Any]) -> tuple[str, Mapping[int, Placement]]:
    text = map_text(pod)
    try:
        return text, parse_map(text)
    except MapError as error:
        raise NotPlaceable(MALFORMED_MAP, str(error)) from None


def pool_of(pod: Mapping[str, Any]) -> Pool | None:
    """The pod's pool when it is a pool pod (podindex.is_pool), else None; NotPlaceable for a
    malformed map."""
    if not is_pool(metadata(pod)):
        return None
    text, entries = _entries(pod)
    return Pool(entries, text)


def _given_entry(pod: Mapping[str, Any], entries: Mapping[int, Placement], text: str) -> Resolved:
    """The entry bind gave a pool pod (its Binding's annotation), or NotPlaceable."""
    annotations = metadata(pod).get("annotations")
    given = annotations.get(ENTRY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(given, str) or not given.isdigit() or len(given) > 10:
        raise NotPlaceable(POOL_UNASSIGNED, "the pod takes a free entry of its map's pool, which bind chooses when it"
                                            " binds the pod; it has none yet")
    index = int(given)
    if index not in entries:
        raise NotPlaceable(NO_ENTRY, f"the pod holds pool entry {index}, which the map no longer has"
                                     f" (entries: {_listing(sorted(entries))})")
    return Resolved(index, entries[index], entries, text, pooled=True)


def resolve(pod: Mapping[str, Any]) -> Resolved:
    """Where a pod that carries the annotation goes, or NotPlaceable saying why not. A pool pod's
    is the entry its Binding recorded (POOL_UNASSIGNED before)."""
    text, entries = _entries(pod)
    if is_pool(metadata(pod)):
        return _given_entry(pod, entries, text)
    try:
        index = pod_index(metadata(pod))
    except IndexUnknown as error:
        raise NotPlaceable(UNKNOWN_INDEX, str(error)) from None
    if index not in entries:
        raise NotPlaceable(
            NO_ENTRY,
            f"pod index {index} has no entry in the {ANNOTATION} annotation (entries: {_listing(sorted(entries))})",
        )
    return Resolved(index, entries[index], entries, text)


def placement_for(pod: Mapping[str, Any]) -> Placement:
    """The Placement of a pod that carries the annotation, or NotPlaceable."""
    return resolve(pod).placement
