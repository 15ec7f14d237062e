"""Where a pod goes: its map entry, or the precise reason it has none."""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from . import ANNOTATION
from .podindex import IndexUnknown, pod_index
from .schedmap import MapError, Placement, parse_map

# Reasons a pod carrying the annotation cannot be placed. All are permanent for that pod
# object: retrying the same pod gives the same answer.
MALFORMED_MAP = "MalformedMap"
UNKNOWN_INDEX = "UnknownIndex"
NO_ENTRY = "NoMapEntry"


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
    return meta if isinstance(meta, Mapping) else {}


def spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("spec")
    return value if isinstance(value, Mapping) else {}


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


def _listing(indexes: list[int], shown: int = 10) -> str:
    head = ", ".join(map(str, indexes[:shown]))
    return head if len(indexes) <= shown else f"{head}, ... ({len(indexes)} entries)"


def resolve(pod: Mapping[str, Any]) -> Resolved:
    """Where a pod that carries the annotation goes, or NotPlaceable saying why not."""
    text = map_text(pod)
    try:
        entries = parse_map(text)
    except MapError as error:
        raise NotPlaceable(MALFORMED_MAP, str(error)) from None
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
