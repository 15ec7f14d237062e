"""Admission decisions: `gpu_scheduler.admission`. Patches are applied (tests/jsonpatch.py) and the
resulting pod is checked, not the patch's wording."""
from __future__ import annotations

import base64
import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jsonpatch import PatchError, apply_patch, parse_pointer
from gpu_scheduler.admission import (
    Decision, Review, ReviewError, admission_response, checked_field, decide, parse_review, patch_for, response_for,
)
from gpu_scheduler.devices import device_env
from gpu_scheduler.schedmap import Placement
from tests.fixtures import SAMPLES

SEED = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n"
SEED_DEVICES = {0: "0,1", 1: "2", 2: "0,1,2", 3: "3", 4: "3"}
# The seed gives device 3 of node4 to both index 3 and index 4: allowed, with a warning.
SHARED = {3: "gpu-scheduler: pod index 3 shares GPUs on node4: device 3 also to index 4",
          4: "gpu-scheduler: pod index 4 shares GPUs on node4: device 3 also to index 3"}
LABEL_ONLY = [{"op": "add", "path": "/metadata/labels", "value": {"gpu-scheduler/managed": "true"}}]
MANAGED = "gpu-scheduler/managed"
CVD, CDO = "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"
V1, V1BETA1 = "admission.k8s.io/v1", "admission.k8s.io/v1beta1"
GPU = "gpu-scheduler.io/gpu"


# --------------------------------------------------------------------------- builders

def container(name="main", env=None, **fields):
    result = {"name": name, "image": "busybox", **fields}
    if env is not None:
        result["env"] = env
    return result


def make_pod(name="web-1", *, map_text=SEED, scheduler="gpu-scheduler", containers=None, init_containers=None,
             labels=None, generate_name=None, annotations=None):
    metadata = {"namespace": "default"}
    if name is not None:
        metadata["name"] = name
    if generate_name is not None:
        metadata["generateName"] = generate_name
    if labels is not None:
        metadata["labels"] = labels
    annotations = dict(annotations or {})
    if map_text is not None:
        annotations["gpu-scheduling-map"] = map_text
    if annotations:
        metadata["annotations"] = annotations
    pod_spec = {"containers": [container()] if containers is None else containers}
    if init_containers is not None:
        pod_spec["initContainers"] = init_containers
    if scheduler is not None:
        pod_spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def make_review(pod, *, version=V1, uid="uid-1", operation="CREATE", resource="pods", sub_resource=None,
                dry_run=None):
    request = {"uid": uid, "operation": operation,
               "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": resource},
               "object": pod}
    if sub_resource is not None:
        request["subResource"] = sub_resource
    if dry_run is not None:
        request["dryRun"] = dry_run
    return {"apiVersion": version, "kind": "AdmissionReview", "request": request}


