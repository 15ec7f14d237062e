"""Quotas on the real control plane: a namespace's ResourceQuota bounds the GPUs its pods pin,
in total and per GPU type, enforced by the API server at pod creation with its own message
(gpu_scheduler/quota.py: mutate's requests; functions/bind/advertiser.py: the nodes advertise them).

- a quota of 2 pinned GPUs: a StatefulSet whose map needs 3 gets 2 replicas and the StatefulSet
  controller's quota refusal for the third; the same StatefulSet in another namespace gets all 3;
- per GPU type: nodes labelled with two products, a quota on one: the replicas on the other type
  are all created, the one past the quota is not;
- deleting a pod frees its share of the quota: the pod refused before is then created;
- shared GPUs count once per pod that holds them; a StatefulSet scaled up gets the replicas that fit;
- DRA mode: bind's claims count for the namespace's device-class quota;
- a pending pod's map edited to pin more than it was counted for is not bound (GPUQuota);
- plan --cluster and explain show the quota and its use.

Each test has nodes of its own (Node objects without kubelets: pods are bound and stay Pending;
tests/test_quota_nodes.py runs pods on real kubelets under a quota)."""
from __future__ import annotations

import json
import time
import urllib.error

import pytest
from kubernetes import client

from test_end_to_end import pod_manifest, statefulset
from test_records_cluster import own_nodes  # noqa: F401 (a fixture)

GPU = "gpu-scheduler.io/gpu"
PRODUCT = "nvidia.com/gpu.product"


def quota(stack, namespace: str, hard: dict[str, str], name: str = "gpus") -> None:
    stack.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
                 "spec": {"hard": hard}})
    # The quota admission refuses a pod only once the controller has computed the quota's use.
    stack.wait_for(lambda: _quota(stack, namespace, name).get("status", {}).get("used") is not None, 30,
                   f"ResourceQuota {namespace}/{name} with its use computed")


def _quota(stack, namespace: str, name: str = "gpus") -> dict:
    return json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/resourcequotas/{name}"))


def used(stack, namespace: str, name: str = "gpus") -> dict[str, str]:
    return _quota(stack, namespace, name).get("status", {}).get("used") or {}


def mapped_statefulset(namespace: str, entries: list[str], name: str = "train") -> dict:
    text = "".join(f"{i}={entry}\n" for i, entry in enumerate(entries))
    return statefulset(namespace, text, replicas=len(entries), name=name)


def bound_names(stack, namespace: str, selector: str) -> set[str]:
    return {p["metadata"]["name"] for p in stack.pods(namespace, selector) if p["spec"].get("nodeName")}


def quota_refusals(stack, namespace: str, statefulset_name: str) -> list[str]:
    """The StatefulSet controller's FailedCreate Events on the StatefulSet that are quota refusals."""
    events = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    return [e["message"] for e in events
            if e["involvedObject"].get("name") == statefulset_name and e["involvedObject"].get("kind") == "StatefulSet"
            and e.get("reason") == "FailedCreate" and "exceeded quota" in e.get("message", "")]


@pytest.fixture
def other_namespace(stack, namespace):
    from conftest import release_namespace
    name = f"{namespace}-b"[:60]
    stack.create_namespace(name)
    yield name
    release_namespace(stack, name)


def test_a_quota_of_two_gpus_lets_two_replicas_of_three_be_created_and_another_namespace_is_unaffected(
        stack, namespace, other_namespace, own_nodes):
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "2"})
    for ns in (namespace, other_namespace):
        stack.apply(mapped_statefulset(ns, [f"{node}:0", f"{node}:1", f"{node}:2"] if ns == namespace else
                                       [f"{node}:3", f"{node}:3", f"{node}:3"]))
    # The other namespace (no quota; its replicas share device 3, one workload): all three.
    stack.wait_for(lambda: len(bound_names(stack, other_namespace, "app=train")) == 3, 60,
                   "all 3 replicas bound in the namespace without a quota")
    # The quota's namespace: two replicas, and the controller's refusal of the third, in the API
    # server's own words (the resource, what was requested, used and the limit).
    refusals = stack.wait_for(lambda: quota_refusals(stack, namespace, "train"), 60, "a quota refusal of the third")
    assert f"exceeded quota: gpus, requested: requests.{GPU}=1, used: requests.{GPU}=2, limited: requests.{GPU}=2" in refusals[0], refusals
    # Two replicas (created in parallel: any two of the three), each bound; the third never created.
    stack.wait_for(lambda: len(bound_names(stack, namespace, "app=train")) == 2, 60, "2 replicas bound")
    created = {p["metadata"]["name"] for p in stack.pods(namespace, "app=train")}
    [missing] = {"train-0", "train-1", "train-2"} - created
    # "create Pod ..." up to 1.36, "Create Pod ..." from 1.37: the controller's words, not ours
    assert all(f"create pod {missing} in statefulset train failed" in r.lower() for r in refusals), refusals
    assert used(stack, namespace)[f"requests.{GPU}"] == "2"


