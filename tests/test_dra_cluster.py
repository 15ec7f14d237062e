"""DRA mode against the real API server (no kubelets needed): mutate gives the pod its claim
entry, bind creates the ResourceClaim, adds the finalizer, allocates and reserves it in one status
update, and binds the pod; a device allocated in another claim keeps a pod Pending with that
claim named. The API server validates every body bind writes (resource.k8s.io/v1)."""
from __future__ import annotations

import pytest
from kubeapi.errors import APIError

from gpu_scheduler.plugins.dynamicresources.allocator import FINALIZER
from kubeapi.client import Kube
from kubeapi.kubeconfig import from_kubeconfig
from test_end_to_end import pod_manifest

NVIDIA = "gpu.nvidia.com"
RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture
def admin(stack) -> Kube:
    return Kube(from_kubeconfig(str(stack.cp.kubeconfig)))


@pytest.fixture
def gpus_on_node3(admin, stack, namespace):
    """node3 publishes gpu-0..gpu-3 as NVIDIA's DRA driver names them. Afterwards the test's pods are
    removed at once (node3 has no kubelet to finish a graceful deletion) and its claims with them, so
    that no allocation outlives the test and holds a device the next test wants."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node3-gpu-test"},
            "spec": {"driver": NVIDIA, "nodeName": "node3",
                     "pool": {"name": "node3", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(4)]}}
    admin._call("POST", f"{RESOURCE}/resourceslices", body)
    yield body
    stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    stack.cp.kubectl("delete", "resourceclaims", "--all", "-n", namespace, "--wait=false")
    stack.wait_for(lambda: not admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"], 60,
                   "the test's claims gone")
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
    with pytest.raises(APIError) as missing:  # refused before anything was written for it
        admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/p-2-gpus")
    assert missing.value.status == 404


# -- side by side with kube-scheduler's DRA allocator (its DynamicResources plugin, 1.34) ------------
@pytest.fixture
def nvidia_class(admin):
    """The DeviceClass kube-scheduler needs to allocate a claim of class gpu.nvidia.com (bind does not
    read classes: its rule names the driver)."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NVIDIA},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NVIDIA}"'}}]}}
    try:
        admin._call("POST", f"{RESOURCE}/deviceclasses", body)
    except APIError as error:
        if error.status != 409:
            raise
    yield NVIDIA