def decode_patch(response: dict) -> list:
    body = response["response"]
    assert body["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(body["patch"]))


def admit(pod, **review_args):
    """(response, decision, patched pod) for one CREATE of `pod`."""
    response, decision = admission_response(make_review(pod, **review_args))
    patch = decode_patch(response) if "patch" in response["response"] else []
    assert patch == list(decision.patch)
    return response, decision, apply_patch(pod, patch)


def counted_gpus(n, product=None):
    """The resources mutate gives the first container of a pod pinning n GPUs (of GPU type `product`)."""
    wanted = {GPU: str(n), **({f"product.gpu-scheduler.io/{product}": str(n)} if product else {})}
    return {"requests": dict(wanted), "limits": dict(wanted)}


def env_of(pod, field="containers", i=0):
    return pod["spec"][field][i].get("env")


def injected(devices):
    return [{"name": CVD, "value": devices}, {"name": CDO, "value": "PCI_BUS_ID"}]


def assert_stable(pod):
    """Applying the pod's own patch again changes nothing, and the webhook has nothing more to add."""
    _, decision, patched = admit(pod)
    assert apply_patch(patched, list(decision.patch)) == patched
    _, again, repatched = admit(patched)
    assert again.patch == ()
    assert repatched == patched
    return patched


# --------------------------------------------------------------------------- the test patch applier

@pytest.mark.parametrize("doc, patch, expected", [
    ({"a": 1}, [{"op": "add", "path": "/b", "value": 2}], {"a": 1, "b": 2}),
    ({"a": 1}, [{"op": "add", "path": "/a", "value": 2}], {"a": 2}),
    ({"a": 1}, [{"op": "replace", "path": "/a", "value": [3]}], {"a": [3]}),
    ({"a": 1, "b": 2}, [{"op": "remove", "path": "/a"}], {"b": 2}),
    ({"l": [1, 3]}, [{"op": "add", "path": "/l/1", "value": 2}], {"l": [1, 2, 3]}),
    ({"l": [1, 3]}, [{"op": "add", "path": "/l/2", "value": 4}], {"l": [1, 3, 4]}),
    ({"l": [1]}, [{"op": "add", "path": "/l/-", "value": 2}], {"l": [1, 2]}),
    ({"l": [1, 2]}, [{"op": "replace", "path": "/l/0", "value": 9}], {"l": [9, 2]}),
    ({"l": [1, 2]}, [{"op": "remove", "path": "/l/0"}], {"l": [2]}),
    ({"m": {}}, [{"op": "add", "path": "/m/a~1b", "value": 1}], {"m": {"a/b": 1}}),
    ({"m": {}}, [{"op": "add", "path": "/m/a~0b", "value": 1}], {"m": {"a~b": 1}}),
    ({"m": {}}, [{"op": "add", "path": "/m/~01", "value": 1}], {"m": {"~1": 1}}),
    ({"m": {"": 0}}, [{"op": "replace", "path": "/m/", "value": 1}], {"m": {"": 1}}),
    ({"a": 1}, [{"op": "add", "path": "", "value": [1]}], [1]),
    ({"a": {"b": [{"c": 1}]}}, [{"op": "add", "path": "/a/b/0/d", "value": 2}], {"a": {"b": [{"c": 1, "d": 2}]}}),
])
def test_jsonpatch_helper(doc, patch, expected):
    original = copy.deepcopy(doc)
    assert apply_patch(doc, patch) == expected
    assert doc == original  # never modified in place


@pytest.mark.parametrize("doc, op", [
    ({}, {"op": "add", "path": "/a/b", "value": 1}),
    ({}, {"op": "replace", "path": "/a", "value": 1}),
    ({}, {"op": "remove", "path": "/a"}),
    ({}, {"op": "move", "from": "/a", "path": "/b"}),
    ({}, {"op": "add", "path": "/a"}),
    ({}, {"op": "add", "path": "a", "value": 1}),
    ({}, {"op": "remove", "path": ""}),
    ({"l": [1]}, {"op": "add", "path": "/l/2", "value": 1}),
    ({"l": [1]}, {"op": "add", "path": "/l/01", "value": 1}),
    ({"l": [1]}, {"op": "add", "path": "/l/x", "value": 1}),
    ({"l": [1]}, {"op": "replace", "path": "/l/1", "value": 1}),
    ({"l": [1]}, {"op": "replace", "path": "/l/-", "value": 1}),
    ({"l": [1]}, {"op": "remove", "path": "/l/1"}),
    ({"l": [1]}, {"op": "add", "path": "/l/5/a", "value": 1}),
    ({"s": "x"}, {"op": "add", "path": "/s/a", "value": 1}),
    ({"s": "x"}, {"op": "add", "path": "/s/a/b", "value": 1}),
])
def test_jsonpatch_helper_refuses(doc, op):
    with pytest.raises(PatchError):
        apply_patch(doc, [op])


def test_jsonpatch_pointer_unescapes_tilde_one_before_tilde_zero():
    assert parse_pointer("/a~01/b~10") == ["a~1", "b/0"]
    assert parse_pointer("") == []
    assert parse_pointer("/") == [""]


# --------------------------------------------------------------------------- the captured request

def test_captured_admission_review():
    body = json.loads((SAMPLES / "admissionreview-v1-create-gpu-scheduler-check-3.json").read_text())
    pod = body["request"]["object"]
    response, decision = admission_response(body)
    assert response["apiVersion"] == V1 and response["kind"] == "AdmissionReview"
    assert set(response["response"]) == {"uid", "allowed", "patchType", "patch", "warnings"}
    assert response["response"]["uid"] == "169b50ab-3a28-464c-a2f7-f932a478b696"
    assert response["response"]["allowed"] is True
    assert decision.reason == "Placed" and decision.warnings == (SHARED[3],)
    assert response["response"]["warnings"] == [SHARED[3]]

    patched = apply_patch(pod, decode_patch(response))
    assert patched["spec"]["containers"][0]["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
        {"name": CVD, "value": "3"},
        {"name": CDO, "value": "PCI_BUS_ID"},
    ]
    assert patched["metadata"]["labels"] == {**pod["metadata"]["labels"], MANAGED: "true"}
    # The one GPU of its entry, counted for the namespace's ResourceQuota (node unknown: no GPU type).
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {**pod["spec"]["containers"][0]["resources"].get("requests", {}), GPU: "1"}
    assert resources["limits"] == {**pod["spec"]["containers"][0]["resources"].get("limits", {}), GPU: "1"}
    # nothing else changed
    for changed in (patched, pod):
        del changed["spec"]["containers"][0]["env"]
        del changed["spec"]["containers"][0]["resources"]
        del changed["metadata"]["labels"]
    assert patched == pod


def test_captured_admission_review_is_stable():
    body = json.loads((SAMPLES / "admissionreview-v1-create-gpu-scheduler-check-3.json").read_text())
    patched = assert_stable(body["request"]["object"])
    assert patched["spec"]["containers"][0]["env"][1:] == injected("3")


# --------------------------------------------------------------------------- placed pods

@pytest.mark.parametrize("index, devices", sorted(SEED_DEVICES.items()))
def test_seed_indexes_get_their_devices(index, devices):
    response, decision, patched = admit(make_pod(f"gpu-scheduler-check-{index}"))
    assert response["response"]["allowed"] is True
    expected_warnings = (SHARED[index],) if index in SHARED else ()
    assert decision == Decision(True, decision.patch, expected_warnings, "", "Placed")
    assert env_of(patched) == injected(devices)
    assert patched["metadata"]["labels"] == {MANAGED: "true"}


@pytest.mark.parametrize("version", [V1, V1BETA1])
def test_answers_in_the_version_asked(version):
    response, _, patched = admit(make_pod("web-2"), version=version, uid="abc-123")
    assert response["apiVersion"] == version
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "abc-123"
    assert env_of(patched) == injected("0,1,2")


def test_every_container_and_init_container():
    pod = make_pod("web-0",
                   init_containers=[container("init-a"), container("init-b", env=[{"name": "X", "value": "1"}])],
                   containers=[container("a", env=[]), container("b"), container("c", env=[{"name": "Y", "value": "2"}])])
    patched = assert_stable(pod)
    assert [c.get("env") for c in patched["spec"]["initContainers"]] == [
        injected("0,1"), [{"name": "X", "value": "1"}, *injected("0,1")]]
    assert [c.get("env") for c in patched["spec"]["containers"]] == [
        injected("0,1"), injected("0,1"), [{"name": "Y", "value": "2"}, *injected("0,1")]]
    assert [c["name"] for c in patched["spec"]["containers"]] == ["a", "b", "c"]


OTHER = {"name": "OTHER", "value": "x"}
FROM_FIELD = {"name": CVD, "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}}}


@pytest.mark.parametrize("env, expected", [
    pytest.param(None, injected("2"), id="no env"),
    pytest.param([], injected("2"), id="empty env"),
    pytest.param([OTHER], [OTHER, *injected("2")], id="other variables kept first"),
    pytest.param([{"name": CVD, "value": "7"}, OTHER], [{"name": CVD, "value": "2"}, OTHER, injected("2")[1]],
                 id="existing value replaced in place"),
    pytest.param([OTHER, FROM_FIELD], [OTHER, {"name": CVD, "value": "2"}, injected("2")[1]],
                 id="valueFrom replaced by value"),
    pytest.param([{"name": CVD, "value": "7"}, OTHER, {"name": CVD, "value": "8"}, FROM_FIELD],
                 [{"name": CVD, "value": "2"}, OTHER, injected("2")[1]], id="duplicates collapsed"),
    pytest.param([{"name": CDO, "value": "FASTEST_FIRST"}, OTHER],
                 [{"name": CDO, "value": "PCI_BUS_ID"}, OTHER, {"name": CVD, "value": "2"}],
                 id="device order replaced in place"),
    pytest.param([{"name": CDO, "value": "PCI_BUS_ID"}, {"name": CVD, "value": "2"}],
                 [{"name": CDO, "value": "PCI_BUS_ID"}, {"name": CVD, "value": "2"}], id="already right"),
    pytest.param([{"name": CVD, "value": "2", "valueFrom": {}}, injected("2")[1]], injected("2"),
                 id="value and valueFrom both set"),
    pytest.param(["junk", 3, None, {"value": "no name"}, {"name": ["x"]}, {"name": {"n": 1}}],
                 ["junk", 3, None, {"value": "no name"}, {"name": ["x"]}, {"name": {"n": 1}}, *injected("2")],
                 id="entries that are not env vars kept"),
    pytest.param({"CUDA_VISIBLE_DEVICES": "1"}, injected("2"), id="env not a list"),
    pytest.param("nonsense", injected("2"), id="env a string"),
])
def test_env(env, expected):
    pod = make_pod("web-1", containers=[container("c", env=env)], init_containers=[container("i", env=env)])
    if env is None:
        assert "env" not in pod["spec"]["containers"][0]
    patched = assert_stable(pod)
    assert env_of(patched) == expected
    assert env_of(patched, "initContainers") == expected


def test_patch_changes_only_what_it_must():
    pod = make_pod("web-1", containers=[container("a", env=injected("2")), container("b")],
                   labels={"app": "web", MANAGED: "true"})
    assert patch_for(pod, device_env(Placement("node2", ("2",)))) == [
        {"op": "add", "path": "/spec/containers/1/env", "value": injected("2")}]


def test_containers_that_are_not_objects_are_skipped_without_shifting_indexes():
    pod = make_pod("web-1", containers=["junk", container("b"), None, container("d")])
    patched = assert_stable(pod)
    assert patched["spec"]["containers"] == ["junk", container("b", env=injected("2")), None,
                                             container("d", env=injected("2"))]


@pytest.mark.parametrize("containers", [None, {"name": "c"}, "c"])
def test_container_lists_that_are_not_lists_are_skipped(containers):
    pod = make_pod("web-1")
    pod["spec"]["containers"] = containers
    response, decision, patched = admit(pod)
    assert decision.patch == ({"op": "add", "path": "/metadata/labels", "value": {MANAGED: "true"}},)
    assert patched["spec"]["containers"] == containers


@pytest.mark.parametrize("labels, expected_ops, expected", [
    pytest.param(None, [{"op": "add", "path": "/metadata/labels", "value": {MANAGED: "true"}}],
                 {MANAGED: "true"}, id="no labels"),
    pytest.param({}, [{"op": "add", "path": "/metadata/labels/gpu-scheduler~1managed", "value": "true"}],
                 {MANAGED: "true"}, id="empty labels"),
    pytest.param({"app": "web"}, [{"op": "add", "path": "/metadata/labels/gpu-scheduler~1managed", "value": "true"}],
                 {"app": "web", MANAGED: "true"}, id="other labels kept"),
    pytest.param({MANAGED: "false"}, [{"op": "add", "path": "/metadata/labels/gpu-scheduler~1managed", "value": "true"}],
                 {MANAGED: "true"}, id="wrong value replaced"),
    pytest.param({MANAGED: "true", "app": "web"}, [], {MANAGED: "true", "app": "web"}, id="already labelled"),
    pytest.param(["x"], [{"op": "add", "path": "/metadata/labels", "value": {MANAGED: "true"}}],
                 {MANAGED: "true"}, id="labels not an object"),
])
def test_managed_label(labels, expected_ops, expected):
    # A pod with everything else mutate sets already (its env, its counted GPU): only the label is added.
    pod = make_pod("web-1", containers=[container(env=injected("2"), resources=counted_gpus(1))], labels=labels)
    if labels is None:
        assert "labels" not in pod["metadata"]
    _, decision, patched = admit(pod)
    assert list(decision.patch) == expected_ops
    assert patched["metadata"]["labels"] == expected
    assert_stable(pod)


def test_labels_null_is_replaced():
    pod = make_pod("web-1")
    pod["metadata"]["labels"] = None
    assert assert_stable(pod)["metadata"]["labels"] == {MANAGED: "true"}


def test_uuid_devices():
    gpu = "GPU-4c0f6a8e-2f3b-4d1e-9a7c-0123456789ab"
    mig = "MIG-GPU-4c0f6a8e-2f3b-4d1e-9a7c-0123456789ab/1/0"
    _, _, patched = admit(make_pod("web-0", map_text=f"0=n:{gpu},{mig}"))
    assert env_of(patched) == injected(f"{gpu},{mig}")


# --------------------------------------------------------------------------- pods not placed

def test_pod_without_annotation_is_allowed_unchanged():
    response, decision, patched = admit(make_pod("web-1", map_text=None, annotations={"other": "x"}))
    assert response == {"apiVersion": V1, "kind": "AdmissionReview", "response": {"uid": "uid-1", "allowed": True}}
    assert decision == Decision(True, reason="NoAnnotation")


def test_annotation_null_counts_as_absent():
    pod = make_pod("web-1", map_text=None, annotations={"gpu-scheduling-map": None})
    assert admit(pod)[1] == Decision(True, reason="NoAnnotation")


@pytest.mark.parametrize("map_value, message", [
    ("0=node1:0\n1=Node2:1",
     "invalid gpu-scheduling-map annotation: line 2 '1=Node2:1': node name 'Node2' is not a valid Kubernetes "
     "node name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"),
    ("0=a:0\n0=b:1", "invalid gpu-scheduling-map annotation: line 2 '0=b:1': pod index 0 is already mapped on line 1"),
    ("", "invalid gpu-scheduling-map annotation: the map has no entries"),
    (5, "invalid gpu-scheduling-map annotation: the annotation value must be a string, not int"),
])
def test_malformed_map_is_denied(map_value, message):
    response, decision, patched = admit(make_pod("web-1", map_text=map_value))
    assert response["response"] == {"uid": "uid-1", "allowed": False,
                                    "status": {"code": 400, "reason": "BadRequest", "message": message}}
    assert decision == Decision(False, message=message, reason="MalformedMap")
    assert patched == make_pod("web-1", map_text=map_value)


def test_malformed_map_is_denied_for_any_scheduler_and_any_index():
    for pod in (make_pod(None, generate_name="web-", map_text="x"), make_pod("web-1", map_text="x", scheduler=None)):
        response, decision, _ = admit(pod)
        assert response["response"]["allowed"] is False
        assert decision.reason == "MalformedMap" and decision.warnings == ()


@pytest.mark.parametrize("pod, reason, why", [
    (make_pod(None, generate_name="web-"), "UnknownIndex",
     "the pod has no name yet (only generateName 'web-'), so its index is unknown; use a StatefulSet, an Indexed Job, a JobSet or a LeaderWorkerSet, or name the label that holds the index in gpu-scheduler/index-label"),
    (make_pod("web"), "UnknownIndex",
     "pod name 'web' does not end in -<index> and the pod has no apps.kubernetes.io/pod-index label or "
     "batch.kubernetes.io/job-completion-index annotation"),
    (make_pod("web-7"), "NoMapEntry",
     "pod index 7 has no entry in the gpu-scheduling-map annotation (entries: 0, 1, 2, 3, 4)"),
])
def test_unplaceable_pod_is_allowed_with_a_warning(pod, reason, why):
    response, decision, patched = admit(pod)
    warning = f"gpu-scheduler: {why}; CUDA_VISIBLE_DEVICES not set"
    assert response["response"]["warnings"] == [warning] and response["response"]["allowed"] is True
    # Only the label, so that bind hears of the pod and can say why it waits.
    assert decision == Decision(True, tuple(LABEL_ONLY), (warning,), reason=reason)
    assert patched == {**pod, "metadata": {**pod["metadata"], "labels": {MANAGED: "true"}}}


SCHEDULER_WARNING = ("pod has the gpu-scheduling-map annotation but spec.schedulerName is not 'gpu-scheduler':"
                     " its node is not enforced")


@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "Gpu-Scheduler"])
def test_other_scheduler_is_placed_with_a_warning(scheduler):
    response, decision, patched = admit(make_pod("web-4", scheduler=scheduler))
    assert response["response"]["warnings"] == [SCHEDULER_WARNING, SHARED[4]]
    assert decision.reason == "Placed" and decision.warnings == (SCHEDULER_WARNING, SHARED[4])
    assert env_of(patched) == injected("3")