def test_a_quota_on_one_gpu_type_leaves_the_other_type_free(stack, namespace, own_nodes):
    a100, = own_nodes(1, **{PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    t4, = own_nodes(1, **{PRODUCT: "Tesla-T4"})
    a100_resource = "product.gpu-scheduler.io/NVIDIA-A100-SXM4-80GB"
    quota(stack, namespace, {f"requests.{a100_resource}": "1"})
    # Replicas 0 and 3 pin one A100 each (the quota allows one), 1 and 2 the T4s (three in all).
    stack.apply(mapped_statefulset(namespace, [f"{a100}:0", f"{t4}:0", f"{t4}:1,2", f"{a100}:1"]))
    refusals = stack.wait_for(lambda: quota_refusals(stack, namespace, "train"), 60, "a quota refusal of an A100 replica")
    assert (f"requested: requests.{a100_resource}=1, used: requests.{a100_resource}=1, limited: requests.{a100_resource}=1"
            in refusals[0]), refusals
    # Created in parallel: replica 0 or 3 is the one over the A100 quota; the T4 replicas are created.
    stack.wait_for(lambda: len(bound_names(stack, namespace, "app=train")) == 3, 60, "3 replicas bound")
    pods = {p["metadata"]["name"]: p for p in stack.pods(namespace, "app=train")}
    assert {"train-1", "train-2"} < set(pods) and len(pods) == 3
    requests = pods["train-2"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "10m", "memory": "16Mi", GPU: "2", "product.gpu-scheduler.io/Tesla-T4": "2"}
    assert used(stack, namespace)[f"requests.{a100_resource}"] == "1"


def test_deleting_a_pod_frees_its_share_of_the_quota(stack, namespace, own_nodes):
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "2"})
    for name, devices in (("a-0", "0"), ("b-0", "1")):
        stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, name, f"0={node}:{devices}"))
    stack.wait_bound(namespace, 2)
    # A third pinned GPU is refused at creation, by the API server, in its own words.
    with pytest.raises(client.ApiException) as refused:
        stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "c-0", f"0={node}:2"))
    assert refused.value.status == 403
    assert f"exceeded quota: gpus, requested: requests.{GPU}=1, used: requests.{GPU}=2, limited: requests.{GPU}=2" in refused.value.body
    deleted = time.monotonic()
    stack.api.delete_namespaced_pod("a-0", namespace, grace_period_seconds=0)
    stack.wait_for(lambda: used(stack, namespace).get(f"requests.{GPU}") == "1", 30, "the quota's use down to 1")
    freed = time.monotonic() - deleted
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "c-0", f"0={node}:2"))
    stack.wait_bound(namespace, 2)
    print(f"quota use freed {freed:.2f} s after the pod's deletion")


def test_shared_gpus_count_once_per_pod_that_holds_them(stack, namespace, own_nodes):
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "5"})
    stack.apply(mapped_statefulset(namespace, [f"{node}:0", f"{node}:0", f"{node}:0,1"]))
    stack.wait_for(lambda: len(bound_names(stack, namespace, "app=train")) == 3, 60, "3 replicas bound")
    stack.wait_for(lambda: used(stack, namespace).get(f"requests.{GPU}") == "4", 30, "a use of 4: 1 + 1 + 2")


# -- DRA mode: the claims bind creates in the pod's namespace count for its device-class quota --------
from test_dra_cluster import NVIDIA, RESOURCE, admin, dra_pod, gpus_on_node3  # noqa: E402,F401 (fixtures)

DEVICE_CLASS_QUOTA = f"{NVIDIA}.deviceclass.resource.k8s.io/devices"  # 1.34: <class> + ResourceClaimsPerClass


def failed_scheduling_messages(stack, namespace: str, pod: str) -> list[str]:
    events = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    return [e["message"] for e in events
            if e["involvedObject"].get("name") == pod and e.get("reason") == "FailedScheduling"]


def test_dra_mode_claims_count_for_the_namespaces_device_class_quota(stack, namespace, admin, gpus_on_node3):
    quota(stack, namespace, {DEVICE_CLASS_QUOTA: "2"})
    entries = "0=node3:0\n1=node3:1\n2=node3:2\n"
    for name in ("p-0", "p-1", "p-2"):
        stack.apply(dra_pod(namespace, name, entries))
    # Each pod is created (no extended-resource quota here): bind's claims are what the quota counts.
    stack.wait_for(lambda: len(bound_names(stack, namespace, "")) == 2, 60, "2 DRA pods bound")

    def refused():
        waiting = [p["metadata"]["name"] for p in stack.pods(namespace) if not p["spec"].get("nodeName")]
        return waiting and [m for m in failed_scheduling_messages(stack, namespace, waiting[0])
                            if "exceeded quota" in m]
    messages = stack.wait_for(refused, 60, "the third pod's FailedScheduling with the quota's refusal")
    assert (f"requested: {DEVICE_CLASS_QUOTA}=1, used: {DEVICE_CLASS_QUOTA}=2, limited: {DEVICE_CLASS_QUOTA}=2"
            in messages[0]), messages
    # The user's quota, said as a reason the pod cannot be scheduled (not a SchedulerError, which
    # would send an operator looking for a fault of bind's).
    [waiting] = [p for p in stack.pods(namespace) if not p["spec"].get("nodeName")]
    [condition] = [c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["reason"] == "Unschedulable" and "exceeded quota" in condition["message"], condition
    # Counted the same way as in the other modes too (a pod-level quota on gpu-scheduler.io/gpu applies).
    assert all(p["spec"]["containers"][0]["resources"]["requests"][GPU] == "1" for p in stack.pods(namespace))
    claims = admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]
    assert len(claims) == 2
    assert used(stack, namespace)[DEVICE_CLASS_QUOTA] == "2"
    # One bound pod deleted (its claim with it, by its owner reference): the third is bound.
    bound = sorted(bound_names(stack, namespace, ""))
    stack.api.delete_namespaced_pod(bound[0], namespace, grace_period_seconds=0)
    stack.wait_for(lambda: len(bound_names(stack, namespace, "")) == 2 and len(stack.pods(namespace)) == 2, 90,
                   "the third pod bound once a claim was freed")


