"""DRA mode against the real 1.34 API server (no kubelets needed): mutate gives the pod its claim
entry, bind creates the ResourceClaim, adds the finalizer, allocates and reserves it in one status
update, and binds the pod; a device allocated in another claim keeps a pod Pending with that
claim named. The API server validates every body bind writes (resource.k8s.io/v1)."""
from __future__ import annotations

import pytest
from kubernetes import config
from kubernetes.client import Configuration
from kubernetes.client.exceptions import ApiException

from gpu_scheduler.dra import FINALIZER
from kubeapi.client import Kube
from test_end_to_end import pod_manifest

NVIDIA = "gpu.nvidia.com"
RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture
def admin(stack) -> Kube:
    configuration = Configuration()
    config.load_kube_config(config_file=str(stack.cp.kubeconfig), client_configuration=configuration)
    return Kube(configuration)


@pytest.fixture
def gpus_on_node3(admin):
    """node3 publishes gpu-0..gpu-3 as NVIDIA's DRA driver names them."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node3-gpu-test"},
            "spec": {"driver": NVIDIA, "nodeName": "node3",
                     "pool": {"name": "node3", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(4)]}}
    admin._call("POST", f"{RESOURCE}/resourceslices", body)
    yield body
    admin._call("DELETE", f"{RESOURCE}/resourceslices/node3-gpu-test")


def dra_pod(namespace: str, name: str, entry: str) -> dict:
    pod = pod_manifest(namespace, name, entry)
    pod["metadata"]["annotations"]["gpu-scheduler/device-env"] = "dra"
    return pod


def test_a_dra_pod_is_bound_with_its_claim_allocated_and_reserved(stack, namespace, admin, gpus_on_node3):
    stack.apply(dra_pod(namespace, "p-2", "2=node3:1,2"))
    [pod] = stack.wait_bound(namespace, 1)
    assert pod["spec"]["nodeName"] == "node3"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu-scheduler", "resourceClaimName": "p-2-gpus"}]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": "gpu-scheduler"}]
    assert {e["name"]: e["value"] for e in container["env"]} == {"CUDA_VISIBLE_DEVICES": "0,1",
                                                                  "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    claim = admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/p-2-gpus")
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in results] == [
        ("gpu-1", NVIDIA, "node3", "gpu-1"), ("gpu-2", NVIDIA, "node3", "gpu-2")]
    assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node3"]
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "p-2", "uid": pod["metadata"]["uid"]}]


def test_a_device_another_claim_holds_keeps_the_pod_pending_naming_that_claim(stack, namespace, admin, gpus_on_node3):
    theirs = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": "theirs", "namespace": namespace},
              "spec": {"devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": NVIDIA}}]}}}
    theirs = admin._call("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", theirs)
    theirs["status"] = {"allocation": {"devices": {"results": [
        {"request": "one", "driver": NVIDIA, "pool": "node3", "device": "gpu-3"}]}}}
    admin._call("PUT", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/theirs/status", theirs)
    stack.apply(dra_pod(namespace, "p-2", "2=node3:3"))

    def refused():
        pod = stack.api.read_namespaced_pod("p-2", namespace)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return condition.message
        return None

    message = stack.wait_for(refused, what="the pod refused")
    assert f"is allocated in ResourceClaim {namespace}/theirs" in message
    with pytest.raises(ApiException) as missing:  # refused before anything was written for it
        admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/p-2-gpus")
    assert missing.value.status == 404