def test_other_scheduler_and_unknown_index_gives_both_warnings():
    _, decision, _ = admit(make_pod("web-9", scheduler="default-scheduler"))
    assert decision.warnings == (
        SCHEDULER_WARNING,
        "gpu-scheduler: pod index 9 has no entry in the gpu-scheduling-map annotation (entries: 0, 1, 2, 3, 4);"
        " CUDA_VISIBLE_DEVICES not set")
    assert decision.reason == "NoMapEntry" and list(decision.patch) == []


@pytest.mark.parametrize("scheduler", [None, "default-scheduler"])
def test_another_schedulers_pod_is_not_labelled_for_the_event_source(scheduler):
    """The label is what the ApiServerSource selects: a pod bind never places would cost bind an
    answer for each of its events (issue 62)."""
    _, _, patched = admit(make_pod("web-1", scheduler=scheduler))
    assert MANAGED not in (patched["metadata"].get("labels") or {})
    _, _, ours = admit(make_pod("web-1"))
    assert ours["metadata"]["labels"][MANAGED] == "true"


@pytest.mark.parametrize("pod", [
    make_pod("web-1"), make_pod("web-1", map_text="x"), make_pod("web-9"), make_pod("web-1", map_text=None)])
def test_dry_run_gets_the_same_answer(pod):
    real = admission_response(make_review(pod, dry_run=False))
    dry = admission_response(make_review(pod, dry_run=True))
    absent = admission_response(make_review(pod))
    assert real == dry == absent
    assert parse_review(make_review(pod, dry_run=True)).dry_run is True


