"""Binding decisions: which pod events lead to a `pods/binding` call, and its body."""
from __future__ import annotations

import json

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import SCHEDULER_NAME
from .devices import device_warnings
from .fit import DEVICES_ANNOTATION
from .placement import ENTRY_ANNOTATION, ORDINALS_ANNOTATION, POOL_UNASSIGNED, NotPlaceable, metadata, spec
from .plugins.mapentry import entry
from .schedmap import (
    MAX_NAMESPACE, MAX_NESTING, MAX_NODE_NAME, Placement, is_dns_label, is_dns_subdomain, nesting_exceeds, shown,
)

# CloudEvent types, as Knative's ApiServerSource (mode Resource) and PingSource send them.
POD_ADD = "dev.knative.apiserver.resource.add"
POD_UPDATE = "dev.knative.apiserver.resource.update"
PING = "dev.knative.sources.ping"
POD_EVENTS = (POD_ADD, POD_UPDATE)
# The types bind may hear of; metrics label anything else "other", so a sender cannot grow them.
KNOWN_EVENT_TYPES = frozenset({*POD_EVENTS, PING, "dev.knative.apiserver.resource.delete"})
MAX_UID = 128  # Kubernetes UIDs are 36-character UUIDs


def event_type_label(kind: Any) -> str:
    """The metrics label of an event type: one of KNOWN_EVENT_TYPES, or "other"."""
    return kind if kind in KNOWN_EVENT_TYPES else "other"

# Field selector for the pods a resync must look at: ours and not yet bound.
PENDING_SELECTOR = f"spec.schedulerName={SCHEDULER_NAME},spec.nodeName="


@dataclass(frozen=True)
class Ignore:
    """Not ours to act on (not an error)."""

    why: str


@dataclass(frozen=True)
class Bind:
    namespace: str
    name: str
    uid: str
    node: str
    devices: tuple[str, ...]
    # (Event reason, message) pairs an operator should see once the pod is bound.
    warnings: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    # The pod's version this decision was made from: the Binding's precondition (binding_for).
    resource_version: str = field(default="", compare=False)
    # A pool pod's entry (its map index), which the Binding records on it with its devices.
    entry: int | None = None

    @property
    def placement(self) -> Placement:
        return Placement(self.node, self.devices)


@dataclass(frozen=True)
class Pooled:
    """Ours, a pool pod: which entry it takes is decided in its scheduling cycle."""

    pod: str = field(default="", compare=False)  # namespace/name
    warnings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Unplaceable:
    """Ours, but it cannot be placed: permanent for this pod object."""

    reason: str
    message: str
    pod: str = field(default="", compare=False)  # namespace/name, for logs and Events


class EventError(ValueError):
    """A pod event whose data is not a usable Pod; the message names the field."""


