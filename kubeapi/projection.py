"""Watch events and listings of pods and nodes, decoded into only the fields bind reads.

bind watches every pod and node of the cluster, and most of what it decodes is never read: a
running pod's managed fields, container statuses, volumes and probes; a node's images and
heartbeats. msgspec decodes a JSON document against a TypedDict and skips, in C, every key the
TypedDict does not declare, so each object comes out as the same plain dicts and lists that
`json.loads` gives, holding only the declared keys. No caller changes: the plugins read
`pod["spec"]["nodeName"]` as before. (Measured against the standard library and against orjson
plus a projection in Python by `python -m bench.decode`: docs/performance.md.)

What is declared is what the plugins, the cache, the queue's hints, the gang, preemption and the
Events read (a subtree the plugins read whole, such as affinity or a container's resources, is
declared `Any` and kept whole). `tests/test_projection.py` keeps this list honest: it decodes
captured and generated pods both ways and compares every plugin's verdict.

Scalars are declared `Any`: a field of an unexpected type is the plugins' to judge, as with
`json.loads` (they are total on odd shapes), never a decoding error. A document that is not
shaped like an object where one is declared (which the API server never sends) is decoded in
full with `json.loads` instead: nothing is lost, it costs only time.

Objects decoded here must never be written back whole (an update would drop what is not
declared): bind writes pods only with patches and subresources, and claims, which it updates
whole, are decoded in full."""
from __future__ import annotations

import json
from typing import Any, TypedDict

import msgspec


