"""`plan --cluster` and `explain` on the real control plane, run as a user granted exactly
permissions.PLUGIN: the plan's answer for each replica is what bind then does."""
from __future__ import annotations

import io
import json

import pytest
import yaml

from conftest import REPO
from gpu_scheduler import permissions
from kubectl_gpu_scheduler.cli import main
from test_dra_cluster import admin, dra_pod, gpus_on_node3  # noqa: F401 (fixtures)

SEED = yaml.safe_load((REPO / "check" / "statefulset.yaml").read_text())


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def reader(stack, tmp_path_factory):
    """A kubeconfig for a ServiceAccount granted exactly permissions.PLUGIN, with two contexts:
    `local` (no namespace) and `reader-ns` (namespace plugin-home). Other modules import it (one
    per module, the same account and role)."""
    rules = [{"apiGroups": [group], "resources": [resource], "verbs": [verb]}
             for group, resource, verb in sorted(permissions.PLUGIN)]
    if not stack.api.list_namespace(field_selector="metadata.name=plugin-home").items:  # another module's reader made it
        stack.create_namespace("plugin-home")
    for manifest in (
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": "plugin-home"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "gpu-plan-reader"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "gpu-plan-reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-plan-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "plugin-home"}]},
    ):
        stack.apply(manifest)
    token = stack.cp.service_account_token("plugin-home", "reader")
    config = json.loads(stack.cp.kubeconfig_text(user={"token": token}))
    config["contexts"].append({"name": "reader-ns", "context": {"cluster": "local", "user": "user",
                                                                "namespace": "plugin-home"}})
    path = tmp_path_factory.mktemp("plugin") / "config"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def cordoned(stack, namespace):
    name = f"c-{namespace}"[:60].rstrip("-")
    stack.cp.add_node(name, spec={"unschedulable": True})
    yield name
    stack.cp.kubectl("delete", "node", name, "--ignore-not-found")


def workload(namespace: str, text: str, replicas: int) -> dict:
    obj = json.loads(json.dumps(SEED))
    obj["metadata"]["namespace"] = namespace
    obj["spec"]["replicas"] = replicas
    obj["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] = text
    return obj


def test_plan_cluster_says_what_bind_then_does(stack, namespace, reader, cordoned, tmp_path):
    obj = workload(namespace, f"0=node1:0\n1={cordoned}:0\n2=gone-{namespace[:40]}:1\n3=node2:7\n4=node3:1", 5)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(obj))
    code, out, err = run("plan", "-f", str(path), "--cluster", "--kubeconfig", reader, "-o", "json")
    assert (code, err) == (1, "")
    pods = json.loads(out)["workloads"][0]["pods"]
    decided = {p["pod"]: (p["cluster"]["decision"], p["cluster"].get("message")) for p in pods}
    assert [d for d, _ in decided.values()] == ["bind", "wait", "wait", "wait", "bind"]
    assert "is cordoned" in decided["gpu-scheduler-check-1"][1]
    assert "does not exist" in decided["gpu-scheduler-check-2"][1]
    assert "device 7 is beyond node node2's 4 nvidia.com/gpu" in decided["gpu-scheduler-check-3"][1]

    # Side by side with bind: the same pods are bound, the others wait with the same message.
    stack.apply(obj)
    stack.wait_for(lambda: len(stack.pods(namespace)) == 5, 60, "five pods")
    stack.ping()

    def settled():
        current = {p["metadata"]["name"]: p for p in stack.pods(namespace)}
        waiting = [n for n, (d, _) in decided.items() if d == "wait"]
        conditions = {n: next((c for c in current[n]["status"].get("conditions", []) if c["type"] == "PodScheduled"),
                              None) for n in waiting}
        bound = all(current[n]["spec"].get("nodeName") for n, (d, _) in decided.items() if d == "bind")
        return current if bound and all(conditions.values()) else None
    current = stack.wait_for(settled, 30, "bound pods and PodScheduled conditions")
    for name, (decision, message) in decided.items():
        if decision == "bind":
            assert current[name]["spec"]["nodeName"] == next(p["node"] for p in pods if p["pod"] == name)
        else:
            assert not current[name]["spec"].get("nodeName")
            condition = next(c for c in current[name]["status"]["conditions"] if c["type"] == "PodScheduled")
            assert condition["message"] == message

    # The table form of the same, run through the context that names no namespace: the file's wins.
    code, out, _ = run("plan", "-f", str(path), "--cluster", "--kubeconfig", reader, "--context", "local")
    assert code == 1 and "STATUS" in out and "bind now" in out and "Unschedulable now" in out
    assert f"not placed now: pod gpu-scheduler-check-1: node {cordoned} is cordoned" in out