@pytest.mark.parametrize("dry_run, expected", [(True, True), (False, False), (None, False), ("true", False), (1, False)])
def test_dry_run_flag(dry_run, expected):
    assert parse_review(make_review(make_pod(), dry_run=dry_run)).dry_run is expected


@pytest.mark.parametrize("review_args", [
    {"operation": "UPDATE"}, {"operation": "DELETE"}, {"operation": "CONNECT"},
    {"resource": "deployments"}, {"resource": "pods", "sub_resource": "binding"},
    {"resource": "pods", "sub_resource": "status"}, {"operation": "create"},
])
def test_requests_other_than_pod_create_are_allowed_untouched(review_args):
    pod = make_pod("web-1", map_text="malformed")  # not even looked at
    response, decision = admission_response(make_review(pod, **review_args))
    assert response["response"] == {"uid": "uid-1", "allowed": True}
    assert decision == Decision(True, reason="NotAPodCreate")


@pytest.mark.parametrize("resource", [None, "pods", ["pods"]])
def test_resource_that_is_not_an_object_is_not_a_pod_create(resource):
    body = make_review(make_pod("web-1"))
    body["request"]["resource"] = resource
    review = parse_review(body)
    assert (review.resource, review.pod) == ("", None)


def test_delete_needs_no_object():
    body = make_review(None, operation="DELETE")
    assert parse_review(body) == Review(V1, "uid-1", "DELETE", "pods", None, False)


