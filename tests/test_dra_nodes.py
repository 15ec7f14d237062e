"""Real DRA on the four real nodes: each runs Kubernetes' own DRA test driver as its kubelet
plugin (localcp/nodes.py), and its containerd 1.7 applies the driver's CDI specs.

A claim here is allocated and reserved by hand, as a scheduler does (a status update of
resourceclaims/status: allocation.devices.results and nodeSelector, reservedFor the pod), and the
pod bound with pods/binding: the kubelet prepares the claim through the driver, and the container
sees what the driver injected for it. Then what kube-controller-manager's resourceclaim controller
does with a claim whose pod is gone: it drops the pod from reservedFor, and clears the allocation
(and its finalizer) only when the claim carries resource.kubernetes.io/delete-protection, the
finalizer kube-scheduler adds when it allocates; without it the claim stays allocated."""
from __future__ import annotations

import json
import urllib.error

import pytest

from localcp import images
from localcp.nodes import DRA_DRIVER, GPUS
from localcp.stack import LocalStack

pytestmark = pytest.mark.controlplane

RESOURCE = "/apis/resource.k8s.io/v1"
FINALIZER = "resource.kubernetes.io/delete-protection"  # resourceapi.Finalizer
DEVICES = [f"device-{i:02d}" for i in range(int(GPUS))]


@pytest.fixture(scope="module")
def dra_stack():
    """Real nodes without the webhook and the event source: nothing here goes through bind."""
    with LocalStack(real_nodes=True, webhook=False, event_source=False) as running:
        yield running


@pytest.fixture
def ns(dra_stack, request) -> str:
    return dra_stack.create_namespace(request.node.name.lower().replace("_", "-")[:50].rstrip("-"))


def claim(namespace: str, name: str, finalizers: tuple[str, ...] = ()) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "finalizers": list(finalizers)},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER}}]}}}


def env_printer(namespace: str, claims: dict[str, str]) -> dict:
    """A pod (the check image, unscheduled: no scheduler serves `manual`) whose container logs its
    claim_* environment as one JSON line, with one ResourceClaim per pod-level name."""
    code = ("import json, os, time; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith('claim_')}, sort_keys=True), flush=True); time.sleep(3600)")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra", "namespace": namespace},
            "spec": {"schedulerName": "manual", "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": ref, "resourceClaimName": name} for ref, name in claims.items()],
                     "containers": [{"name": "c", "image": images.image_name_in_manifest(),
                                     "imagePullPolicy": "IfNotPresent", "command": ["python", "-c", code],
                                     "resources": {"claims": [{"name": ref} for ref in claims]}}]}}