def test_explain_a_bound_and_a_waiting_pod_and_the_attempt_that_places_it(stack, namespace, reader, cordoned):
    stack.apply(workload(namespace, f"0=node1:0,1\n1={cordoned}:2", 2))
    stack.wait_for(lambda: len([p for p in stack.pods(namespace) if p["spec"].get("nodeName")]) == 1, 60, "pod 0 bound")

    # bind writes the Scheduled Event after the Binding, in the background: explain once it is there.
    stack.wait_for(lambda: "Scheduled" in [e["reason"] for e in json.loads(run(
        "explain", "pod/gpu-scheduler-check-0", "-n", namespace, "--kubeconfig", reader, "-o", "json")[1])["events"]],
        20, "pod 0's Scheduled Event")
    code, out, err = run("explain", "pod/gpu-scheduler-check-0", "-n", namespace, "--kubeconfig", reader, "-o", "json")
    answer = json.loads(out)
    assert (code, err) == (0, "")
    assert (answer["index"], answer["entry"], answer["node"]) == (0, "0=node1:0,1", "node1")
    assert answer["env"]["check"] == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert answer["envCheck"] == {"matches": True, "mode": "cuda"}
    assert [e["reason"] for e in answer["events"]] == ["Scheduled"]
    assert answer["scheduling"]["action"] == "nothing" and "already bound to node1" in answer["scheduling"]["message"]

    stack.wait_for(lambda: run("explain", "gpu-scheduler-check-1", "-n", namespace, "--kubeconfig", reader,
                               "-o", "json")[1].count("FailedScheduling"), 20, "the FailedScheduling Event")
    code, out, _ = run("explain", "po/gpu-scheduler-check-1", "--namespace", namespace, "--kubeconfig", reader,
                       "-o", "yaml")
    answer = yaml.safe_load(out)
    assert code == 1
    assert answer["podScheduled"]["status"] == "False" and "is cordoned" in answer["podScheduled"]["message"]
    assert answer["events"][0]["type"] == "Warning" and "is cordoned" in answer["events"][0]["message"]
    assert answer["scheduling"] == {"action": "wait", "node": cordoned, "plugin": "NodeUnschedulable",
                                    "reason": "Unschedulable", "retriedOn": ["the node updated"],
                                    "message": f"node {cordoned} is cordoned (spec.unschedulable)"}

    stack.cp.kubectl("uncordon", cordoned)
    code, out, _ = run("explain", "pods/gpu-scheduler-check-1", "-n", namespace, "--kubeconfig", reader)
    assert code == 0 and f"Scheduling:     bind: bind to {cordoned}" in out
    assert "Events (gpu-scheduler):" in out and "FailedScheduling" in out
    stack.wait_for(lambda: stack.ping()["outcomes"].get("Bound"), 20, "a resync that binds", interval=1)
    stack.wait_for(lambda: "Scheduled" in [e["reason"] for e in json.loads(run(
        "explain", "pod/gpu-scheduler-check-1", "-n", namespace, "--kubeconfig", reader, "-o", "json")[1])["events"]],
        20, "pod 1's Scheduled Event")
    code, out, _ = run("explain", "pod", "gpu-scheduler-check-1", "-n", namespace, "--kubeconfig", reader)
    assert code == 0 and f"Node:           {cordoned}" in out and "Scheduled" in out


