"""Binding decisions, node checks, device environments and Event builders: the pure core
behind bind. Table-driven; the captured ApiServerSource events are among the inputs."""
from __future__ import annotations

import copy
import json

import pytest

from conftest import sample
from kubeapi.errors import APIError
from gpu_scheduler.binding import (
    ALREADY_BOUND, API_ERROR, BOUND_ELSEWHERE, GONE, REPLACED, RETRY, Bind, EventError, Ignore, Unplaceable,
    bind_decision, binding_for, check_pod, conflict_outcome,
)
from gpu_scheduler.devices import (
    ModeError, device_env, device_mode, device_warnings, requests_gpus, shared_devices,
)
from gpu_scheduler.events import PodRef, event_for, event_name, recount, unscheduled_condition
from decide import problem as node_problem
from gpu_scheduler.nodecheck import gpu_capacity, tolerates
from gpu_scheduler.placement import resolve
from gpu_scheduler.schedmap import Placement

ADD = sample("apiserversource-add-gpu-scheduler-check-0.json")["body"]
BOUND_UPDATE = sample("apiserversource-update-gpu-scheduler-check-2-bound.json")["body"]


def pod(name="w-0", map_text="0=node1:0,1\n1=node2:2\n2=node2:2\n", **spec):
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {"gpu-scheduling-map": map_text} if map_text is not None else {}},
            "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c"}], **spec}}


# -- bind_decision ----------------------------------------------------------------------
def test_the_captured_add_event_binds_index_0_to_node1():
    decision = bind_decision(check_pod(ADD))
    assert decision == Bind("default", "gpu-scheduler-check-0", ADD["metadata"]["uid"], "node1", ("0", "1"))
    assert decision.placement == Placement("node1", ("0", "1"))


def test_the_captured_update_of_a_bound_pod_is_ignored():
    assert bind_decision(check_pod(BOUND_UPDATE)) == Ignore("already bound to node3")


@pytest.mark.parametrize("changes, expected", [
    ({"spec": {"schedulerName": "default-scheduler"}}, Ignore("spec.schedulerName is 'default-scheduler'")),
    ({"spec": {"nodeName": "node9"}}, Ignore("already bound to node9")),
    ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, Ignore("being deleted")),
])
def test_pods_not_ours_to_act_on_are_ignored(changes, expected):
    p = pod()
    for part, values in changes.items():
        p[part].update(values)
    assert bind_decision(p) == expected


@pytest.mark.parametrize("p, reason, needle", [
    (pod(map_text=None), "NoAnnotation", "no map annotation"),
    (pod(map_text="0=node1"), "MalformedMap", "line 1 '0=node1'"),
    (pod("w-5"), "NoMapEntry", "pod index 5 has no entry"),
    (pod("w"), "UnknownIndex", "does not end in -<index>"),
])
def test_unplaceable_pods_say_why(p, reason, needle):
    decision = bind_decision(p)
    assert isinstance(decision, Unplaceable) and decision.reason == reason and needle in decision.message
    assert decision.pod == f"ns/{p['metadata']['name']}"


def test_binding_body_carries_the_uid_precondition_and_the_device_record():
    body = binding_for(bind_decision(pod("w-1")))
    assert body == {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "w-1", "namespace": "ns", "uid": "uid-w-1",
                                 "annotations": {"gpu-scheduler/devices": "2"}},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "node2"}}


def test_binding_body_carries_the_version_decided_from_as_a_precondition():
    versioned = pod("w-1")
    versioned["metadata"]["resourceVersion"] = "4711"
    assert binding_for(bind_decision(versioned))["metadata"]["resourceVersion"] == "4711"


def test_a_bind_carries_device_warnings():
    assert [reason for reason, _ in bind_decision(pod("w-1")).warnings] == ["SharedDevices"]
    assert bind_decision(pod("w-0")).warnings == ()