def get(stack: LocalStack, path: str) -> dict | None:
    try:
        return json.loads(stack.cp.get(path))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def allocate_and_reserve(stack: LocalStack, namespace: str, name: str, node: str, device: str, pod: dict) -> dict:
    """What a scheduler writes into the claim's status: the device, the node it is reachable
    from, and the pod that uses it."""
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"
    current = get(stack, path)
    current["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRA_DRIVER, "pool": node, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]}
    return json.loads(stack.cp.request("PUT", f"{path}/status", current))


def bind(stack: LocalStack, pod: dict, node: str) -> None:
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    stack.cp.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


def test_each_node_publishes_its_devices_in_a_resource_slice(dra_stack):
    assert ({n: sorted(d) for n, d in dra_stack.nodes.resource_slices().items()} ==
            {n: DEVICES for n in dra_stack.nodes.nodes})
    slices = json.loads(dra_stack.cp.get(f"{RESOURCE}/resourceslices"))["items"]
    for item in slices:
        spec = item["spec"]
        # One pool per node, named after it; the devices carry names only: no attributes, no
        # capacity (the test driver has no flag for either).
        assert spec["pool"]["name"] == spec["nodeName"]
        assert item["metadata"]["ownerReferences"][0]["kind"] == "Node"
        assert all(set(device) == {"name"} for device in spec["devices"])
    device_class = get(dra_stack, f"{RESOURCE}/deviceclasses/{DRA_DRIVER}")
    assert device_class["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]


def test_a_claim_allocated_and_reserved_by_hand_runs_with_what_the_driver_injected(dra_stack, ns):
    stack, node = dra_stack, dra_stack.nodes["node3"]
    claims = f"{RESOURCE}/namespaces/{ns}/resourceclaims"
    # gpu-a as kube-scheduler leaves a claim it allocated (with the delete-protection finalizer),
    # gpu-b without it.
    stack.cp.request("POST", claims, claim(ns, "gpu-a", (FINALIZER,)))
    stack.cp.request("POST", claims, claim(ns, "gpu-b"))
    pod = json.loads(stack.cp.request("POST", f"/api/v1/namespaces/{ns}/pods",
                                      env_printer(ns, {"first": "gpu-a", "second": "gpu-b"})))
    allocate_and_reserve(stack, ns, "gpu-a", "node3", "device-02", pod)
    allocate_and_reserve(stack, ns, "gpu-b", "node3", "device-03", pod)
    bind(stack, pod, "node3")

    def running():
        current = get(stack, f"/api/v1/namespaces/{ns}/pods/dra")
        return current if current["status"].get("phase") == "Running" else None
    try:
        stack.wait_for(running, 60, "the pod Running on node3")
    except TimeoutError:
        events = stack.cp.kubectl("get", "events", "-n", ns, check=False).stdout
        pytest.fail(f"not Running:\n{events}\n{stack.cp.log_tail(node.kubelet, 20)}")
    logged = stack.wait_for(lambda: stack.cp.kubectl("logs", "-n", ns, "dra", check=False).stdout.strip(),
                            20, "the env line")
    # claim_<claim>_<request>, non-alphanumerics as _: for its own claims, and nothing else.
    assert json.loads(logged) == {"claim_gpu_a_gpu": "true", "claim_gpu_b_gpu": "true"}
    # Prepared through CDI: one spec per claim and request in node3's CDI directory.
    specs = sorted(p.name for p in (node.dir / "cdi").iterdir())
    uids = {name: get(stack, f"{claims}/{name}")["metadata"]["uid"] for name in ("gpu-a", "gpu-b")}
    assert specs == sorted(f"{DRA_DRIVER}-{uid}-gpu.json" for uid in uids.values())
    spec = json.loads((node.dir / "cdi" / f"{DRA_DRIVER}-{uids['gpu-a']}-gpu.json").read_text())
    assert spec["kind"] == f"{DRA_DRIVER}/test"
    assert spec["devices"] == [{"name": f"claim-{uids['gpu-a']}-gpu",
                                "containerEdits": {"env": ["claim_gpu_a_gpu=true"]}}]

    # The pod goes: the kubelet unprepares (the specs are removed), and the resourceclaim
    # controller of kube-controller-manager drops it from both claims' reservedFor.
    stack.cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/dra")
    stack.wait_for(lambda: get(stack, f"/api/v1/namespaces/{ns}/pods/dra") is None, 60, "the pod gone")
    stack.wait_for(lambda: not any((node.dir / "cdi").iterdir()), 30, "the CDI specs removed")

    def released(name):
        current = get(stack, f"{claims}/{name}")
        return current if not current.get("status", {}).get("reservedFor") else None
    protected, plain = (stack.wait_for(lambda: released(n), 30, f"{n} released") for n in ("gpu-a", "gpu-b"))
    # With the finalizer: deallocated, and the finalizer removed.
    assert "allocation" not in protected["status"]
    protected = stack.wait_for(lambda: (c := get(stack, f"{claims}/gpu-a")) and not c["metadata"].get("finalizers") and c,
                               30, "gpu-a's finalizer removed")
    assert "allocation" not in protected["status"]
    # Without it: still allocated to device-03, for whoever reserves it next.
    assert plain["status"]["allocation"]["devices"]["results"][0]["device"] == "device-03"
    assert not plain["metadata"].get("finalizers")