def test_parse_review_keeps_what_the_decision_needs():
    pod = make_pod("web-1")
    review = parse_review(make_review(pod, version=V1BETA1, uid="u", dry_run=True))
    assert review == Review(V1BETA1, "u", "CREATE", "pods", pod, True)
    assert review.pod is make_review(pod)["request"]["object"]


# --------------------------------------------------------------------------- malformed reviews

def _review_with(path: str, value, *, delete=False) -> dict:
    body = make_review(make_pod("web-1"))
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    if delete:
        del node[last]
    else:
        node[last] = value
    return body


@pytest.mark.parametrize("body, message", [
    ([], "body: expected a JSON object (an AdmissionReview), found list"),
    (None, "body: expected a JSON object (an AdmissionReview), found NoneType"),
    ("AdmissionReview", "body: expected a JSON object (an AdmissionReview), found str"),
    (_review_with("kind", None, delete=True), "kind: expected 'AdmissionReview', found None"),
    (_review_with("kind", "Pod"), "kind: expected 'AdmissionReview', found 'Pod'"),
    (_review_with("apiVersion", None, delete=True),
     "apiVersion: expected one of admission.k8s.io/v1, admission.k8s.io/v1beta1, found None"),
    (_review_with("apiVersion", "admission.k8s.io/v2"),
     "apiVersion: expected one of admission.k8s.io/v1, admission.k8s.io/v1beta1, found 'admission.k8s.io/v2'"),
    (_review_with("request", None, delete=True), "request: expected an object, found missing"),
    (_review_with("request", None), "request: expected an object, found a NoneType"),
    (_review_with("request", []), "request: expected an object, found a list"),
    (_review_with("request.uid", None, delete=True), "request.uid: expected a string, found missing"),
    (_review_with("request.uid", 42), "request.uid: expected a string, found a int"),
    (_review_with("request.uid", ""), "request.uid: must not be empty"),
    (_review_with("request.operation", None, delete=True), "request.operation: expected a string, found missing"),
    (_review_with("request.operation", ["CREATE"]), "request.operation: expected a string, found a list"),
    (_review_with("request.object", None, delete=True), "request.object: expected an object, found missing"),
    (_review_with("request.object", None), "request.object: expected an object, found a NoneType"),
    (_review_with("request.object", "pod"), "request.object: expected an object, found a str"),
    (_review_with("request.object.spec", None, delete=True),
     "request.object.spec: expected an object, the pod being created has none"),
    (_review_with("request.object.spec", []), "request.object.spec: expected an object, the pod being created has none"),
])
def test_malformed_review(body, message):
    with pytest.raises(ReviewError) as caught:
        admission_response(body)
    assert str(caught.value) == message


