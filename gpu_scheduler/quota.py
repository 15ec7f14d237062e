"""Quotas: the GPUs a pinned pod takes, as extended-resource requests a ResourceQuota counts.

A ResourceQuota counts `requests.<extended resource>` for any extended resource, and the API
server checks it when it stores the pod: atomically, with its own message (resource, used,
hard). So mutate gives each pod it places a request (and the equal limit: extended resources
may not be overcommitted) of

- `gpu-scheduler.io/gpu`: the number of devices of the pod's map entry, and
- `product.gpu-scheduler.io/<product>`: the same number, where <product> is the node's
  `nvidia.com/gpu.product` label made a valid resource name (per GPU type).

A GPU shared by several pods (gpu-scheduler/share-gpus) counts once per pod that holds it: each
pod asked for it. Pure: no I/O; mutate reads the node's label and hands it in.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .shapes import as_map as _map
from .shapes import as_maps as _list

GPU_RESOURCE = "gpu-scheduler.io/gpu"
PRODUCT_PREFIX = "product.gpu-scheduler.io/"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# What bind advertises per node for these resources (node status capacity): the kubelet admits a
# pod only if its node has the extended resources it requests. Not a count of GPUs (GPUsHeld and
# NodeGPUCapacity check those); large enough never to be what refuses a pod.
ADVERTISED = "100000"
_NAME_MAX = 63  # the name part of a qualified name (the resource's name after its prefix)
_INVALID = re.compile(r"[^A-Za-z0-9._-]+")


def product_resource(product: str | None) -> str | None:
    """The resource counting GPUs of the GPU type `product` (a node's nvidia.com/gpu.product),
    or None without a usable product. Characters a resource name may not hold become '-', and
    it starts and ends with a letter or digit: "Tesla T4" -> product.gpu-scheduler.io/Tesla-T4."""
    if not isinstance(product, str):
        return None
    name = _INVALID.sub("-", product)[:_NAME_MAX].strip("-._")
    return PRODUCT_PREFIX + name if name else None


def is_quota_resource(name: str) -> bool:
    """One of the resources mutate sets for quotas (never a resource a node really has)."""
    return name == GPU_RESOURCE or name.startswith(PRODUCT_PREFIX)


def quota_requests(devices: int, product: str | None) -> dict[str, str]:
    """The requests (and limits) a pod holding `devices` GPUs of type `product` carries."""
    wanted = {GPU_RESOURCE: str(devices)}
    resource = product_resource(product)
    if resource:
        wanted[resource] = str(devices)
    return wanted


class QuotaDodge(ValueError):
    """A pod that names the quota resources itself, other than as mutate would."""


def _written(pod: Mapping[str, Any]) -> list[tuple[str, int, str, str, Any]]:
    """(field, container index, requests|limits, resource, value) of every quota resource the pod names."""
    found = []
    spec = _map(pod.get("spec"))
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            resources = _map(_map(container).get("resources"))
            for kind in ("requests", "limits"):
                for name, value in _map(resources.get(kind)).items():
                    if isinstance(name, str) and is_quota_resource(name):
                        found.append((field, i, kind, name, value))
    for kind in ("requests", "limits"):  # pod-level resources (1.34 beta)
        for name, value in _map(_map(spec.get("resources")).get(kind)).items():
            if isinstance(name, str) and is_quota_resource(name):
                found.append(("resources", -1, kind, name, value))
    return found


def check_not_written(pod: Mapping[str, Any], wanted: Mapping[str, str],
                      declared: Mapping[str, str] | None = None) -> None:
    """QuotaDodge unless every quota resource the pod names is one mutate sets, in the first
    container, with mutate's value: the pod's own (the pod mutate already patched: reinvocation),
    or `declared`, what mutate wrote on the template the pod was made from (templatecount.py)."""
    declared = declared or {}
    for field, i, kind, name, value in _written(pod):
        where = f"spec.{field}[{i}].resources.{kind}" if i >= 0 else f"spec.resources.{kind}"
        if field == "containers" and i == 0 and (
                (name in wanted and str(value) == wanted[name]) or (name in declared and str(value) == declared[name])):
            continue
        raise QuotaDodge(
            f"{where} names {name}: {value!r}; gpu-scheduler sets this resource itself, from the pod's map entry"
            f" ({', '.join(f'{k}: {v}' for k, v in wanted.items())}), so that the namespace's ResourceQuota"
            f" counts the GPUs the pod pins: remove it from the pod's template")


def resources_patch(path: str, resources: Any, wanted: Mapping[str, str]) -> list[dict[str, Any]]:
    """JSONPatch operations that make the quota resources of a container's `resources` (at `path`)
    exactly `wanted`, in requests and limits alike (others of ours removed: a template's count for
    another GPU type, templatecount.py), the container's own resources kept; empty when they are so
    already (applying the patch twice, or reinvocation, adds nothing more)."""
    if not isinstance(resources, Mapping):
        return [{"op": "add", "path": path, "value": {"requests": dict(wanted), "limits": dict(wanted)}}]
    ops = []
    for kind in ("requests", "limits"):
        current = resources.get(kind)
        if not isinstance(current, Mapping):
            ops.append({"op": "add", "path": f"{path}/{kind}", "value": dict(wanted)})
            continue
        ops += [{"op": "remove", "path": f"{path}/{kind}/{_escape(name)}"} for name in current
                if isinstance(name, str) and is_quota_resource(name) and name not in wanted]
        ops += [{"op": "add", "path": f"{path}/{kind}/{_escape(name)}", "value": value}
                for name, value in wanted.items() if current.get(name) != value]
    return ops


def counted(pod: Mapping[str, Any]) -> dict[str, int]:
    """The quota resources the pod requests (first container, as mutate sets them), as integers."""
    containers = _list(_map(pod.get("spec")).get("containers"))
    requests = _map(_map(containers[0].get("resources")).get("requests")) if containers else {}
    result = {}
    for name, value in requests.items():
        if isinstance(name, str) and is_quota_resource(name):
            try:
                result[name] = int(str(value))
            except ValueError:
                result[name] = 0
    return result


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def advertisement(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The node status merge patch advertising what a pod pinned to `node` requests for quotas
    (ADVERTISED of gpu-scheduler.io/gpu and of the node's GPU type), in capacity and allocatable,
    or None when the node has it all. Allocatable too: a kubelet copies capacity into allocatable
    itself, a node without one (or before its next status update) would not."""
    metadata = _map(node.get("metadata"))
    wanted = [GPU_RESOURCE]
    product = product_resource(_map(metadata.get("labels")).get(PRODUCT_LABEL))
    if product:
        wanted.append(product)
    status = _map(node.get("status"))
    patch: dict[str, Any] = {}
    for field in ("capacity", "allocatable"):
        have = _map(status.get(field))
        missing = {name: ADVERTISED for name in wanted if have.get(name) != ADVERTISED}
        if missing:
            patch[field] = missing
    return {"status": patch} if patch else None


# -- what plan --cluster and explain show ----------------------------------------------------------
DEVICE_CLASS_SUFFIX = ".deviceclass.resource.k8s.io/devices"  # 1.34's quota on DRA devices per DeviceClass


def is_gpu_quota(resource: str) -> bool:
    """A ResourceQuota entry that bounds GPUs pinned here: ours, per DeviceClass, or nvidia.com/gpu."""
    name = resource.removeprefix("requests.")
    return is_quota_resource(name) or resource.endswith(DEVICE_CLASS_SUFFIX) or name == "nvidia.com/gpu"


def gpu_quotas(quotas: list[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The namespace's quotas on GPUs and their use, one entry per (quota, resource), sorted."""
    found = []
    for quota in quotas:
        name = str(_map(quota.get("metadata")).get("name") or "")
        used = _map(_map(quota.get("status")).get("used"))
        for resource, hard in _map(_map(quota.get("spec")).get("hard")).items():
            if isinstance(resource, str) and is_gpu_quota(resource):
                found.append({"quota": name, "resource": resource, "hard": str(hard), "used": str(used.get(resource, "0"))})
    return sorted(found, key=lambda q: (q["quota"], q["resource"]))


def quota_text(entry: Mapping[str, str]) -> str:
    return f"{entry['quota']}: {entry['resource']} {entry['used']} used of {entry['hard']}"


def with_quota_requests_of(pod: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """`pod` (a manifest's) with the quota requests and limits of `live` (the pod of that name the
    API server holds, which mutate counted) in its first container, in place of its own."""
    containers = list(_map(pod.get("spec")).get("containers") or [])
    if not containers or not isinstance(containers[0], Mapping):
        return dict(pod)
    live_containers = _list(_map(live.get("spec")).get("containers"))
    live_resources = _map(live_containers[0].get("resources")) if live_containers else {}
    resources = dict(_map(containers[0].get("resources")))
    for kind in ("requests", "limits"):
        own = {k: v for k, v in _map(resources.get(kind)).items() if not (isinstance(k, str) and is_quota_resource(k))}
        own.update({k: v for k, v in _map(live_resources.get(kind)).items() if isinstance(k, str) and is_quota_resource(k)})
        resources[kind] = own
    containers[0] = {**containers[0], "resources": resources}
    return {**pod, "spec": {**_map(pod.get("spec")), "containers": containers}}


# -- which ResourceQuotas count a pod's GPUs (bind's GPUQuota) ---------------------------------------
def bounded_by(quota: Mapping[str, Any], resource: str) -> bool:
    """`quota` counts `resource` (one of mutate's: quota_requests' names) in its spec.hard, as
    `requests.<resource>` or as `<resource>` (the API server reads both for a pod's requests)."""
    hard = _map(_map(quota.get("spec")).get("hard"))
    return f"requests.{resource}" in hard or resource in hard


def _best_effort(pod: Mapping[str, Any]) -> bool:
    """The pod's QoS class is BestEffort: no container asks cpu or memory (the API server's rule,
    which extended resources such as mutate's do not change)."""
    spec = _map(pod.get("spec"))
    for field in ("initContainers", "containers"):
        for container in _list(spec.get(field)):
            resources = _map(container.get("resources"))
            for kind in ("requests", "limits"):
                if any(name in ("cpu", "memory") for name in _map(resources.get(kind))):
                    return False
    return True


def _cross_namespace_affinity(pod: Mapping[str, Any]) -> bool:
    affinity = _map(_map(pod.get("spec")).get("affinity"))
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = _map(affinity.get(kind))
        terms = _list(rules.get("requiredDuringSchedulingIgnoredDuringExecution"))
        terms += [_map(t.get("podAffinityTerm")) for t in _list(rules.get("preferredDuringSchedulingIgnoredDuringExecution"))]
        if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms):
            return True
    return False


def _in_scope(scope: str, operator: str, values: list, pod: Mapping[str, Any]) -> bool:
    """One scope of a quota, as the API server's quota evaluator matches a pod to it. A scope this
    does not know matches: the quota is taken to count the pod (never a pod walking around it)."""
    spec = _map(pod.get("spec"))
    if scope == "Terminating":
        return spec.get("activeDeadlineSeconds") is not None
    if scope == "NotTerminating":
        return spec.get("activeDeadlineSeconds") is None
    if scope == "BestEffort":
        return _best_effort(pod)
    if scope == "NotBestEffort":
        return not _best_effort(pod)
    if scope == "CrossNamespacePodAffinity":
        return _cross_namespace_affinity(pod)
    if scope == "PriorityClass":
        name = spec.get("priorityClassName")
        if operator == "Exists":
            return bool(name)
        if operator == "DoesNotExist":
            return not name
        if operator == "In":
            return bool(name) and name in values
        if operator == "NotIn":
            return not name or name not in values
    return True


def applies_to(quota: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """`quota` counts `pod` at all: every one of its scopes (spec.scopes, spec.scopeSelector)
    matches it; a quota without scopes counts every pod of its namespace."""
    spec = _map(quota.get("spec"))
    scopes = [(str(s), "Exists", []) for s in _list_of_str(spec.get("scopes"))]
    for expression in _list(_map(spec.get("scopeSelector")).get("matchExpressions")):
        values = expression.get("values")
        scopes.append((str(expression.get("scopeName")), str(expression.get("operator") or "Exists"),
                       values if isinstance(values, list) else []))
    return all(_in_scope(scope, operator, values, pod) for scope, operator, values in scopes)


def _list_of_str(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def quotas_counting(quotas: list[Mapping[str, Any]], pod: Mapping[str, Any], resource: str) -> list[str]:
    """The names, sorted, of the ResourceQuotas among `quotas` (the pod's namespace's) that count
    `resource` for `pod`."""
    return sorted(str(_map(q.get("metadata")).get("name") or "") for q in quotas
                  if bounded_by(q, resource) and applies_to(q, pod))


def quota_view(quota: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceQuota as GPUQuota reads it: its name and namespace, and its spec (what it counts,
    spec.hard, and for which pods, its scopes); not its use, which changes with every pod."""
    meta = _map(quota.get("metadata"))
    return {"metadata": {"name": str(meta.get("name") or ""), "namespace": str(meta.get("namespace") or "")},
            "spec": _map(quota.get("spec"))}
