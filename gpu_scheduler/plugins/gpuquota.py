"""GPUQuota: the pod's counted GPUs cover what its map entry pins on the node (quota.py).

The namespace's ResourceQuota itself is enforced by the API server when the pod is created, with
its own message: a pod over quota never exists, so there is nothing for bind to refuse for it.
What the API server cannot see is a pod whose count no longer matches what bind would give it:
its map annotation edited after creation to name more GPUs, the annotation and label added to a
pod created without them (the webhook only sees creations), or a node whose GPU type was not known
when the pod was created. bind refuses those here, so that pinning cannot walk around the count;
the fix is to delete the pod, and its controller creates it again, counted.

A pod not created yet (`plan` of a manifest: no uid) is not checked: mutate will count it.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..framework.events import NODE_UPDATE, POD_UPDATE
from ..framework.interface import SUCCESS, FilterPlugin, unresolvable
from ..placement import metadata
from ..quota import PRODUCT_LABEL, counted, quota_requests
from .mapentry import resolved

NAME = "GPUQuota"
NOT_COUNTED = "NotCountedForQuota"


def uncounted(pod: Mapping[str, Any], devices: int, node: Mapping[str, Any]) -> str | None:
    """Why the pod's quota requests fall short of `devices` GPUs on `node`, naming the fix; None if they do not."""
    labels = metadata(node).get("labels")
    product = labels.get(PRODUCT_LABEL) if isinstance(labels, dict) else None
    has = counted(pod)
    short = [(name, int(n), has.get(name, 0)) for name, n in quota_requests(devices, product).items()
             if has.get(name, 0) < int(n)]
    if not short:
        return None
    listed = ", ".join(f"{name}: {want} (it requests {got})" for name, want, got in short)
    return (f"its map entry pins {devices} GPU(s) on node {metadata(node).get('name')}, counted for the namespace's"
            f" ResourceQuota as {listed}; the pod was created with less (its map annotation changed since, it was"
            " created without gpu-scheduler's webhook, or the node's GPU type was not known then): delete the pod,"
            " and its controller creates it again, counted")


class GPUQuota(FilterPlugin):
    name = NAME
    # The node's GPU type label removed or changed; the pod itself cannot change its requests.
    events = frozenset({NODE_UPDATE, POD_UPDATE})

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def filter(self, state, pod, node):
        if not self.enabled or not metadata(pod).get("uid"):
            return SUCCESS
        problem = uncounted(pod, len(resolved(state).placement.devices), node.node)
        return unresolvable(NAME, problem, NOT_COUNTED) if problem else SUCCESS