def test_review_error_is_a_value_error():
    assert issubclass(ReviewError, ValueError)


def test_optional_field():
    assert checked_field({}, "x", "p.", dict, required=False) is None
    assert checked_field({"x": None}, "x", "p.", dict, required=False) is None
    assert checked_field({"x": {"a": 1}}, "x", "p.", dict, required=False) == {"a": 1}
    with pytest.raises(ReviewError, match=r"^p\.x: expected an object, found a int$"):
        checked_field({"x": 1}, "x", "p.", dict, required=False)


# --------------------------------------------------------------------------- response_for

def test_response_for_a_denial_and_a_patch():
    review = Review(V1BETA1, "u-9", "CREATE", "pods", {}, False)
    assert response_for(review, Decision(False, message="no", reason="MalformedMap")) == {
        "apiVersion": V1BETA1, "kind": "AdmissionReview",
        "response": {"uid": "u-9", "allowed": False, "status": {"code": 400, "reason": "BadRequest", "message": "no"}}}
    ops = ({"op": "add", "path": "/a", "value": "é"},)
    response = response_for(review, Decision(True, ops, ("w",)))
    assert response["response"]["warnings"] == ["w"]
    assert json.loads(base64.b64decode(response["response"]["patch"], validate=True)) == list(ops)


def test_decide_without_a_pod():
    assert decide(Review(V1, "u", "UPDATE", "pods", None, False)) == Decision(True, reason="NotAPodCreate")


# --------------------------------------------------------------------------- properties

env_names = st.sampled_from([CVD, CDO, "OTHER", "PATH", "cuda_visible_devices"])
env_entries = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, env_names, st.sampled_from(["", "0", "3", "PCI_BUS_ID", "x"])),
    st.builds(lambda n: {"name": n, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, env_names),
    st.sampled_from(["junk", None, {"value": "nameless"}]),
)
containers = st.lists(st.builds(lambda i, env: container(f"c{i}", env=env), st.integers(0, 9),
                                st.one_of(st.none(), st.lists(env_entries, max_size=6))), max_size=3)
label_sets = st.one_of(st.none(), st.dictionaries(st.sampled_from([MANAGED, "app"]), st.sampled_from(["true", "x"])))


