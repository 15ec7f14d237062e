"""What runs: the check StatefulSet on four real nodes (the stack's kubelet + containerd each), its
placement read back from the containers' own logs, and the kubelet's say on a placement.

The other control-plane tests keep nodes without kubelets: test_faults.py and the bench's
throughput runs create hundreds of pods (four kubelets would have to start hundreds of containers
on 2 cores, which measures the kubelets, not bind), and test_scheduler_contract.py's node checks
set Node conditions and taints by hand, which a live kubelet would overwrite."""
from __future__ import annotations

import json
import re
import time

import pytest

from conftest import release_namespace
from localcp.stack import LocalStack
from tests.test_end_to_end import EXPECTED, statefulset

_names = iter(range(10**6))


@pytest.fixture
def ns(real_stack, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"n{next(_names)}-{request.node.name.lower()}")[:40].strip("-")
    yield real_stack.create_namespace(name)
    release_namespace(real_stack, name)  # the next test's StatefulSet wants the same GPUs


def running(stack: LocalStack, namespace: str, count: int, selector: str = "") -> list[dict] | None:
    pods = stack.pods(namespace, selector)
    ok = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return pods if len(pods) == count and len(ok) == count else None


def logged(stack: LocalStack, namespace: str, pod: str) -> str:
    """The last line the container printed, through the API server and the pod's kubelet."""
    def line():
        out = stack.cp.kubectl("logs", "-n", namespace, pod, "--tail=1", check=False).stdout.strip()
        return out or None
    return stack.wait_for(line, 20, f"{pod} logs a line")