def user_claim(namespace: str, name: str, cel: str | None = None) -> dict:
    exactly = {"deviceClassName": NVIDIA, "allocationMode": "ExactCount", "count": 1}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def kube_scheduler_pod(namespace: str, name: str, claim: str) -> dict:
    """A pod of the default scheduler (kube-scheduler) using `claim`, kept to node3 (the only node
    with slices here)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "node3"},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "c", "image": "registry.invalid/none",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def allocated_devices(admin, namespace: str, claim: str) -> list[str]:
    try:
        body = admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")
    except APIError as error:
        if error.status == 404:  # not created yet
            return []
        raise
    results = (((body.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def kube_scheduler_allocates(stack, admin, namespace: str, claim: dict) -> list[str]:
    admin._call("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim)
    name = claim["metadata"]["name"]
    stack.apply(kube_scheduler_pod(namespace, f"ks-{name}", name))
    return stack.wait_for(lambda: allocated_devices(admin, namespace, name), 60, f"kube-scheduler allocating {name}")


def test_kube_scheduler_allocates_what_bind_allocates_for_the_same_device(stack, namespace, admin, gpus_on_node3,
                                                                           nvidia_class):
    """For each device of node3: bind's claim for map entry i, and a claim whose CEL selector names
    the same device (index i) allocated by kube-scheduler: the same driver, pool and device. Each
    pair in its own namespace-local names; bind's pod first, then it is deleted and its claim freed."""
    for index in range(4):
        pod = f"b{index}-{index}"
        stack.apply(dra_pod(namespace, pod, f"{index}=node3:{index}\n"))
        try:
            stack.wait_for(lambda: allocated_devices(admin, namespace, f"{pod}-gpus"), 60, "bind allocating")
        except TimeoutError as timeout:  # say what bind said
            conditions = stack.api.read_namespaced_pod(pod, namespace).status.conditions or []
            raise AssertionError(f"{timeout}: {[(c.reason, c.message) for c in conditions]}\n"
                                 + stack.cp.log_tail("bind", 3000)) from None
        by_bind = allocated_devices(admin, namespace, f"{pod}-gpus")
        # No kubelet here to confirm a graceful deletion: removed at once, as a node's kubelet would.
        stack.cp.kubectl("delete", "pod", "-n", namespace, pod, "--grace-period=0", "--force")
        stack.wait_for(lambda: not any(c["metadata"]["name"] == f"{pod}-gpus" for c in admin._call(
            "GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]), 60, "bind's claim gone with its pod")
        by_kube_scheduler = kube_scheduler_allocates(
            stack, admin, namespace, user_claim(namespace, f"ks{index}", f'device.attributes["{NVIDIA}"].index == {index}'))
        assert by_bind == by_kube_scheduler == [f"{NVIDIA}/node3/gpu-{index}"]


def test_kube_scheduler_gives_a_device_bind_did_not_allocate(stack, namespace, admin, gpus_on_node3, nvidia_class):
    stack.apply(dra_pod(namespace, "b-1", "1=node3:0,1,3\n"))
    stack.wait_bound(namespace, 1)
    assert kube_scheduler_allocates(stack, admin, namespace, user_claim(namespace, "any")) == [f"{NVIDIA}/node3/gpu-2"]


def test_bind_refuses_a_device_kube_scheduler_allocated_naming_the_claim(stack, namespace, admin, gpus_on_node3,
                                                                         nvidia_class):
    assert kube_scheduler_allocates(stack, admin, namespace, user_claim(
        namespace, "theirs", f'device.attributes["{NVIDIA}"].index == 1')) == [f"{NVIDIA}/node3/gpu-1"]
    stack.apply(dra_pod(namespace, "b-0", "0=node3:1\n"))

    def refused():
        pod = stack.api.read_namespaced_pod("b-0", namespace)
        return next((c.message for c in pod.status.conditions or []
                     if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

    message = stack.wait_for(refused, 30, "bind refusing")
    assert message.endswith(f"map entry 0=node3:1: device 1 ({NVIDIA}/node3/gpu-1) is allocated in ResourceClaim"
                            f" {namespace}/theirs")
    assert not stack.api.read_namespaced_pod("b-0", namespace).spec.node_name


def test_a_deployments_pods_take_entries_of_a_pool_each_with_its_claim_allocated_for_its_entry(
        stack, namespace, admin, gpus_on_node3):
    """A pool in DRA mode: the pods have no name at admission, so mutate names each claim from the
    pod's generateName and the admission request; bind gives each pod a free entry, creates its claim
    for that entry's devices, allocates and reserves it, and binds the pod."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve", "namespace": namespace},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "serve"}},
                           "template": {"metadata": {"labels": {"app": "serve"}, "annotations": {
                               "gpu-scheduling-map": "0=node3:1\n1=node3:2\n", "gpu-scheduler/device-env": "dra"}},
                               "spec": {"schedulerName": "gpu-scheduler", "terminationGracePeriodSeconds": 0,
                                        "containers": [{"name": "c", "image": "busybox"}]}}}}
    stack.apply(deployment)
    try:
        pods = stack.wait_bound(namespace, 2, "app=serve")
        given = {}
        for pod in pods:
            [ref] = pod["spec"]["resourceClaims"]
            assert ref["name"] == "gpu-scheduler" and ref["resourceClaimName"].startswith(pod["metadata"]["generateName"])
            entry = pod["metadata"]["annotations"]["gpu-scheduler/entry"]
            claim = admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{ref['resourceClaimName']}")
            [result] = claim["status"]["allocation"]["devices"]["results"]
            given[entry] = result["device"]
            assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": pod["metadata"]["name"],
                                                       "uid": pod["metadata"]["uid"]}]
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            assert env["CUDA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.annotations['gpu-scheduler/device-ordinals']"
            assert pod["metadata"]["annotations"]["gpu-scheduler/device-ordinals"] == "0"
        assert given == {"0": "gpu-1", "1": "gpu-2"}
    finally:
        stack.cp.kubectl("delete", "deployment", "serve", "-n", namespace, "--cascade=foreground", "--wait=false")
        stack.cp.kubectl("delete", "replicasets", "--all", "-n", namespace, "--wait=false")
