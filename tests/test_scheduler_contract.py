"""kube-scheduler's observable contract, on the real control plane: Events, the PodScheduled
condition, node checks, and the device environment."""
from __future__ import annotations

import json

import pytest

from test_end_to_end import env_of, pod_manifest, statefulset


def events_for(stack, namespace: str, pod: str, reason: str | None = None) -> list:
    items = stack.api.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items
    return [e for e in items if reason is None or e.reason == reason]


def wait_event(stack, namespace, pod, reason, count=1):
    def found():
        events = events_for(stack, namespace, pod, reason)
        return events if events and events[0].count >= count else None
    return stack.wait_for(found, 20, f"{reason} event for {pod} (count {count})")


def condition(pod: dict, kind: str = "PodScheduled") -> dict | None:
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), None)


def only_pod(stack, namespace):
    (pod,) = stack.pods(namespace)
    return pod


def test_binding_records_a_scheduled_event(stack, namespace):
    stack.apply(pod_manifest(namespace, "w-0", "0=node2:1\n"))
    stack.wait_bound(namespace, 1)
    (event,) = wait_event(stack, namespace, "w-0", "Scheduled")
    assert event.type == "Normal"
    assert event.message == f"Successfully assigned {namespace}/w-0 to node2"
    assert event.source.component == "gpu-scheduler" and event.reporting_component == "gpu-scheduler"
    assert event.involved_object.uid == only_pod(stack, namespace)["metadata"]["uid"]


def test_no_entry_is_unschedulable_and_repeats_count_up_one_event(stack, namespace):
    stack.apply(pod_manifest(namespace, "w-5", "0=node1:0\n"))
    (event,) = wait_event(stack, namespace, "w-5", "FailedScheduling")
    assert event.type == "Warning" and "pod index 5 has no entry" in event.message
    stack.wait_for(lambda: condition(only_pod(stack, namespace)), 20, "the PodScheduled condition")
    cond = condition(only_pod(stack, namespace))
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert "pod index 5 has no entry" in cond["message"]
    stack.ping()
    stack.ping()
    events = wait_event(stack, namespace, "w-5", "FailedScheduling", count=3)
    assert len(events) == 1 and events[0].count >= 3  # one Event, counted, not one per retry


@pytest.fixture
def extra_node(stack, namespace):
    """A node name of this test's own, removed afterwards (the shared nodes stay untouched)."""
    name = f"n-{namespace}"[:60].rstrip("-")
    yield name
    stack.cp.kubectl("delete", "node", name, "--ignore-not-found")


def placed_once_the_node_is_fixed(stack, namespace, node):
    """bind's queue places the pod on the node's own change (a new node, a taint gone); the
    pings stand in for the PingSource. Which of the two binds it is not the contract: the pod
    bound on its node is (a ping that finds it already bound reports no outcome)."""
    def bound_there():
        stack.ping()
        return only_pod(stack, namespace)["spec"].get("nodeName") == node
    stack.wait_for(bound_there, 30, f"the pod bound on {node}", interval=1)


@pytest.mark.parametrize("node_spec, ready, expected", [
    ({"unschedulable": True}, True, "is cordoned"),
    ({}, False, "is not Ready"),
    ({"taints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]}, True,
     "has taint {gpu=a100: NoSchedule} that the pod does not tolerate"),
], ids=["cordoned", "notready", "tainted"])
def test_node_checks_keep_the_pod_pending_until_the_node_is_fixed(stack, namespace, extra_node, node_spec, ready,
                                                                   expected):
    stack.cp.add_node(extra_node, ready=ready, spec=node_spec)
    stack.apply(pod_manifest(namespace, "w-0", f"0={extra_node}:0\n"))
    (event,) = wait_event(stack, namespace, "w-0", "FailedScheduling")
    assert expected in event.message
    assert not only_pod(stack, namespace)["spec"].get("nodeName")
    stack.cp.request("DELETE", f"/api/v1/nodes/{extra_node}")
    stack.cp.add_node(extra_node)  # the node recovers
    placed_once_the_node_is_fixed(stack, namespace, extra_node)


def test_a_tolerated_taint_does_not_block(stack, namespace, extra_node):
    stack.cp.add_node(extra_node, spec={"taints": [{"key": "gpu", "effect": "NoSchedule"}]})
    # The API server taints a new node not-ready until the node-lifecycle controller (every 5 s)
    # sees it Ready; a pod created before that is rightly held until the next resync.
    stack.wait_for(lambda: [t["key"] for t in json.loads(stack.cp.get(f"/api/v1/nodes/{extra_node}"))["spec"]
                            .get("taints", [])] == ["gpu"], 30, "only the test's own taint", interval=0.2)
    manifest = pod_manifest(namespace, "w-0", f"0={extra_node}:0\n")
    manifest["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    stack.apply(manifest)
    assert stack.wait_bound(namespace, 1)[0]["spec"]["nodeName"] == extra_node


def test_a_missing_node_that_appears_later_is_used(stack, namespace, extra_node):
    stack.apply(pod_manifest(namespace, "w-0", f"0={extra_node}:0\n"))
    (event,) = wait_event(stack, namespace, "w-0", "FailedScheduling")
    assert f"node {extra_node} does not exist" in event.message
    stack.cp.add_node(extra_node)
    placed_once_the_node_is_fixed(stack, namespace, extra_node)


def test_a_device_beyond_the_node_capacity_is_unschedulable(stack, namespace):
    stack.apply(pod_manifest(namespace, "w-0", "0=node1:2,7\n"))
    (event,) = wait_event(stack, namespace, "w-0", "FailedScheduling")
    assert "device 7 is beyond node node1's 4 nvidia.com/gpu" in event.message
    assert not only_pod(stack, namespace)["spec"].get("nodeName")


def test_shared_devices_are_allowed_with_a_warning_and_an_event(stack, namespace):
    stack.apply(statefulset(namespace))
    stack.wait_bound(namespace, 5, "app=gpu-scheduler-check")
    (event,) = wait_event(stack, namespace, "gpu-scheduler-check-4", "SharedDevices")
    assert event.type == "Warning" and "device 3 also to index 3" in event.message
    assert events_for(stack, namespace, "gpu-scheduler-check-1", "SharedDevices") == []


def test_requesting_nvidia_gpu_is_warned_about(stack, namespace):
    manifest = pod_manifest(namespace, "w-0", "0=node1:1\n")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    assert "requests nvidia.com/gpu" in result.stderr  # the admission warning
    wait_event(stack, namespace, "w-0", "GPUResourceRequested")


def test_nvidia_mode_exposes_only_the_listed_devices(stack, namespace):
    manifest = pod_manifest(namespace, "w-0", "0=node1:1,3\n")
    manifest["metadata"]["annotations"]["gpu-scheduler/device-env"] = "nvidia"
    stack.apply(manifest)
    env = env_of(stack.wait_bound(namespace, 1)[0])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "1,3" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_an_unknown_device_mode_is_denied(stack, namespace):
    manifest = pod_manifest(namespace, "w-0", "0=node1:1\n")
    manifest["metadata"]["annotations"]["gpu-scheduler/device-env"] = "rocm"
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0 and "gpu-scheduler/device-env is 'rocm'" in result.stderr
