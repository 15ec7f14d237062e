"""DRA mode end to end on the four real nodes: the webhook, the event source, bind, and Kubernetes'
own DRA test driver as each node's kubelet plugin (containerd 1.7 with CDI). A StatefulSet in DRA
mode: every replica Running with what the driver injected for its own claim, each claim allocated
on the map's node to exactly the map's devices and reserved for its pod; then kube-scheduler beside
bind, on the same node and driver.

The test driver publishes names only (device-00..device-03, no attributes), so the map index is
matched by the name rule `device-{index:02d}`; a CEL selector cannot name one of its devices. The
same-device comparison with kube-scheduler's allocator, which needs a selector naming the device,
runs on NVIDIA-like slices in test_dra_cluster.py."""
from __future__ import annotations

import json
import re

import pytest

from conftest import release_namespace
from localcp.nodes import DRA_DRIVER
from tests.test_end_to_end import statefulset
from tests.test_nodes import logged, running

pytestmark = pytest.mark.controlplane

RESOURCE = "/apis/resource.k8s.io/v1"
# The seed's map, but index 4 on device 2 of node4: a device belongs to one claim, and the seed
# gives node4's device 3 to index 3 and 4 (env mode shares it with a warning; DRA mode cannot).
DRA_MAP = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:2\n"
WANTED = {0: ("node1", ["0", "1"]), 1: ("node2", ["2"]), 2: ("node3", ["0", "1", "2"]), 3: ("node4", ["3"]),
          4: ("node4", ["2"])}


@pytest.fixture
def ns(real_stack, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"dra-{request.node.name.lower()}")[:40].strip("-")
    yield real_stack.create_namespace(name)
    release_namespace(real_stack, name)


def claim(stack, namespace: str, name: str) -> dict:
    return json.loads(stack.cp.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"))


def dra_statefulset(namespace: str) -> dict:
    manifest = statefulset(namespace, DRA_MAP)
    annotations = manifest["spec"]["template"]["metadata"]["annotations"]
    annotations["gpu-scheduler/device-env"] = "dra"
    annotations["gpu-scheduler/device-class"] = DRA_DRIVER
    return manifest


def test_each_replica_runs_with_the_driver_prepared_claim_of_exactly_its_devices(real_stack, ns):
    real_stack.apply(dra_statefulset(ns))
    pods = real_stack.wait_for(lambda: running(real_stack, ns, 5), 120, "5 DRA check pods Running")
    for pod in pods:
        name = pod["metadata"]["name"]
        index = int(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"])
        node, devices = WANTED[index]
        assert pod["spec"]["nodeName"] == node
        body = claim(real_stack, ns, f"{name}-gpus")
        results = body["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [
            (DRA_DRIVER, node, f"device-{int(d):02d}") for d in devices]
        assert body["status"]["reservedFor"] == [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]
        # What the container sees: the renumbered CUDA_VISIBLE_DEVICES from mutate, and from the
        # driver (CDI) one variable per request of its own claim: claim_<claim>_<request>.
        injected = " ".join(sorted(f"claim_{name}-gpus_gpu-{int(d)}".replace("-", "_") + "=true" for d in devices))
        assert logged(real_stack, ns, name) == (f"node={node} CUDA_VISIBLE_DEVICES="
                                                f"{','.join(str(i) for i in range(len(devices)))} {injected}")


def test_kube_scheduler_and_bind_never_give_one_device_twice_on_the_same_node(real_stack, ns):
    """bind allocates device-02 and device-03 of node4; a pod of the default scheduler asking for
    any device of the driver on node4 is given device-00 or device-01 by kube-scheduler, and runs
    with its own claim prepared; a DRA pod whose entry names that device is then refused by bind."""
    real_stack.apply(dra_statefulset(ns))
    real_stack.wait_for(lambda: running(real_stack, ns, 5), 120, "5 DRA check pods Running")
    real_stack.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": "any-gpu", "namespace": ns},
                      "spec": {"spec": {"devices": {"requests": [
                          {"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER}}]}}}})
    template = statefulset(ns)["spec"]["template"]
    template["spec"].pop("schedulerName")
    template["metadata"]["annotations"] = {}
    template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node4"}
    template["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "any-gpu"}]
    template["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    real_stack.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "theirs", "namespace": ns,
                                                                      "labels": {"app": "theirs"}},
                      "spec": template["spec"]})
    [pod] = real_stack.wait_for(lambda: running(real_stack, ns, 1, "app=theirs"), 90, "kube-scheduler's pod Running")
    [status] = pod["status"]["resourceClaimStatuses"]
    body = claim(real_stack, ns, status["resourceClaimName"])
    [result] = body["status"]["allocation"]["devices"]["results"]
    assert pod["spec"]["nodeName"] == "node4" and result["pool"] == "node4"
    assert result["device"] in ("device-00", "device-01")  # not bind's device-02 or device-03
    assert "claim_" in logged(real_stack, ns, "theirs")

    # And the other way: a DRA pod whose entry names the device kube-scheduler gave is refused,
    # naming that claim, and nothing is written for it.
    index = int(result["device"][-2:])
    mine = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "late-0", "namespace": ns,
                         "annotations": {"gpu-scheduling-map": f"0=node4:{index}\n",
                                         "gpu-scheduler/device-env": "dra",
                                         "gpu-scheduler/device-class": DRA_DRIVER}},
            "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "registry.invalid/none"}]}}
    real_stack.apply(mine)

    def refused():
        pod = json.loads(real_stack.cp.get(f"/api/v1/namespaces/{ns}/pods/late-0"))
        return next((c["message"] for c in pod["status"].get("conditions", [])
                     if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"), None)

    message = real_stack.wait_for(refused, 30, "bind refusing late-0")
    assert message.endswith(f"map entry 0=node4:{index}: device {index} ({DRA_DRIVER}/node4/{result['device']}) is"
                            f" allocated in ResourceClaim {ns}/{status['resourceClaimName']}")