@given(st.integers(0, 6), containers, containers, label_sets)
def test_patch_is_idempotent_and_complete(index, regular, init, labels):
    pod = make_pod(f"web-{index}", containers=regular, init_containers=init, labels=labels)
    response, decision, patched = admit(pod)
    if index not in SEED_DEVICES:
        assert decision.reason == "NoMapEntry"
        assert patched["spec"] == pod["spec"] and patched["metadata"]["labels"][MANAGED] == "true"
        return
    assert decision.reason == "Placed"
    assert assert_stable(pod) == patched
    assert patched["metadata"]["labels"][MANAGED] == "true"
    for field in ("containers", "initContainers"):
        for before, after in zip(pod["spec"][field], patched["spec"][field]):
            env = after["env"]
            named = [e for e in env if isinstance(e, dict) and e.get("name") in (CVD, CDO)]
            assert sorted(named, key=lambda e: e["name"]) == [
                {"name": CDO, "value": "PCI_BUS_ID"}, {"name": CVD, "value": SEED_DEVICES[index]}]
            others = [e for e in before.get("env") or [] if not (isinstance(e, dict) and e.get("name") in (CVD, CDO))]
            assert [e for e in env if e not in named] == others  # everything else kept, in order


@pytest.mark.parametrize("request_fields, metadata, expected", [
    ({"namespace": "ns", "name": "web-1"}, {"name": "web-1"}, "ns/web-1"),
    ({"namespace": "ns", "name": ""}, {"generateName": "web-"}, "ns/web-*"),
    ({"namespace": 5, "name": None}, "not an object", "/"),
    ({}, {"generateName": 7}, "/"),
])
def test_the_pod_name_for_logs_is_derived_safely(request_fields, metadata, expected):
    body = make_review(make_pod("web-1"))
    body["request"].update(request_fields)
    for key in ("name", "namespace"):
        if key not in request_fields:
            body["request"].pop(key, None)
    body["request"]["object"]["metadata"] = metadata
    assert parse_review(body).pod_name == expected


@pytest.mark.parametrize("pod_spec, warned", [
    ({"nodeSelector": {"kubernetes.io/hostname": "node9"}}, True),
    ({"nodeSelector": {"kubernetes.io/hostname": "node2"}}, False),
    ({"nodeSelector": {"zone": "b"}}, False),  # only the node object knows: bind says it
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node2"]}]}]}}}}, True),
])
def test_a_selector_that_excludes_the_entrys_node_is_warned_with_binds_reason(pod_spec, warned):
    pod = make_pod("web-1")  # index 1 of the seed: node2
    pod["spec"].update(pod_spec)
    response, decision, patched = admit(pod)
    found = [w for w in decision.warnings if "didn't match Pod's node affinity/selector" in w]
    assert bool(found) == warned and decision.allowed
    if warned:
        assert found[0].endswith("excludes node node2; the pod will stay Pending") or "matches node node2" in found[0]
        assert env_of(patched)  # still admitted with its env: the selector may be fixed before bind


# --------------------------------------------------------------------------- DRA mode

DRA_ANNOTATIONS = {"gpu-scheduler/device-env": "dra"}
POD_CLAIM = {"name": "gpu-scheduler", "resourceClaimName": "web-1-gpus"}


def dra_pod(**fields):
    return make_pod(annotations=DRA_ANNOTATIONS, **fields)


