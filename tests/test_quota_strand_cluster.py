"""Pinned GPUs counted for quotas strand no pod where no quota counts them, on the real
control plane (gpu_scheduler/plugins/gpuquota.py, functions/mutate/nodeproduct.py).

In a namespace without a ResourceQuota, each of these is bound:

- a pod mapped to a node that joins later, already labelled with its GPU type (mutate could not
  know the type when the pod was created: it requests no per-type resource);
- a pod created 2 s after its node was labelled with its GPU type (mutate reads the node as it is
  when the pod is created, not as it was up to 10 s before: it requests the per-type resource);
- a pod whose map was fixed by hand after creation to pin more GPUs than it was counted for (the
  README's advice for a Pending pod).

In a namespace with a quota on pinned GPUs, a pod whose map was edited after creation to pin more
is still refused, with the fix that works for it: a bare pod is re-created, a controller's pod
deleted (its controller creates it again, counted).

Each test has nodes of its own (Node objects without kubelets: bound pods stay Pending)."""
from __future__ import annotations

import json
import time

import pytest

from test_end_to_end import pod_manifest
from test_quota_cluster import GPU, PRODUCT, failed_scheduling_messages, mapped_statefulset, quota
from test_records_cluster import Nodes, own_nodes  # noqa: F401 (a fixture)

pytestmark = pytest.mark.controlplane

H100 = "NVIDIA-H100-80GB-HBM3"
H100_RESOURCE = f"product.gpu-scheduler.io/{H100}"
BOUND_SECONDS = 30  # bind retries a refused pod on its node's events and at least every 60 s


def _pod(stack, namespace: str, name: str) -> dict:
    return json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))


def _bound(stack, namespace: str, name: str) -> str:
    return _pod(stack, namespace, name)["spec"].get("nodeName") or ""


def _wait_bound(stack, namespace: str, name: str, node: str) -> None:
    try:
        stack.wait_for(lambda: _bound(stack, namespace, name) == node, BOUND_SECONDS, f"{name} bound to {node}")
    except Exception:
        print("FailedScheduling:", failed_scheduling_messages(stack, namespace, name))
        raise


def test_a_pod_mapped_to_a_node_that_joins_later_labelled_is_bound_where_no_quota_applies(stack, namespace):
    name = f"late-{namespace}"[:40].rstrip("-")
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "p-0", f"0={name}-0:0"))
    stack.wait_for(lambda: failed_scheduling_messages(stack, namespace, "p-0"), 30, "the pod Pending (no such node)")
    # mutate found no node, so no GPU type: the pod is counted in the total only
    requests = _pod(stack, namespace, "p-0")["spec"]["containers"][0]["resources"]["requests"]
    assert requests.get(GPU) == "1" and H100_RESOURCE not in requests, requests
    nodes = Nodes(stack, name, 1, {PRODUCT: H100})
    try:
        _wait_bound(stack, namespace, "p-0", f"{name}-0")
    finally:
        nodes.remove()


def test_a_pod_created_two_seconds_after_its_node_is_labelled_is_counted_with_its_type_and_bound(
        stack, namespace, own_nodes):
    node, = own_nodes(1)
    # mutate reads the node (no GPU type yet) for the first pod
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "a-0", f"0={node}:0"))
    _wait_bound(stack, namespace, "a-0", node)
    stack.cp.kubectl("label", "node", node, f"{PRODUCT}={H100}")
    time.sleep(2)
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "b-0", f"0={node}:1"))
    _wait_bound(stack, namespace, "b-0", node)
    requests = _pod(stack, namespace, "b-0")["spec"]["containers"][0]["resources"]["requests"]
    assert requests.get(GPU) == "1" and requests.get(H100_RESOURCE) == "1", requests


def test_a_pods_map_fixed_by_hand_to_pin_more_gpus_is_bound_where_no_quota_applies(stack, namespace, own_nodes):
    node, = own_nodes(1, **{PRODUCT: H100})
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "x-0", f"0={node}:9"))  # no device 9
    stack.wait_for(lambda: failed_scheduling_messages(stack, namespace, "x-0"), 30, "the pod Pending (no device 9)")
    stack.api.patch_namespaced_pod("x-0", namespace, {"metadata": {"annotations": {"gpu-scheduling-map": f"0={node}:0,1"}}})
    _wait_bound(stack, namespace, "x-0", node)
    assert not [m for m in failed_scheduling_messages(stack, namespace, "x-0") if "ResourceQuota" in m]


def test_where_a_quota_counts_pinned_gpus_an_edited_map_is_still_refused_with_the_fix_for_the_pod(
        stack, namespace, own_nodes):
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "10"})
    # a bare pod and a StatefulSet's, both Pending on a node that does not exist, counted for 1 GPU
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "x-0", f"0=missing-{node}:0"))
    stack.apply(mapped_statefulset(namespace, [f"missing-{node}:1"]))
    for pod in ("x-0", "train-0"):
        stack.wait_for(lambda p=pod: failed_scheduling_messages(stack, namespace, p), 30, f"{pod} Pending (no such node)")
        stack.api.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {
            "gpu-scheduling-map": f"0={node}:0,1,2,3"}}})

    def refused(pod):
        return [m for m in failed_scheduling_messages(stack, namespace, pod) if "pins 4 GPU(s)" in m]
    [bare] = stack.wait_for(lambda: refused("x-0"), 30, "GPUQuota's refusal of the bare pod")
    assert f"counted for the namespace's ResourceQuota as {GPU}: 4 (it requests 1)" in bare, bare
    assert "ResourceQuota gpus" in bare and "re-create it" in bare, bare
    assert "its controller" not in bare, bare
    [owned] = stack.wait_for(lambda: refused("train-0"), 30, "GPUQuota's refusal of the StatefulSet's pod")
    assert "delete it, and its controller creates it again, counted" in owned, owned
    assert not _bound(stack, namespace, "x-0") and not _bound(stack, namespace, "train-0")