@pytest.mark.parametrize("data, needle", [
    (None, "data: expected the pod as a JSON object"), ([], "data: expected"),
    ({"kind": "Node"}, "data.kind: expected 'Pod'"), ({"metadata": None}, "data.metadata: expected an object"),
    ({"metadata": {"name": "a", "namespace": "b"}}, "data.metadata.uid"),
    ({"metadata": {"name": "", "namespace": "b", "uid": "c"}}, "data.metadata.name"),
    ({"metadata": {"name": "a", "namespace": "b", "uid": "c"}, "spec": []}, "data.spec: expected an object"),
])
def test_check_pod_names_the_bad_field(data, needle):
    with pytest.raises(EventError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        check_pod(data)


# -- API outcomes ------------------------------------------------------------------------
@pytest.mark.parametrize("status, message, transient", [
    (0, "", True), (408, "", True), (425, "", True), (429, "", True), (500, "", True), (502, "", True), (503, "", True),
    (504, "", True), (404, "", False), (400, "", False), (401, "", False), (403, "forbidden", False), (422, "", False),
    (403, "forbidden: not yet ready to handle request", True)])
def test_api_errors_worth_retrying(status, message, transient):
    assert APIError(status, message).transient is transient


def test_a_404_for_a_namespace_is_told_apart_from_one_for_the_object():
    body = json.dumps({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                       "message": 'namespaces "gpu-scheduler" not found',
                       "details": {"name": "gpu-scheduler", "kind": "namespaces"}})
    error = APIError.of_response(404, "Not Found", body.encode())
    assert error.namespace_missing() == "gpu-scheduler" and error.message == 'namespaces "gpu-scheduler" not found'
    pod = APIError.of_response(404, "Not Found", json.dumps({"message": 'pods "x" not found',
                                                              "details": {"name": "x", "kind": "pods"}}))
    assert pod.not_found and pod.namespace_missing() == "" and pod.kind == "pods"
    assert APIError.of_response(502, "Bad Gateway", b"<html>").message == "502 Bad Gateway"


@pytest.mark.parametrize("current, outcome", [
    (None, GONE),
    ({"metadata": {"uid": "other"}, "spec": {"nodeName": "node2"}}, REPLACED),
    ({"metadata": {"uid": "uid-w-1"}, "spec": {"nodeName": "node2"}}, ALREADY_BOUND),
    ({"metadata": {"uid": "uid-w-1"}, "spec": {"nodeName": "node1"}}, BOUND_ELSEWHERE),
    ({"metadata": {"uid": "uid-w-1", "deletionTimestamp": "t"}, "spec": {}}, GONE),
    ({"metadata": {"uid": "uid-w-1"}, "spec": {}}, RETRY),
])
def test_conflict_outcomes(current, outcome):
    assert conflict_outcome(bind_decision(pod("w-1")), current) == outcome


# -- node checks -------------------------------------------------------------------------
def node(**spec):
    conditions = spec.pop("conditions", [{"type": "Ready", "status": "True"}])
    capacity = spec.pop("capacity", {"nvidia.com/gpu": "4"})
    return {"metadata": {"name": "node1"}, "spec": spec, "status": {"conditions": conditions, "capacity": capacity}}


PLACEMENT = Placement("node1", ("0", "3"))


@pytest.mark.parametrize("the_node, needle", [
    (None, "node node1 does not exist"),
    (node(unschedulable=True), "is cordoned"),
    (node(conditions=[{"type": "Ready", "status": "False", "message": "kubelet stopped posting"}]),
     "is not Ready: kubelet stopped posting"),
    (node(conditions=[]), "reports no Ready condition"),
    (node(taints=[{"key": "k", "effect": "NoExecute"}]), "has taint {k: NoExecute}"),
    (node(capacity={"nvidia.com/gpu": "2"}), "device 3 is beyond node node1's 2 nvidia.com/gpu (indexes 0..1)"),
])
def test_node_problems(the_node, needle):
    assert needle in node_problem(pod(), the_node, PLACEMENT)


@pytest.mark.parametrize("the_node", [
    node(), node(taints=[{"key": "k", "effect": "PreferNoSchedule"}]), node(capacity={}),
    node(capacity={"nvidia.com/gpu": "many"}),
])
def test_usable_nodes(the_node):
    assert node_problem(pod(), the_node, PLACEMENT) is None


def test_uuids_are_not_checked_against_capacity():
    uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
    assert node_problem(pod(), node(capacity={"nvidia.com/gpu": "1"}), Placement("node1", ("0", uuid))) is None


@pytest.mark.parametrize("toleration, taint, expected", [
    ({"key": "k", "operator": "Exists"}, {"key": "k", "effect": "NoSchedule"}, True),
    ({"operator": "Exists"}, {"key": "anything", "effect": "NoExecute"}, True),
    ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
    ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "k", "effect": "NoSchedule"}, False),
    ({"key": "j", "operator": "Exists"}, {"key": "k", "effect": "NoSchedule"}, False),
    ({"value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    ({"key": "k", "operator": "Gt", "value": "1"}, {"key": "k", "value": "2", "effect": "NoSchedule"}, False),
])
def test_tolerations(toleration, taint, expected):
    assert tolerates(toleration, taint) is expected


def test_a_tolerated_taint_is_no_problem():
    tolerant = pod(tolerations=[{"key": "k", "operator": "Exists"}])
    assert node_problem(tolerant, node(taints=[{"key": "k", "effect": "NoSchedule"}]), PLACEMENT) is None
    assert gpu_capacity(node()) == 4 and gpu_capacity({"status": {}}) is None


# -- devices -------------------------------------------------------------------------------
def test_device_env_modes():
    placement = Placement("n", ("1", "3"))
    assert device_env(placement) == {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert device_env(placement, "nvidia") == {"NVIDIA_VISIBLE_DEVICES": "1,3", "CUDA_VISIBLE_DEVICES": "0,1",
                                               "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_device_mode_from_annotation_or_default():
    p = pod()
    assert device_mode(p) == "cuda" and device_mode(p, "nvidia") == "nvidia"
    p["metadata"]["annotations"]["gpu-scheduler/device-env"] = "nvidia"
    assert device_mode(p) == "nvidia"
    p["metadata"]["annotations"]["gpu-scheduler/device-env"] = "rocm"
    with pytest.raises(ModeError, match="gpu-scheduler/device-env is 'rocm'; expected one of cuda, nvidia"):
        device_mode(p)


def test_shared_devices_only_count_the_same_node():
    text = "0=node1:0,1\n1=node1:1,2\n2=node2:1\n3=node1:3\n4=node1:1\n"
    assert shared_devices(resolve(pod("w-0", text))) == {"1": [1, 4]}
    assert shared_devices(resolve(pod("w-3", text))) == {}
    (reason, message), = device_warnings(pod("w-0", text), resolve(pod("w-0", text)))
    assert reason == "SharedDevices" and message == "pod index 0 shares GPUs on node1: device 1 also to index 1, 4"


@pytest.mark.parametrize("resources, expected", [
    ({"limits": {"nvidia.com/gpu": "1"}}, True), ({"requests": {"nvidia.com/gpu": "1"}}, True),
    ({"limits": {"cpu": "1"}}, False), (None, False), ("junk", False),
])
def test_requests_gpus(resources, expected):
    p = pod()
    p["spec"]["containers"][0]["resources"] = resources
    assert requests_gpus(p) is expected
    if expected:
        assert [r for r, _ in device_warnings(p, resolve(p))] == ["GPUResourceRequested"]


# -- Events ----------------------------------------------------------------------------------
def test_one_event_name_per_pod_reason_and_message():
    ref = PodRef("ns", "w-0", "u1")
    assert event_name(ref, "FailedScheduling", "a") == event_name(ref, "FailedScheduling", "a")
    assert event_name(ref, "FailedScheduling", "a") != event_name(ref, "FailedScheduling", "b")
    assert event_name(ref, "FailedScheduling", "a") != event_name(PodRef("ns", "w-0", "u2"), "FailedScheduling", "a")
    assert event_name(PodRef("ns", "x" * 253, "u"), "r", "m").startswith("x" * 200 + ".")
    assert PodRef.of(copy.deepcopy(ADD)) == PodRef("default", "gpu-scheduler-check-0", ADD["metadata"]["uid"])


def test_event_and_condition_bodies():
    ref = PodRef("ns", "w-0", "u1")
    event = event_for(ref, "Warning", "FailedScheduling", "why", "2026-01-01T00:00:00Z", "bind-1")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "w-0", "uid": "u1"}
    assert (event["source"], event["reportingComponent"], event["count"]) == ({"component": "gpu-scheduler"},
                                                                             "gpu-scheduler", 1)
    assert recount(3, "t") == {"count": 3, "lastTimestamp": "t"}
    condition = unscheduled_condition("Unschedulable", "why", "t")["status"]["conditions"][0]
    assert condition == {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "why",
                         "lastProbeTime": None, "lastTransitionTime": "t"}


# -- JSON log lines ----------------------------------------------------------------------------
def test_json_log_lines_carry_the_extra_fields(monkeypatch):
    import json
    import logging

    from serving import jsonlog

    record = logging.LogRecord("bind", logging.WARNING, __file__, 1, "placement %s", ("x",), None)
    record.pod, record.latency_ms = "ns/w-0", 1.5
    line = json.loads(jsonlog.JsonFormatter().format(record))
    assert {k: line[k] for k in ("level", "logger", "message", "pod", "latency_ms")} == {
        "level": "warning", "logger": "bind", "message": "placement x", "pod": "ns/w-0", "latency_ms": 1.5}
    monkeypatch.setenv("LOG_LEVEL", "debug")
    assert jsonlog.level() == "DEBUG"
    monkeypatch.setenv("LOG_LEVEL", "loud")
    assert jsonlog.level() == "INFO"


# -- totality on odd objects -----------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

odd = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                   max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(odd, odd, odd, odd)
def test_node_problem_is_total(tolerations, taints, conditions, capacity):
    p = pod(tolerations=tolerations)
    n = {"spec": {"taints": taints}, "status": {"conditions": conditions, "capacity": capacity}}
    assert node_problem(p, n, PLACEMENT) is None or isinstance(node_problem(p, n, PLACEMENT), str)


@settings(max_examples=300, deadline=None)
@given(odd, odd, odd)
def test_bind_decision_is_total(annotations, labels, spec):
    p = {"metadata": {"name": "w-0", "namespace": "ns", "uid": "u", "annotations": annotations, "labels": labels},
         "spec": spec}
    assert isinstance(bind_decision(p), (Bind, Ignore, Unplaceable))
