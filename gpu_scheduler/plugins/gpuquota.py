"""GPUQuota: where a ResourceQuota of the pod's namespace counts pinned GPUs, the pod's counted
GPUs cover what its map entry pins on the node (quota.py).

The namespace's ResourceQuota itself is enforced by the API server when the pod is created, with
its own message: a pod over quota never exists, so there is nothing for bind to refuse for it.
What the API server cannot see is a pod whose count no longer matches what bind would give it:
its map annotation edited after creation to name more GPUs, the annotation and label added to a
pod created without them (the webhook only sees creations), or a node whose GPU type was not known
when the pod was created. Where a ResourceQuota of the pod's namespace counts a resource the pod
requests less of than its entry pins now (quota.quotas_counting: in its spec.hard, and its scopes
match the pod), bind refuses the pod here, so that pinning cannot walk around the count; the fix
named is the one that works for that pod: a controller's pod is deleted (its controller creates it
again, counted), a bare pod re-created. Where no quota counts it, the shortfall bounds nothing and
the pod is placed: a pod is never stranded for a quota that does not exist.

The quotas are the snapshot's (bind's ResourceQuota watch; explain's and plan's listing); a
snapshot without them (None: not read) is taken to have a quota counting every resource.

A pod not created yet (`plan` of a manifest: no uid) is not checked: mutate will count it.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..framework.events import NODE_UPDATE, POD_UPDATE, QUOTA_ADD, QUOTA_DELETE, QUOTA_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, inputs, unresolvable
from ..placement import metadata
from ..quota import PRODUCT_LABEL, counted, quota_requests, quotas_counting
from .mapentry import resolved

NAME = "GPUQuota"
NOT_COUNTED = "NotCountedForQuota"
CONTROLLER_FIX = "delete it, and its controller creates it again, counted"
BARE_FIX = "re-create it (delete it and create it again: gpu-scheduler's webhook counts it when it is created)"


def controller_of(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller's ownerReference (controller: true), or None for a bare pod."""
    refs = metadata(pod).get("ownerReferences")
    return next((ref for ref in refs if isinstance(ref, dict) and ref.get("controller") is True), None) \
        if isinstance(refs, list) else None


def fix_for(pod: Mapping[str, Any]) -> str:
    """What makes the pod counted again: what works for a controller's pod does not for a bare one."""
    return CONTROLLER_FIX if controller_of(pod) is not None else BARE_FIX


def uncounted(pod: Mapping[str, Any], devices: int, node: Mapping[str, Any],
              quotas: list[Mapping[str, Any]] | None = None) -> str | None:
    """Why the pod's quota requests fall short of `devices` GPUs on `node` where one of `quotas`
    (its namespace's; None: not known, any may) counts them, naming the fix; None if they do not."""
    labels = metadata(node).get("labels")
    product = labels.get(PRODUCT_LABEL) if isinstance(labels, dict) else None
    has = counted(pod)
    short = []
    for name, n in quota_requests(devices, product).items():
        if has.get(name, 0) >= int(n):
            continue
        by = ["?"] if quotas is None else quotas_counting(quotas, pod, name)
        if by:
            short.append((name, int(n), has.get(name, 0), by))
    if not short:
        return None
    listed = ", ".join(f"{name}: {want} (it requests {got})" for name, want, got, _ in short)
    names = sorted({q for *_, by in short for q in by if q != "?"})
    which = (f", which ResourceQuota {names[0]} bounds" if len(names) == 1 else
             f", which ResourceQuotas {', '.join(names)} bound" if names else "")
    return (f"its map entry pins {devices} GPU(s) on node {metadata(node).get('name')}, counted for the namespace's"
            f" ResourceQuota as {listed}{which}; the pod was created with less (its map annotation changed since,"
            " it was created without gpu-scheduler's webhook, or the node's GPU type was not known then):"
            f" {fix_for(pod)}")


class GPUQuota(FilterPlugin):
    name = NAME
    # The node's GPU type label removed or changed; the pod itself cannot change its requests, but
    # its map can (to pin fewer); a quota of its namespace deleted or changed counts it no more.
    # Added: registered too, as kube-scheduler registers each kind its filter reads (a refusal is
    # always decided on the quotas as they are then).
    events = frozenset({NODE_UPDATE, POD_UPDATE, QUOTA_ADD, QUOTA_UPDATE, QUOTA_DELETE})

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def filter(self, state, pod, node):
        mine = inputs(state, pod)
        if not self.enabled or not mine.uid:
            return SUCCESS
        quotas = None if node.quotas is None else list(node.quotas.get(mine.namespace, ()))
        problem = uncounted(pod, len(resolved(state).placement.devices), node.node, quotas)
        return unresolvable(NAME, problem, NOT_COUNTED) if problem else SUCCESS
