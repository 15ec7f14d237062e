"""NodeAffinity: the pod's nodeSelector and required node affinity against its map node's labels
and name (kube-scheduler's plugins/nodeaffinity). The same function answers, without a node object,
for mutate's warning and an offline `plan`: then only what the name tells is known."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..framework.events import NODE_ADD, NODE_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable
from ..shapes import as_map as _map
from ..shapes import as_maps as _list
from ..placement import metadata, spec

NAME = "NodeAffinity"
AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def _requirement(requirement: Mapping[str, Any], value: str | None, known: bool) -> bool | None:
    """A NodeSelectorRequirement against one label (or field) value; None: cannot be known."""
    if not known:
        return None
    operator, values = requirement.get("operator"), requirement.get("values") or []
    if not isinstance(values, list):
        return False
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _all(results: Iterable[bool | None]) -> bool | None:
    results = list(results)
    return False if False in results else (None if None in results else True)


def _label(key: Any, node: str, labels: Mapping[str, str] | None, requirement: Mapping[str, Any]) -> bool | None:
    if labels is not None:
        return _requirement(requirement, labels.get(key), True)
    return _requirement(requirement, node, key == HOSTNAME_LABEL)


def _term(term: Any, node: str, labels: Mapping[str, str] | None) -> bool | None:
    if not isinstance(term, Mapping):
        return False
    expressions = _list(term.get("matchExpressions"))
    fields = _list(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    return _all([_label(e.get("key"), node, labels, e) for e in expressions]
                + [_requirement(f, node, f.get("key") == "metadata.name") for f in fields])


def node_affinity(pod: Mapping[str, Any], node: str, labels: Mapping[str, str] | None = None) -> str | None:
    """NodeAffinity: why the pod's nodeSelector or required node affinity excludes `node` (None:
    it does not, or cannot be known). With `labels` None (admission, a plan offline: no node object
    at hand) only what the name tells is known: `metadata.name` fields and the
    `kubernetes.io/hostname` label, taken to be the name (as kubelets register it)."""
    pod_spec = spec(pod)
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, Mapping) and selector:
        met = _all(_label(k, node, labels, {"operator": "In", "values": [v]}) for k, v in selector.items())
        if met is False:
            shown = ", ".join(f"{k}={v}" for k, v in selector.items())
            return f"{AFFINITY_REASON}: nodeSelector {{{shown}}} excludes node {node}"
    required = _map(_map(_map(pod_spec.get("affinity")).get("nodeAffinity"))
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if "nodeSelectorTerms" in required:
        terms = required.get("nodeSelectorTerms")
        results = [_term(t, node, labels) for t in (terms if isinstance(terms, list) else [])]
        if True not in results and None not in results:
            return f"{AFFINITY_REASON}: no term of requiredDuringSchedulingIgnoredDuringExecution matches node {node}"
    return None


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    labels = _map(metadata(node).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}




class NodeAffinity(FilterPlugin):
    name = NAME
    events = frozenset({NODE_ADD, NODE_UPDATE})

    def filter(self, state, pod, node):
        problem = node_affinity(pod, node.name, node_labels(node.node))
        return unresolvable(NAME, problem) if problem else SUCCESS