def placement_from_logs(stack: LocalStack, namespace: str, pods: list[dict]) -> dict[int, tuple[str, str]]:
    placed = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        match = re.fullmatch(r"node=(\S+) CUDA_VISIBLE_DEVICES=(\S+)", logged(stack, namespace, name))
        assert match, f"{name} logged something else"
        placed[int(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"])] = match.groups()
    return placed


def events(stack: LocalStack, namespace: str, pod: str) -> list[dict]:
    listing = stack.api.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [{"reason": e.reason, "message": e.message, "source": e.source.component if e.source else None}
            for e in listing.items]


def cpu_hungry_pod(namespace: str, name: str, node: str, cpu: str) -> dict:
    manifest = statefulset(namespace)["spec"]["template"]
    manifest = json.loads(json.dumps(manifest))
    manifest["metadata"]["annotations"]["gpu-scheduling-map"] = f"0={node}:0\n"
    manifest["metadata"].update(name=f"{name}-0", namespace=namespace)
    manifest["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return {"apiVersion": "v1", "kind": "Pod", **manifest}


def test_seed_placement_read_back_from_the_containers_logs(real_stack, ns):
    real_stack.apply(statefulset(ns))
    pods = real_stack.wait_for(lambda: running(real_stack, ns, 5), 90, "5 check pods Running")
    assert ({int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]): p["spec"]["nodeName"] for p in pods} ==
            {i: node for i, (node, _) in EXPECTED.items()})
    # NODE_NAME from the downward API, CUDA_VISIBLE_DEVICES from mutate: what the process saw.
    assert placement_from_logs(real_stack, ns, pods) == EXPECTED
    for pod in pods:  # started by the kubelet of its node, in containerd, as the image's user
        # the kubelet's recorder writes Started in the background, maybe after the pod shows Running
        started = real_stack.wait_for(lambda: [e for e in events(real_stack, ns, pod["metadata"]["name"])
                                               if e["reason"] == "Started"], 20, "the Started Event")
        assert started[0]["source"] == "kubelet"
        assert pod["status"]["podIP"].startswith(f"10.244.{pod['spec']['nodeName'][-1]}.")


def test_more_cpu_than_the_node_has_is_rejected_by_its_kubelet_without_a_fit_check(real_stack, ns):
    """What bind did before its fit check, and what any placement that skips one gets: the pod is
    put on node1 as it is (spec.nodeName, as a Binding would), and the kubelet, which has the last
    word on fit, refuses it: phase Failed, reason OutOfcpu."""
    allocatable = int(real_stack.nodes.node("node1")["status"]["allocatable"]["cpu"].rstrip("m") or 0)
    unchecked = cpu_hungry_pod(ns, "hungry", "node1", str(allocatable + 1))
    unchecked["spec"]["nodeName"] = "node1"
    real_stack.apply(unchecked)

    def rejected():
        [pod] = real_stack.pods(ns)
        return pod if pod["status"].get("phase") == "Failed" else None
    pod = real_stack.wait_for(rejected, 60, "the kubelet's verdict")
    assert pod["status"]["reason"] == "OutOfcpu"
    assert "Node didn't have enough resource: cpu" in pod["status"]["message"]


def test_more_cpu_than_the_node_has_stays_pending_with_the_fit_check(real_stack, ns):
    """The same pod placed by bind: its fit check (NodeResourcesFit) keeps it Pending and unbound,
    with kube-scheduler's reason, so the kubelet never has to refuse it."""
    allocatable = int(real_stack.nodes.node("node2")["status"]["allocatable"]["cpu"].rstrip("m") or 0)
    real_stack.apply(cpu_hungry_pod(ns, "hungry", "node2", str(allocatable + 1)))
    held = real_stack.wait_for(lambda: [e for e in events(real_stack, ns, "hungry-0")
                                        if e["reason"] in ("FailedScheduling", "Scheduled")], 30, "bind's decision")
    [pod] = real_stack.pods(ns)
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert held[0]["reason"] == "FailedScheduling"
    assert held[0]["message"].startswith(f"node node2: Insufficient cpu (the pod requests {allocatable + 1};")


def test_a_stopped_kubelet_makes_its_node_not_ready_and_holds_a_new_replica(real_stack, ns):
    nodes = real_stack.nodes
    nodes["node2"].stop_kubelet()
    try:
        def not_ready():
            conditions = {c["type"]: c for c in nodes.node("node2")["status"]["conditions"]}
            return conditions["Ready"] if conditions["Ready"]["status"] != "True" else None
        ready = real_stack.wait_for(not_ready, 60, "node2 NotReady", interval=1)
        assert ready["status"] == "Unknown" and ready["reason"] == "NodeStatusUnknown"  # the lifecycle controller
        real_stack.apply(statefulset(ns, "0=node2:1\n", replicas=1))
        failed = real_stack.wait_for(lambda: [e for e in events(real_stack, ns, "gpu-scheduler-check-0")
                                              if e["reason"] == "FailedScheduling"], 30, "FailedScheduling")
        assert "node2" in failed[0]["message"] and ("Ready" in failed[0]["message"] or "taint" in failed[0]["message"])
        [pod] = real_stack.pods(ns)
        assert not pod["spec"].get("nodeName")
    finally:
        nodes.restart_kubelet("node2")
    # Back: the next resync places it, and node2's kubelet runs it.
    assert real_stack.ping()["status"] == 200
    [pod] = real_stack.wait_for(lambda: running(real_stack, ns, 1), 60, "the replica Running on node2")
    assert pod["spec"]["nodeName"] == "node2"
    assert logged(real_stack, ns, "gpu-scheduler-check-0") == "node=node2 CUDA_VISIBLE_DEVICES=1"


def test_scaled_down_and_up_replicas_come_back_on_their_nodes(real_stack, ns):
    real_stack.apply(statefulset(ns))
    real_stack.wait_for(lambda: running(real_stack, ns, 5), 90, "5 Running")
    real_stack.cp.kubectl("scale", "statefulset", "-n", ns, "gpu-scheduler-check", "--replicas=2")
    left = real_stack.wait_for(lambda: running(real_stack, ns, 2), 60, "scaled down to 2")
    assert sorted(p["metadata"]["name"] for p in left) == ["gpu-scheduler-check-0", "gpu-scheduler-check-1"]
    real_stack.cp.kubectl("scale", "statefulset", "-n", ns, "gpu-scheduler-check", "--replicas=5")
    pods = real_stack.wait_for(lambda: running(real_stack, ns, 5), 90, "scaled up to 5")
    assert placement_from_logs(real_stack, ns, pods) == EXPECTED


@pytest.mark.controlplane  # its own stack, not the `stack` fixture
def test_teardown_leaves_nothing_behind():
    """Its own stack, so that its end can be checked: pods deleted first (their containers and
    networks by their kubelets), then kubelets, containerds, shims, mounts, cgroups, namespaces."""
    from localcp import nodes as node_layer

    tunables = {t: (node_layer.Path("/proc/sys") / t).read_text() for t in node_layer.KERNEL_TUNABLES}
    with LocalStack(real_nodes=True) as stack:
        stack.apply(statefulset("default", replicas=2))
        pods = stack.wait_for(lambda: running(stack, "default", 2), 90, "2 Running")
        shims = [pid for n in stack.nodes.nodes.values() for pid in n._shims()]
        assert shims, "the pods' shims run while the stack does"
        assert stack.nodes.leftovers(), "a running stack is seen by the leftover check"
        nodes = stack.nodes
        deleted_first = []
        original_stop = nodes.nodes["node1"].stop_kubelet

        def stop_kubelet():  # records what the API held when the first kubelet stopped
            deleted_first.append(json.loads(stack.cp.get("/api/v1/pods"))["items"])
            original_stop()
        nodes.nodes["node1"].stop_kubelet = stop_kubelet
    assert deleted_first and deleted_first[0] == [], "pods were still there when the kubelets stopped"
    assert pods and not nodes.leftovers(), nodes.leftovers()
    assert not [pid for pid in shims if node_layer.Path(f"/proc/{pid}").exists()]
    assert {t: (node_layer.Path("/proc/sys") / t).read_text() for t in node_layer.KERNEL_TUNABLES} == tunables
    assert not node_layer.Path("/var/lib/cni").exists() or not any(node_layer.Path("/var/lib/cni").rglob("*gpu-scheduler*"))
