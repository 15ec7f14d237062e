"""Which map entry a pod uses: its index among its siblings.

Rules, first match wins:
1. the `apps.kubernetes.io/pod-index` label (StatefulSets, Kubernetes 1.28+);
2. `batch.kubernetes.io/job-completion-index`, annotation or label (Indexed Jobs);
3. the trailing `-<digits>` of `metadata.name` (StatefulSets before 1.28).
A pod with only `generateName` (Deployment pods at admission) has no index yet: we say so and
never guess.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from .schedmap import MAX_INDEX_DIGITS
from .schedmap import shown as _shown

STATEFULSET_INDEX_LABEL = "apps.kubernetes.io/pod-index"
JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_NAME_SUFFIX = re.compile(r"-(0|[1-9][0-9]*)$")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


class IndexUnknown(ValueError):
    """The pod's index cannot be known; the message says why."""


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


def pod_index(meta: Mapping[str, Any]) -> int:
    """The index of the pod whose `metadata` is `meta`, or IndexUnknown."""
    labels = _string_map(meta, "labels")
    annotations = _string_map(meta, "annotations")
    if STATEFULSET_INDEX_LABEL in labels:
        return _declared_index(labels[STATEFULSET_INDEX_LABEL], f"label {STATEFULSET_INDEX_LABEL}")
    if JOB_INDEX_KEY in annotations:
        return _declared_index(annotations[JOB_INDEX_KEY], f"annotation {JOB_INDEX_KEY}")
    if JOB_INDEX_KEY in labels:
        return _declared_index(labels[JOB_INDEX_KEY], f"label {JOB_INDEX_KEY}")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        generate = meta.get("generateName")
        if isinstance(generate, str) and generate:
            raise IndexUnknown(
                f"the pod has no name yet (only generateName {_shown(generate)}), so its index is unknown;"
                " use a StatefulSet or an Indexed Job"
            )
        raise IndexUnknown("the pod has no name, so its index is unknown")
    match = _NAME_SUFFIX.search(name)
    if not match:
        raise IndexUnknown(
            f"pod name {_shown(name)} does not end in -<index> and the pod has no "
            f"{STATEFULSET_INDEX_LABEL} label or {JOB_INDEX_KEY} annotation"
        )
    return _to_int(match.group(1), f"the -<index> suffix of pod name {name[:60]!r}")