def check_pod(data: Any) -> Mapping[str, Any]:
    """The pod in an event's data, with the fields a binding needs. Its name and namespace are
    checked as the API server checks them (DNS-1123), because bind puts them in URL paths."""
    if not isinstance(data, Mapping):
        raise EventError(f"data: expected the pod as a JSON object, found {type(data).__name__}")
    if data.get("kind", "Pod") != "Pod":
        raise EventError(f"data.kind: expected 'Pod', found {shown(data.get('kind'))}")
    if nesting_exceeds(data, MAX_NESTING):
        raise EventError(f"data: nested more than {MAX_NESTING} levels deep; no pod is")
    meta = data.get("metadata")
    if not isinstance(meta, Mapping):
        raise EventError("data.metadata: expected an object")
    for key in ("name", "namespace", "uid"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise EventError(f"data.metadata.{key}: expected a non-empty string")
    if not is_dns_subdomain(meta["name"]):
        raise EventError(f"data.metadata.name: {shown(meta['name'])} is not a pod name (a DNS-1123 subdomain:"
                         f" at most {MAX_NODE_NAME} lowercase letters, digits, '-' and '.')")
    if not is_dns_label(meta["namespace"]):
        raise EventError(f"data.metadata.namespace: {shown(meta['namespace'])} is not a namespace (a DNS-1123"
                         f" label: at most {MAX_NAMESPACE} lowercase letters, digits and '-')")
    if len(meta["uid"]) > MAX_UID:
        raise EventError(f"data.metadata.uid: {len(meta['uid'])} characters long; a UID has at most {MAX_UID}")
    if not isinstance(data.get("spec", {}), Mapping):
        raise EventError("data.spec: expected an object")
    return data


def not_ours_to_place(pod: Mapping[str, Any]) -> Ignore | None:
    """Why a pod is not for bind to place (another scheduler's, bound, being deleted), or None:
    what bind_decision says first, without reading the map."""
    meta, pod_spec = metadata(pod), spec(pod)
    if pod_spec.get("schedulerName") != SCHEDULER_NAME:
        return Ignore(f"spec.schedulerName is {pod_spec.get('schedulerName')!r}")
    if pod_spec.get("nodeName"):
        return Ignore(f"already bound to {pod_spec['nodeName']}")
    if meta.get("deletionTimestamp"):
        return Ignore("being deleted")
    return None


def bind_decision(pod: Mapping[str, Any]) -> Ignore | Bind | Pooled | Unplaceable:
    """What to do with a pod seen in an add/update event or a resync listing."""
    ignore = not_ours_to_place(pod)
    if ignore is not None:
        return ignore
    meta = metadata(pod)
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    try:
        resolved = entry(pod)
    except NotPlaceable as why:
        if why.reason == POOL_UNASSIGNED:
            return Pooled(name)
        return Unplaceable(why.reason, why.message, name)
    placement = resolved.placement
    return Bind(meta["namespace"], meta["name"], str(meta.get("uid") or ""), placement.node, placement.devices,
                tuple(device_warnings(pod, resolved)), str(meta.get("resourceVersion") or ""))


def binding_for(bind: Bind) -> dict[str, Any]:
    """The Binding body. Its preconditions make the API server refuse to bind a pod that was
    deleted and re-created under the same name (UID), or changed at all (resourceVersion), since
    the version the decision was made from: a pod is bound only as that version placed it. Its
    annotation, which the API server copies onto the pod in the same write, records the devices
    placed: what GPU accounting counts for this pod from then on."""
    annotations = {DEVICES_ANNOTATION: ",".join(bind.devices)}
    if bind.entry is not None:  # a pool's entry: held by the pod from this write on (plugins/poolentry.py)
        annotations[ENTRY_ANNOTATION] = str(bind.entry)
        annotations[ORDINALS_ANNOTATION] = ",".join(str(i) for i in range(len(bind.devices)))
    meta = {"name": bind.name, "namespace": bind.namespace, "uid": bind.uid, "annotations": annotations}
    if bind.resource_version:
        meta["resourceVersion"] = bind.resource_version
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": bind.node}}


# What a bind attempt came to. `retry` outcomes are answered 503 so Knative redelivers.
BOUND = "Bound"
ALREADY_BOUND = "AlreadyBound"
GONE = "PodGone"
REPLACED = "PodReplaced"
BOUND_ELSEWHERE = "BoundElsewhere"
API_ERROR = "APIError"
RETRY = "Retry"

def placement_input_parts(pod: Mapping[str, Any]) -> list:
    """What can change a pending pod's placement: its spec, labels and annotations (not its status,
    which bind writes itself, nor its version)."""
    meta = metadata(pod)
    return [pod.get("spec"), meta.get("labels"), meta.get("annotations")]


def placement_inputs(pod: Mapping[str, Any]) -> str:
    """placement_input_parts as one string to compare."""
    return json.dumps(placement_input_parts(pod), sort_keys=True, default=str)


def conflict_outcome(bind: Bind, current: Mapping[str, Any] | None) -> str:
    """The outcome of a 409 from the Binding call, given the pod as it is now (None: gone).

    A 409 means the pod was bound meanwhile (often by us: duplicated events, a concurrent
    replica), the UID precondition failed because the pod was re-created, or the resourceVersion
    one because it changed since the decision (Retry: placed again from the pod as it is now)."""
    if current is None:
        return GONE
    if metadata(current).get("uid") != bind.uid:
        return REPLACED
    node = spec(current).get("nodeName")
    given = (metadata(current).get("annotations") or {}).get(ENTRY_ANNOTATION)
    if node == bind.node and (bind.entry is None or given == str(bind.entry)):
        return ALREADY_BOUND
    if node == bind.node:  # a pool pod another instance bound to another entry of the node: what this attempt holds is not its
        return BOUND_ELSEWHERE
    if node:
        return BOUND_ELSEWHERE
    if metadata(current).get("deletionTimestamp"):
        return GONE
    return RETRY