def test_explain_uses_the_contexts_namespace_and_reports_a_missing_pod(stack, reader):
    code, out, err = run("explain", "pod/nothing-here", "--kubeconfig", reader, "--context", "reader-ns")
    assert (code, out) == (2, "")
    assert err == 'error: pods "nothing-here" not found in namespace plugin-home\n'


def test_a_pod_of_another_scheduler_is_explained_as_not_ours(stack, namespace, reader):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other-0", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    stack.apply(pod)
    code, out, _ = run("explain", "other-0", "-n", namespace, "--kubeconfig", reader)
    assert code == 0 and "Map entry:      <none>" in out and "Scheduling:     nothing:" in out
    assert "NoAnnotation: the pod has no gpu-scheduling-map annotation" in out
    assert 'Scheduling:     nothing: spec.schedulerName is "default-scheduler", not gpu-scheduler' in out
    assert "None" not in out


def test_plan_and_explain_show_a_dra_pods_claim_before_and_after_bind_allocates_it(stack, namespace, reader,
                                                                                     admin, gpus_on_node3, tmp_path):
    """DRA mode: before, the claim bind would create and the devices it would allocate (or why it
    cannot); after, the claim allocated on its node and reserved for the pod. As a user granted
    exactly permissions.PLUGIN."""
    pod = dra_pod(namespace, "p-2", "2=node3:1,2\n")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    code, out, err = run("plan", "-f", str(manifest), "--cluster", "--kubeconfig", reader, "-o", "json")
    [row] = json.loads(out)["workloads"][0]["pods"]
    assert (code, err) == (0, "")
    assert row["claim"] == {"name": "p-2-gpus", "deviceClass": "gpu.nvidia.com", "state": "NotCreated", "node": None,
                            "devices": [], "reservedFor": [],
                            "wanted": ["gpu.nvidia.com/node3/gpu-1", "gpu.nvidia.com/node3/gpu-2"]}

    stack.apply(pod)
    [bound] = stack.wait_bound(namespace, 1)
    code, out, _ = run("explain", "pod/p-2", "-n", namespace, "--kubeconfig", reader, "-o", "json")
    answer = json.loads(out)
    assert code == 0 and answer["envCheck"] == {"matches": True, "mode": "dra"}
    assert answer["claim"] == {"name": "p-2-gpus", "deviceClass": "gpu.nvidia.com", "state": "Reserved",
                               "node": "node3", "reservedFor": ["pods/p-2"],
                               "devices": ["gpu.nvidia.com/node3/gpu-1", "gpu.nvidia.com/node3/gpu-2"]}
    code, out, _ = run("explain", "p-2", "-n", namespace, "--kubeconfig", reader)
    assert (f"DRA claim:      ResourceClaim {namespace}/p-2-gpus (DeviceClass gpu.nvidia.com): Reserved on node3:"
            " gpu.nvidia.com/node3/gpu-1, gpu.nvidia.com/node3/gpu-2; reserved for pods/p-2") in out

    # Another replica asking for a device p-2's claim holds: plan names that claim.
    other = dra_pod(namespace, "q-2", "2=node3:2\n")
    manifest.write_text(yaml.safe_dump(other))
    code, out, _ = run("plan", "-f", str(manifest), "--cluster", "--kubeconfig", reader)
    assert code == 1
    assert f"claim: pod q-2: ResourceClaim {namespace}/q-2-gpus (DeviceClass gpu.nvidia.com): NotCreated\n" in out
    # bind's framework refuses it first for the GPU p-2 holds (GPUsHeld), as bind would.
    assert f"not placed now: pod q-2: GPU 2 on node3 is held by {namespace}/p-2 (another workload;" in out
    assert "GPUsHeld now" in out