class OwnerReference(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    name: Any
    uid: Any
    controller: Any


class ObjectMeta(TypedDict, total=False):
    name: Any
    generateName: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    labels: Any
    annotations: Any
    ownerReferences: list[OwnerReference]
    finalizers: Any


class Container(TypedDict, total=False):
    # Not env: bind reads none of it (explain shows the device variables from its own full read).
    name: Any
    resources: Any  # requests, limits, claims: fit and DRA read them whole
    ports: Any  # hostPort, hostIP, protocol: NodePorts
    restartPolicy: Any  # an init container with Always is a sidecar: its requests and ports count


class PodSpec(TypedDict, total=False):
    nodeName: Any
    schedulerName: Any
    priority: Any
    preemptionPolicy: Any
    schedulingGates: Any
    nodeSelector: Any
    affinity: Any
    tolerations: Any
    containers: list[Container]
    initContainers: list[Container]
    overhead: Any
    resources: Any  # pod-level resources (1.34 beta)
    resourceClaims: Any
    terminationGracePeriodSeconds: Any
    restartPolicy: Any
    priorityClassName: Any  # GPUQuota: a ResourceQuota's PriorityClass scope
    activeDeadlineSeconds: Any  # GPUQuota: its Terminating and NotTerminating scopes
    schedulingGroup: Any  # an upstream PodGroup (1.36+): bind says it runs no upstream gangs (notices.py)


class Condition(TypedDict, total=False):
    # A pod's or a node's, without its times: a node status update that only renews its
    # heartbeats decodes to the node as it was, which is no event for bind (kube-scheduler's
    # node hints ignore them); a pod's times are read by nobody.
    type: Any
    status: Any
    reason: Any
    message: Any


class PodStatus(TypedDict, total=False):
    phase: Any
    startTime: Any
    nominatedNodeName: Any
    conditions: list[Condition]
    resourceClaimStatuses: Any


class Pod(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class NodeSpec(TypedDict, total=False):
    unschedulable: Any
    taints: Any


class NodeStatus(TypedDict, total=False):
    capacity: Any
    allocatable: Any
    conditions: list[Condition]


class Node(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    metadata: ObjectMeta
    spec: NodeSpec
    status: NodeStatus


class PodEvent(TypedDict, total=False):
    type: Any
    object: Pod


class NodeEvent(TypedDict, total=False):
    type: Any
    object: Node


# `continue` is a keyword: TypedDict's functional form declares it.
_ListMeta = TypedDict("_ListMeta", {"resourceVersion": Any, "continue": Any}, total=False)
PodList = TypedDict("PodList", {"metadata": _ListMeta, "items": list[Pod]}, total=False)
NodeList = TypedDict("NodeList", {"metadata": _ListMeta, "items": list[Node]}, total=False)


class Decoder:
    """One kind's projection: `object(body)` for a GET, `event(line)` for a watch line,
    `listing(body)` for a list page. An ERROR event's object is a Status, not the kind: it is
    decoded in full. bind reads every pod through PODS, so that two copies of one pod compare
    alike (the Binding's retry compares the pod read after a conflict with the one decided on)."""

    def __init__(self, object_type: type, event_type: type, list_type: type):
        self._type = object_type
        self._object = msgspec.json.Decoder(object_type)
        self._event = msgspec.json.Decoder(event_type)
        self._listing = msgspec.json.Decoder(list_type)

    def object(self, body: bytes) -> dict:
        """One object, as a GET answers it."""
        try:
            return self._object.decode(body)
        except msgspec.DecodeError:
            return json.loads(body)

    def event(self, line: bytes) -> dict:
        try:
            event = self._event.decode(line)
        except msgspec.DecodeError:
            return json.loads(line)  # raises as before on what is not JSON
        return json.loads(line) if event.get("type") == "ERROR" else event

    def listing(self, body: bytes) -> dict:
        try:
            return self._listing.decode(body)
        except msgspec.DecodeError:
            return json.loads(body)

    def project(self, value: Any) -> Any:
        """An object already decoded in full (a structured-mode CloudEvent's data), projected as
        object() would have decoded its JSON: the same dicts, holding only the declared keys;
        anything not shaped like the kind is returned as it is."""
        try:
            return msgspec.convert(value, self._type)
        except msgspec.ValidationError:
            return value


PODS = Decoder(Pod, PodEvent, PodList)


# A pod's metadata alone (kubeapi.client.METADATA_LIST), without its managed fields.
class PodMetadata(TypedDict, total=False):
    metadata: ObjectMeta


class PodMetadataEvent(TypedDict, total=False):
    type: Any
    object: PodMetadata


PodMetadataList = TypedDict("PodMetadataList", {"metadata": _ListMeta, "items": list[PodMetadata]}, total=False)
POD_METADATA = Decoder(PodMetadata, PodMetadataEvent, PodMetadataList)
NODES = Decoder(Node, NodeEvent, NodeList)


# -- mutate: an AdmissionReview of a pod's creation --------------------------------------------
class AdmittedPodMeta(TypedDict, total=False):
    # All the metadata a pod has at its creation but its managed fields (the largest part).
    name: Any
    generateName: Any
    namespace: Any
    uid: Any
    labels: Any
    annotations: Any
    ownerReferences: Any
    finalizers: Any
    creationTimestamp: Any
    deletionTimestamp: Any


class AdmittedPod(TypedDict, total=False):
    # The spec whole: mutate writes JSONPatch operations on it (each container's env, resources,
    # claims) from what it read. Not the status (a created pod has none that matters).
    apiVersion: Any
    kind: Any
    metadata: AdmittedPodMeta
    spec: Any


class AdmissionRequest(TypedDict, total=False):
    # Not oldObject (null for a creation), userInfo, options.
    uid: Any
    kind: Any
    resource: Any
    subResource: Any
    name: Any
    namespace: Any
    operation: Any
    dryRun: Any
    object: AdmittedPod


class AdmissionReview(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    request: AdmissionRequest


_REVIEW = msgspec.json.Decoder(AdmissionReview)


def admission_review(body: bytes) -> Any:
    """What mutate reads of an AdmissionReview: the request, and of its pod all but the managed
    fields and status. Whatever is not shaped like an AdmissionReview is decoded in full with
    json.loads, which raises as it did (ValueError on what is not JSON; RecursionError past its
    depth), so that gpu_scheduler.admission.parse_review names the field that is wrong. What is
    skipped is never read; only what is kept goes through parse_review's nesting limit."""
    try:
        return _REVIEW.decode(body)
    except msgspec.DecodeError:
        return json.loads(body)