def test_dra_mode_claims_the_pods_claim_in_every_container_and_renumbers_from_zero():
    pod = dra_pod(containers=[container("a"), container("b", resources={"limits": {"cpu": "1"}})],
                  init_containers=[container("init", resources={"claims": [{"name": "other"}]})])
    pod["spec"]["resourceClaims"] = [{"name": "other", "resourceClaimName": "x"}]
    response, decision, patched = admit(pod)
    assert decision.allowed and decision.reason == "Placed"
    assert patched["spec"]["resourceClaims"] == [{"name": "other", "resourceClaimName": "x"}, POD_CLAIM]
    for field, i in (("containers", 0), ("containers", 1), ("initContainers", 0)):
        c = patched["spec"][field][i]
        assert {"name": "gpu-scheduler"} in c["resources"]["claims"]
        assert env_of(patched, field, i) == injected("0")  # web-1 is index 1 -> node2:2, seen as 0
    assert patched["spec"]["containers"][1]["resources"]["limits"] == {"cpu": "1"}
    assert patched["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "other"}, {"name": "gpu-scheduler"}]
    assert_stable(pod)


def test_dra_mode_sets_no_nvidia_visible_devices_and_counts_from_zero():
    pod = dra_pod(name="web-2")  # index 2 -> node3:0,1,2
    _, _, patched = admit(pod)
    assert env_of(patched) == injected("0,1,2")
    assert patched["spec"]["resourceClaims"] == [{"name": "gpu-scheduler", "resourceClaimName": "web-2-gpus"}]


def test_dra_mode_as_the_cluster_default():
    pod = make_pod()
    response, decision = admission_response(make_review(pod), default_mode="dra")
    patched = apply_patch(pod, list(decision.patch))
    assert patched["spec"]["resourceClaims"] == [POD_CLAIM]


def test_dra_mode_without_a_pod_name_is_denied_clearly():
    pod = dra_pod(name=None, generate_name="job-", labels={"batch.kubernetes.io/job-completion-index": "1"})
    response, decision, _ = admit(pod)
    assert not decision.allowed and decision.reason == "InvalidDRAClaim"
    assert "generateName" in decision.message and response["response"]["status"]["code"] == 400


def test_dra_mode_refuses_an_entry_of_its_name_for_another_claim():
    pod = dra_pod()
    pod["spec"]["resourceClaims"] = [{"name": "gpu-scheduler", "resourceClaimName": "mine"}]
    _, decision, _ = admit(pod)
    assert not decision.allowed and "already has an entry named 'gpu-scheduler'" in decision.message


def test_dra_mode_keeps_an_entry_already_as_wanted():
    pod = dra_pod()
    pod["spec"]["resourceClaims"] = [dict(POD_CLAIM)]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu-scheduler"}]}
    _, decision, patched = admit(pod)
    assert [op for op in decision.patch if "laim" in op["path"]] == []


def test_dra_mode_a_pod_without_an_entry_gets_only_the_label():
    pod = dra_pod(name="web-9")
    _, decision, patched = admit(pod)
    assert decision.allowed and "resourceClaims" not in patched["spec"]


def test_env_modes_add_no_claims():
    for mode in ("cuda", "nvidia"):
        pod = make_pod(annotations={"gpu-scheduler/device-env": mode})
        _, _, patched = admit(pod)
        assert "resourceClaims" not in patched["spec"] and "claims" not in patched["spec"]["containers"][0]["resources"]


def test_device_env_in_dra_mode():
    assert device_env(Placement("n", ("4", "7")), "dra") == {CVD: "0,1", CDO: "PCI_BUS_ID"}


# --------------------------------------------------------------------------- gangs (docs/gangs.md)

GANG = "gpu-scheduler/gang"
GANG_FIX = ('set gpu-scheduler/gang to "true" (the gang is every pod of the workload), to the number of replicas the'
            ' gang needs, or to "false"')


@pytest.mark.parametrize("value", ["true", "false", "1", "3", "5"])
def test_a_well_formed_gang_is_placed_as_any_replica(value):
    plain = admit(make_pod("web-1"))[1]
    response, decision, patched = admit(make_pod("web-1", annotations={GANG: value}))
    assert decision == plain and response["response"]["allowed"] is True
    assert env_of(patched) == injected("2")


@pytest.mark.parametrize("value, message", [
    ("yes", f"gpu-scheduler/gang: 'yes' is not a gang size: {GANG_FIX}"),
    ("True", f"gpu-scheduler/gang: 'True' is not a gang size: {GANG_FIX}"),
    ("", f"gpu-scheduler/gang: '' is not a gang size: {GANG_FIX}"),
    ("-2", f"gpu-scheduler/gang: '-2' is not a gang size: {GANG_FIX}"),
    (" 3", f"gpu-scheduler/gang: ' 3' is not a gang size: {GANG_FIX}"),
    ("٣", f"gpu-scheduler/gang: '٣' is not a gang size: {GANG_FIX}"),  # a digit, but not an ASCII one
    (3, f"gpu-scheduler/gang: 3 is not a gang size: {GANG_FIX}"),
    ("0", f"gpu-scheduler/gang: '0' must be from 1 to the map's 5 entries: {GANG_FIX}"),
    ("6", f"gpu-scheduler/gang: '6' must be from 1 to the map's 5 entries: {GANG_FIX}"),
    ("9" * 40, f"gpu-scheduler/gang: '{'9' * 40}' must be from 1 to the map's 5 entries: {GANG_FIX}"),
])
def test_a_malformed_gang_is_denied_with_the_fix(value, message):
    pod = make_pod("web-1", annotations={GANG: value})
    response, decision, patched = admit(pod)
    assert response["response"] == {"uid": "uid-1", "allowed": False,
                                    "status": {"code": 400, "reason": "BadRequest", "message": message}}
    assert decision == Decision(False, message=message, reason="InvalidGang")
    assert patched == pod


@pytest.mark.parametrize("pod", [
    make_pod(None, generate_name="web-", annotations={GANG: "many"}),  # index unknown: else allowed, unplaced
    make_pod("web-7", annotations={GANG: "many"}),                    # no map entry: likewise
    make_pod("web-1", annotations={GANG: "many"}, scheduler=None),    # another scheduler's pod
])
@pytest.mark.parametrize("dry_run", [None, True])
def test_a_malformed_gang_is_denied_whatever_else_the_pod_is(pod, dry_run):
    _, decision, _ = admit(pod, dry_run=dry_run)
    assert decision.allowed is False and decision.reason == "InvalidGang"
    assert "'many' is not a gang size" in decision.message and decision.patch == ()


def test_a_malformed_map_is_denied_for_the_map_before_the_gang():
    _, decision, _ = admit(make_pod("web-1", map_text="x", annotations={GANG: "many"}))
    assert decision.reason == "MalformedMap"


def test_a_gang_on_a_pod_without_the_map_is_not_ours():
    assert admit(make_pod("web-1", map_text=None, annotations={GANG: "many"}))[1] == Decision(True, reason="NoAnnotation")
