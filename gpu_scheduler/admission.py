"""Admission decisions: an AdmissionReview in, an AdmissionReview out, no I/O.

A pod with the annotation and a map entry gets `CUDA_VISIBLE_DEVICES` in every container and
init container. Every admitted pod with the annotation gets the label the event source selects
on, so bind also hears of the pods it cannot place and can say why. The patch replaces whole `env`
lists and single labels, so applying it twice, or re-running the webhook on its own output
(reinvocationPolicy IfNeeded), changes nothing more.

In DRA mode (devices.py, plugins/dynamicresources/allocator.py) the pod also gets `spec.resourceClaims` entry `gpu-scheduler`
naming the claim bind creates for it (`<pod name>-gpus`), and each container it sets the
environment of claims it in `resources.claims`: the kubelet then gives the containers exactly the
claim's devices.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import ANNOTATION, MANAGED_LABEL, MANAGED_VALUE, SCHEDULER_NAME
from .plugins.nodeaffinity import node_affinity
from .devices import (
    CUDA, DRA, ModeError, device_env, device_mode, device_warnings, pool_device_env,
)
from .plugins.dynamicresources.allocator import POD_CLAIM, claim_name, pool_claim_name
from .fit import GANG_ANNOTATION
from .gangask import GangError, gang_size
from .placement import MALFORMED_MAP, NotPlaceable, Pool, map_text, metadata, pool_of, resolve, spec
from .quota import QuotaDodge, check_not_written, quota_requests, resources_patch
from .templatecount import (
    TOPOLOGY_ANNOTATIONS, WORKLOAD_RESOURCES, declared, pod_templates, template_counts, workload_patch,
)
from .schedmap import MAX_NESTING, nesting_exceeds, shown
from .workloads import WorkloadUnreadable, jobset_annotations, jobset_pod

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
STATUS_REASONS = {400: "BadRequest", 404: "NotFound", 503: "ServiceUnavailable"}
CONTAINER_FIELDS = ("initContainers", "containers")


class ReviewError(ValueError):
    """The body is not a usable AdmissionReview; the message names the field."""


@dataclass(frozen=True)
class Review:
    api_version: str
    uid: str
    operation: str
    resource: str
    pod: Mapping[str, Any] | None
    dry_run: bool
    pod_name: str = field(default="", compare=False)  # namespace/name (or generateName*), for logs
    # A workload object created or updated (templatecount.WORKLOAD_RESOURCES): its templates' counts.
    workload: Mapping[str, Any] | None = None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _pod_name(request: Mapping[str, Any], pod: Mapping[str, Any] | None) -> str:
    name = _text(request.get("name"))
    if not name and pod is not None:
        generate = _text(metadata(pod).get("generateName"))
        name = f"{generate}*" if generate else ""
    return f"{_text(request.get('namespace'))}/{name}"


def checked_field(obj: Mapping[str, Any], key: str, path: str, kind: type, required: bool = True) -> Any:
    """obj[key], which must be a `kind` (dict or str); None for an absent or null one that is not
    `required`. Else ReviewError, naming the field as `path` + `key`."""
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind):
        found = "missing" if key not in obj else f"a {type(value).__name__}"
        raise ReviewError(f"{path}{key}: expected {'an object' if kind is dict else 'a string'}, found {found}")
    return value



def parse_review(body: Any) -> Review:
    """Check the shape of a decoded AdmissionReview and keep what the decision needs."""
    if not isinstance(body, dict):
        raise ReviewError(f"body: expected a JSON object (an AdmissionReview), found {type(body).__name__}")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind: expected 'AdmissionReview', found {shown(body.get('kind'))}")
    api_version = body.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(f"apiVersion: expected one of {', '.join(API_VERSIONS)}, found {shown(api_version)}")
    # Before anything copies, encodes or logs it: no real pod comes near this depth.
    if nesting_exceeds(body, MAX_NESTING):
        raise ReviewError(f"body: nested more than {MAX_NESTING} levels deep; no AdmissionReview of a pod is")
    request = checked_field(body, "request", "", dict)
    uid = checked_field(request, "uid", "request.", str)
    if not uid:
        raise ReviewError("request.uid: must not be empty")
    operation = checked_field(request, "operation", "request.", str)
    resource = request.get("resource")
    resource_name = resource.get("resource", "") if isinstance(resource, dict) else ""
    pod = None
    if operation == "CREATE" and resource_name == "pods" and not request.get("subResource"):
        pod = checked_field(request, "object", "request.", dict)
        if not isinstance(pod.get("spec"), dict):
            raise ReviewError("request.object.spec: expected an object, the pod being created has none")
    workload = None
    if operation in ("CREATE", "UPDATE") and resource_name in WORKLOAD_RESOURCES and not request.get("subResource"):
        workload = checked_field(request, "object", "request.", dict)
    dry_run = request.get("dryRun")
    return Review(api_version, uid, operation, resource_name, pod, dry_run is True, _pod_name(request, pod or workload),
                  workload)


def _env_with(env: list[Any], values: Mapping[str, Any]) -> list[Any]:
    """`env` with each name in `values` set once, in its old place if it had one."""
    result, placed = [], set()
    for var in env:
        name = var.get("name") if isinstance(var, dict) else None
        if isinstance(name, str) and name in values:
            if name not in placed:
                result.append(_env_var(name, values[name]))
                placed.add(name)
            continue
        result.append(var)
    result.extend(_env_var(n, v) for n, v in values.items() if n not in placed)
    return result


def _env_var(name: str, value: str | Mapping[str, Any]) -> dict[str, Any]:
    """An EnvVar: a string is its value, a mapping its `valueFrom` (a pool pod's: devices.pool_device_env)."""
    return {"name": name, "value": value} if isinstance(value, str) else {"name": name, "valueFrom": dict(value)}


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _claim_ops(container: Mapping[str, Any], path: str) -> list[dict[str, Any]]:
    """The operations adding {name: gpu-scheduler} to a container's resources.claims."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return [{"op": "add", "path": f"{path}/resources", "value": {"claims": [{"name": POD_CLAIM}]}}]
    claims = resources.get("claims")
    if not isinstance(claims, list):
        return [{"op": "add", "path": f"{path}/resources/claims", "value": [{"name": POD_CLAIM}]}]
    if any(isinstance(c, dict) and c.get("name") == POD_CLAIM for c in claims):
        return []
    # The whole list, as with env: applying the patch twice adds nothing twice.
    return [{"op": "add", "path": f"{path}/resources/claims", "value": [*claims, {"name": POD_CLAIM}]}]


class ClaimError(ValueError):
    """A pod in DRA mode that cannot be given its claim; the message says why."""


def pod_claim_patch(pod: Mapping[str, Any], claim: str | None = None) -> list[dict[str, Any]]:
    """The operations adding the pod-level claim entry `gpu-scheduler` -> `<pod name>-gpus` (or
    `claim`: a pool pod's, which has no name yet), or ClaimError: the pod has no name yet
    (generateName: the claim's name must be known now), or already has an entry of that name for
    another claim."""
    if claim is None:
        name = metadata(pod).get("name")
        if not isinstance(name, str) or not name:
            raise ClaimError("device env mode dra needs the pod's name at admission (the ResourceClaim is named after"
                             " it): set metadata.name, not only generateName (StatefulSet pods have one; Indexed Job pods"
                             " do not: use an env mode for them)")
        claim = claim_name(name)
    if len(claim) > 253:
        raise ClaimError(f"device env mode dra: the claim name {claim[:40]}... would be longer than 253 characters")
    wanted = {"name": POD_CLAIM, "resourceClaimName": claim}
    claims = spec(pod).get("resourceClaims")
    if not isinstance(claims, list):
        return [{"op": "add", "path": "/spec/resourceClaims", "value": [wanted]}]
    for entry in claims:
        if isinstance(entry, dict) and entry.get("name") == POD_CLAIM:
            if entry == wanted:
                return []
            raise ClaimError(f"spec.resourceClaims already has an entry named {POD_CLAIM!r} ({shown(entry)});"
                             f" device env mode dra adds its own under that name")
    return [{"op": "add", "path": "/spec/resourceClaims", "value": [*claims, wanted]}]


def patch_for(pod: Mapping[str, Any], values: Mapping[str, str], claims: bool = False,
              requests: Mapping[str, str] | None = None, claim: str | None = None) -> list[dict[str, Any]]:
    """JSONPatch operations that set `values` in every container's env and add the managed
    label; with `claims` (DRA mode), also the pod's claim and each container's use of it (may
    raise ClaimError); with `requests`, those requests and limits in the first container (the
    GPUs a ResourceQuota counts, quota.py); empty when the pod already has all of them."""
    ops: list[dict[str, Any]] = pod_claim_patch(pod, claim) if claims else []
    for field in CONTAINER_FIELDS:
        containers = spec(pod).get(field)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            if not isinstance(container, dict):
                continue
            if requests and field == "containers" and i == 0:
                if not isinstance(container.get("resources"), dict):
                    # One empty object first, which both the claim and the requests then fill:
                    # two operations each adding the whole `resources` would replace each other.
                    ops.append({"op": "add", "path": "/spec/containers/0/resources", "value": {}})
                    container = {**container, "resources": {}}
                # Exactly the entry's: what the template declared for its largest entry is replaced.
                ops += resources_patch("/spec/containers/0/resources", container["resources"], requests)
            env = container.get("env")
            env = env if isinstance(env, list) else []
            wanted = _env_with(env, values)
            if wanted != env:
                ops.append({"op": "add", "path": f"/spec/{field}/{i}/env", "value": wanted})
            if claims:
                ops += _claim_ops(container, f"/spec/{field}/{i}")
    return ops + label_patch(pod)


def with_annotations(pod: Mapping[str, Any], written: Mapping[str, str]) -> Mapping[str, Any]:
    """`pod` as it is once `written` is added to its annotations."""
    if not written:
        return pod
    meta = metadata(pod)
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    return {**pod, "metadata": {**meta, "annotations": {**annotations, **written}}}


def annotation_patch(pod: Mapping[str, Any], written: Mapping[str, str]) -> list[dict[str, Any]]:
    """The operations adding `written` to the annotations of `pod` (which has some: its map)."""
    return [{"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value}
            for key, value in written.items()]


def label_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The operation adding the label the event source selects on; empty when it is there, and
    for a pod another scheduler places: bind never acts on such a pod, and each of its events
    (created, bound, every status change) would cost bind an answer (docs/performance.md, issue 62)."""
    if spec(pod).get("schedulerName") != SCHEDULER_NAME:
        return []
    labels = metadata(pod).get("labels")
    if not isinstance(labels, dict):
        return [{"op": "add", "path": "/metadata/labels", "value": {MANAGED_LABEL: MANAGED_VALUE}}]
    if labels.get(MANAGED_LABEL) != MANAGED_VALUE:
        return [{"op": "add", "path": f"/metadata/labels/{_escape(MANAGED_LABEL)}", "value": MANAGED_VALUE}]
    return []


@dataclass(frozen=True)
class Decision:
    allowed: bool
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    message: str = ""
    reason: str = ""  # for logs and metrics: why this decision
    code: int = 400  # a refusal's status: 400 for the pod's own fault; 503 where a retry can succeed


def _invalid_gang(pod: Mapping[str, Any]) -> Decision | None:
    """The denial of a malformed gpu-scheduler/gang value (docs/gangs.md), in the Gang plugin's
    own words, which name the fix; None when the value is "true", "false", absent or a size the
    map can give. Only the pod's author can fix it, so it is refused now rather than at bind."""
    try:
        gang_size(pod)
    except GangError as error:
        return Decision(False, message=str(error), reason="InvalidGang")
    return None


def decide(review: Review, default_mode: str = CUDA, quota: bool = True,
           product_of: Callable[[str], str | None] | None = None,
           jobset_of: Callable[[str, str, str], Mapping[str, Any]] | None = None) -> Decision:
    """The admission decision for one request; `default_mode` is the device env mode (devices.py)
    for pods that do not choose one. With `quota`, a placed pod also requests the GPUs it pins
    (quota.py), of the GPU type `product_of(node)` names (None: unknown, the total only).
    `jobset_of(namespace, name, uid)`: the JobSet of a JobSet's pod (or WorkloadUnreadable), whose
    completions and gang size the pod gets (workloads.py)."""
    if review.workload is not None:
        return decide_workload(review.workload, quota, product_of)
    if review.pod is None:
        return Decision(True, reason="NotAPodCreate")
    pod = review.pod
    if map_text(pod) is None:
        return Decision(True, reason="NoAnnotation")
    topology = _topology_refusal(pod)
    if topology is not None:
        return topology
    warnings = []
    if spec(pod).get("schedulerName") != SCHEDULER_NAME:
        warnings.append(
            f"pod has the {ANNOTATION} annotation but spec.schedulerName is not {SCHEDULER_NAME!r}:"
            " its node is not enforced"
        )
    written: dict[str, str] = {}  # what the pod's workload adds to it (workloads.py)
    needs = jobset_pod(pod)
    if needs is not None and jobset_of is not None:
        try:
            jobset = jobset_of(needs.namespace, needs.jobset, needs.uid)
            written = jobset_annotations(jobset, needs.replicated_job) or {}
        except WorkloadUnreadable as error:
            return Decision(False, message=f"JobSet {needs.namespace}/{needs.jobset}: {error.message}",
                            reason="JobSetUnreadable", code=503 if error.retry else 404)
        pod = with_annotations(pod, written)
    try:
        mode = device_mode(pod, default_mode)
        pool = pool_of(pod)
        if pool is not None:
            return _decide_pool(review, pod, pool, mode, warnings, written, quota, product_of)
        resolved = resolve(pod)
    except ModeError as error:
        return Decision(False, message=str(error), reason="InvalidDeviceMode")
    except NotPlaceable as why:
        if why.reason == MALFORMED_MAP:
            return Decision(False, message=why.message, reason=why.reason)
        gang = _invalid_gang(pod)
        if gang is not None:
            return gang
        # Still labelled, so bind hears of the pod and can report why it stays Pending.
        return Decision(True, (*annotation_patch(review.pod, written), *label_patch(pod)),
                        (*warnings, f"{SCHEDULER_NAME}: {why.message}; CUDA_VISIBLE_DEVICES not set"),
                        reason=why.reason)
    gang = _invalid_gang(pod)
    if gang is not None:
        return gang
    warnings += [f"{SCHEDULER_NAME}: {message}" for _, message in device_warnings(pod, resolved)]
    # What bind will say (NodeAffinity), known from the node's name alone: said now, not at bind.
    contradiction = node_affinity(pod, resolved.placement.node)
    if contradiction:
        warnings.append(f"{SCHEDULER_NAME}: {contradiction}; the pod will stay Pending")
    wanted = None
    if quota:
        placement = resolved.placement
        wanted = quota_requests(len(placement.devices), product_of(placement.node) if product_of else None)
        try:
            check_not_written(pod, wanted, declared(pod))
        except QuotaDodge as error:
            return Decision(False, message=str(error), reason="QuotaDodge")
    try:
        patch = patch_for(pod, device_env(resolved.placement, mode), claims=mode == DRA, requests=wanted)
    except ClaimError as error:
        return Decision(False, message=str(error), reason="InvalidDRAClaim")
    return Decision(True, (*annotation_patch(review.pod, written), *patch), tuple(warnings), reason="Placed")


def _decide_pool(review: Review, pod: Mapping[str, Any], pool: Pool, mode: str, warnings: list[str],
                 written: Mapping[str, str], quota: bool, product_of: Callable[[str], str | None] | None) -> Decision:
    """A pool pod (a Deployment's): bind chooses its entry when it binds it, so its containers read
    their devices from the annotations the Binding writes; a quota counts it for its map's largest
    entry, as a template is counted (templatecount.py)."""
    gang = _invalid_gang(pod)
    if gang is not None:
        return gang
    if not pool.entries:
        return Decision(False, message=f"the {ANNOTATION} annotation has no entry: a pool needs at least one",
                        reason="EmptyPool")
    wanted = None
    if quota:
        wanted = template_counts(pool.map_text, product_of)
        try:
            check_not_written(pod, wanted, declared(pod))
        except QuotaDodge as error:
            return Decision(False, message=str(error), reason="QuotaDodge")
    claim = None
    if mode == DRA:  # its claim, which bind creates for the entry it gives it: the pod has no name yet
        meta = metadata(pod)
        # named from the request: a re-invocation names the same; an entry naming another claim is refused
        claim = pool_claim_name(str(meta.get("generateName") or meta.get("name") or "pod-"), review.uid)
    try:
        patch = patch_for(pod, pool_device_env(mode), claims=mode == DRA, requests=wanted, claim=claim)
    except ClaimError as error:
        return Decision(False, message=str(error), reason="InvalidDRAClaim")
    return Decision(True, (*annotation_patch(review.pod, written), *patch), tuple(warnings), reason="Pooled")


def _topology_refusal(template: Mapping[str, Any]) -> Decision | None:
    """The refusal of a map beside Kueue's Topology-Aware Scheduling, which chooses the nodes itself."""
    annotations = metadata(template).get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    both = [key for key in TOPOLOGY_ANNOTATIONS if key in annotations]
    if not both or ANNOTATION not in annotations:
        return None
    return Decision(False, message=(
        f"{both[0]} asks Kueue's Topology-Aware Scheduling to choose the pod's node, and {ANNOTATION} pins it:"
        f" the two do not combine. Remove {both[0]} (the map already places each pod) or the map"),
        reason="TopologyAwareScheduling")


def decide_workload(obj: Mapping[str, Any], quota: bool,
                    product_of: Callable[[str], str | None] | None) -> Decision:
    """A workload object created or updated: each pod template with a map declares what its largest
    entry pins (templatecount.py), so that a queue counting templates (Kueue) counts pinned GPUs."""
    for _, template in pod_templates(obj):
        refusal = _topology_refusal(template)
        if refusal is not None:
            return refusal
    warnings = tuple(f"{SCHEDULER_NAME}: {warning}" for warning in gang_never_forms(obj))
    if not quota:
        return Decision(True, (), warnings, reason="QuotaOff")
    patch = workload_patch(obj, product_of)
    return Decision(True, tuple(patch), warnings, reason="TemplateCounted" if patch else "NoTemplateChange")


def gang_never_forms(obj: Mapping[str, Any]) -> list[str]:
    """Why a workload's gang would wait for good: its controller creates some members only once
    others are Ready, and a gang binds none before all exist (docs/usage.md)."""
    spec_ = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    gang = any(metadata(t).get("annotations", {}).get(GANG_ANNOTATION) not in (None, "false")
               for _, t in pod_templates(obj) if isinstance(metadata(t).get("annotations"), Mapping))
    if not gang:
        return []
    kind = obj.get("kind")
    if kind == "LeaderWorkerSet" and spec_.get("startupPolicy") == "LeaderReady":
        return ["startupPolicy LeaderReady creates a group's workers only once its leader is Ready, and"
                f" {GANG_ANNOTATION} places none of the group before all exist: the group would wait for good;"
                " use startupPolicy LeaderCreated (the default), or no gang"]
    if kind == "JobSet":
        startup = spec_.get("startupPolicy") if isinstance(spec_.get("startupPolicy"), Mapping) else {}
        jobs = spec_.get("replicatedJobs") if isinstance(spec_.get("replicatedJobs"), list) else []
        if startup.get("startupPolicyOrder") == "InOrder" or any(isinstance(j, Mapping) and j.get("dependsOn")
                                                                  for j in jobs):
            return ["startupPolicy InOrder (or dependsOn) creates a replicated job only once another is ready, and"
                    f" {GANG_ANNOTATION} places none of the JobSet before all exist: it would wait for good;"
                    " use AnyOrder without dependsOn, or no gang"]
    return []


def response_for(review: Review, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview answering `review`, in the API version it was asked in."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": decision.allowed}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(decision.patch)).encode()).decode()
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if not decision.allowed:
        response["status"] = {"code": decision.code, "reason": STATUS_REASONS.get(decision.code, "BadRequest"),
                              "message": decision.message}
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


def admission_response(body: Any, default_mode: str = CUDA, quota: bool = True,
                       product_of: Callable[[str], str | None] | None = None) -> tuple[dict[str, Any], Decision]:
    """Decoded request body -> (AdmissionReview response, decision), or ReviewError."""
    review = parse_review(body)
    decision = decide(review, default_mode, quota, product_of)
    return response_for(review, decision), decision