# -- plan --cluster and explain: the namespace's quotas on GPUs and their use --------------------------
from test_plugin_cluster import reader, run  # noqa: E402,F401 (a fixture: the account granted permissions.PLUGIN)


def test_plan_and_explain_show_the_namespaces_gpu_quota_and_its_use(stack, namespace, own_nodes, reader, tmp_path):
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "2"})
    manifest = mapped_statefulset(namespace, [f"{node}:0,1", f"{node}:2"])
    stack.apply(manifest)
    # The state explain reads is the quota's use; the StatefulSet controller's refusal of replica 1 is
    # an Event, which its recorder may drop under load (the first test here waits on that one).
    stack.wait_for(lambda: used(stack, namespace).get(f"requests.{GPU}") == "2", 60, "a use of 2")

    code, out, err = run("explain", "pod/train-0", "-n", namespace, "--kubeconfig", reader, "-o", "json")
    answer = json.loads(out)
    assert err == "" and code == 0
    assert answer["quota"] == [{"quota": "gpus", "resource": f"requests.{GPU}", "hard": "2", "used": "2"}]
    assert answer["counted"] == {GPU: "2"}
    code, out, _ = run("explain", "pod/train-0", "-n", namespace, "--kubeconfig", reader)
    assert f"Quota:          the pod requests {GPU}: 2\n  gpus: requests.{GPU} 2 used of 2\n" in out

    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(manifest))
    code, out, err = run("plan", "--cluster", "-f", str(path), "--kubeconfig", reader)
    assert f"  quota: gpus: requests.{GPU} 2 used of 2\n" in out, out


def test_a_map_edited_after_creation_to_pin_more_gpus_is_not_bound(stack, namespace, own_nodes):
    """The webhook sees creations only: a pending pod's map edited to pin 4 GPUs where it was
    counted for 1 would walk around the quota. bind's GPUQuota keeps it Pending, naming the fix."""
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "2"})
    stack.api.create_namespaced_pod(namespace, pod_manifest(namespace, "x-0", f"0=missing-{node}:0"))  # Pending
    stack.wait_for(lambda: failed_scheduling_messages(stack, namespace, "x-0"), 30, "the pod Pending (no such node)")
    stack.api.patch_namespaced_pod("x-0", namespace, {"metadata": {"annotations": {
        "gpu-scheduling-map": f"0={node}:0,1,2,3"}}})

    def refused():
        return [m for m in failed_scheduling_messages(stack, namespace, "x-0") if "pins 4 GPU(s)" in m]
    [message] = stack.wait_for(refused, 30, "GPUQuota's refusal")
    assert f"counted for the namespace's ResourceQuota as {GPU}: 4 (it requests 1), which ResourceQuota gpus bounds" in message
    assert "re-create it (delete it and create it again" in message  # a bare pod: no controller creates it again
    [pod] = stack.pods(namespace)
    assert not pod["spec"].get("nodeName")


def test_a_statefulset_scaled_up_past_its_quota_gets_the_replicas_that_fit(stack, namespace, own_nodes):
    node, = own_nodes(1)
    quota(stack, namespace, {f"requests.{GPU}": "3"})
    manifest = mapped_statefulset(namespace, [f"{node}:0", f"{node}:1", f"{node}:2", f"{node}:3"])
    manifest["spec"]["replicas"] = 2  # a map for 4, 2 replicas to start with
    stack.apply(manifest)
    stack.wait_for(lambda: len(bound_names(stack, namespace, "app=train")) == 2, 60, "2 replicas bound")
    assert not quota_refusals(stack, namespace, "train")
    stack.cp.kubectl("scale", "statefulset", "train", "-n", namespace, "--replicas=4")
    refusals = stack.wait_for(lambda: quota_refusals(stack, namespace, "train"), 60, "the refusal of the 4th")
    assert f"requested: requests.{GPU}=1, used: requests.{GPU}=3, limited: requests.{GPU}=3" in refusals[0], refusals
    stack.wait_for(lambda: len(bound_names(stack, namespace, "app=train")) == 3, 60, "3 replicas bound")
    assert len(stack.pods(namespace, "app=train")) == 3
