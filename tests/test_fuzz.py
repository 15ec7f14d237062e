"""Property-based tests of both HTTP handlers, in the real functions-framework app: random
bytes, random JSON, random CloudEvents, truncated and oversized bodies. Nothing escapes as a 500,
and every rejection says why. Also: the webhook only ever writes the variables it owns, with
values the grammar accepted."""
from __future__ import annotations

import base64
import copy
import json
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import sample
from gpu_scheduler.quota import is_quota_resource

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
REVIEW = sample("admissionreview-v1-create-gpu-scheduler-check-3.json")
ADD = sample("apiserversource-add-gpu-scheduler-check-0.json")
OWNED = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"}
SAFE_VALUE = re.compile(r"[0-9A-Za-z,/\-_]*")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)
map_lines = st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda i, n, d: f"{i}={n}:{d}", st.integers(-2, 6), st.sampled_from(["node1", "Node_1", "", "a" * 300]),
              st.sampled_from(["0", "0,1", "1,1", "", "GPU-x", "007", "3 , 2"]))), max_size=6)


@pytest.fixture(scope="module")
def clients(inprocess_apps):
    return inprocess_apps.mutate, inprocess_apps.bind


def no_crash(response) -> bool:
    """A 503 from the API being unreachable is an answer; one from the catch-all is a bug."""
    return b"internal error" not in response.data


def rejected_clearly(response) -> bool:
    body = response.get_json(silent=True)
    return response.status_code in (400, 405, 413) and isinstance(body, dict) and bool(body.get("error"))


@SETTINGS
@given(st.binary(max_size=2000))
def test_mutate_random_bytes(clients, raw):
    response = clients[0].post("/", data=raw, content_type="application/json")
    assert response.status_code == 200 or rejected_clearly(response)


@SETTINGS
@given(json_values)
def test_mutate_random_json(clients, value):
    response = clients[0].post("/", data=json.dumps(value), content_type="application/json")
    assert response.status_code == 200 or rejected_clearly(response)


@SETTINGS
@given(st.integers(0, len(json.dumps(REVIEW)) - 1))
def test_mutate_truncated_review(clients, cut):
    response = clients[0].post("/", data=json.dumps(REVIEW)[:cut], content_type="application/json")
    assert rejected_clearly(response)
    assert "malformed JSON" in response.get_json()["error"]


def review_with(annotations, labels, containers, name):
    review = copy.deepcopy(REVIEW)
    obj = review["request"]["object"]
    obj["metadata"].update(annotations=annotations, labels=labels, name=name)
    obj["spec"]["containers"] = containers
    return review


containers = st.lists(st.fixed_dictionaries({"name": st.text(max_size=5)}, optional={
    "env": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["A", "CUDA_VISIBLE_DEVICES", "B"])},
                                          optional={"value": st.text(max_size=10)}), max_size=4)}), max_size=3)


def assert_only_quota_requests(op: dict) -> None:
    """mutate's other write: the quota requests and limits of the first container (gpu_scheduler/
    quota.py), each a count, and nothing of the container's own resources changed."""
    def counts(value) -> None:
        assert isinstance(value, dict) and all(is_quota_resource(k) and str(v).isdigit() for k, v in value.items()), op
    path, value = op["path"].removeprefix("/spec/containers/0/resources"), op["value"]
    if path == "":
        assert value == {} or set(value) == {"requests", "limits"}, op
        for kind in value.values():
            counts(kind)
    elif path in ("/requests", "/limits"):
        counts(value)
    else:
        kind, _, name = path.lstrip("/").partition("/")
        assert kind in ("requests", "limits") and is_quota_resource(name.replace("~1", "/")), op
        assert str(value).isdigit(), op


@SETTINGS
@given(map_lines, st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2), containers,
       st.sampled_from(["w-0", "w-3", "w", "", "w-12"]), st.sampled_from([None, "cuda", "nvidia", "x"]))
@example(["0=0:0"], {}, [{"name": ""}], "w-0", None)  # found by CI: a placed pod's quota requests
def test_mutate_only_writes_what_it_owns(clients, lines, labels, pods_containers, name, mode):
    annotations = {"gpu-scheduling-map": "\n".join(lines)}
    if mode:
        annotations["gpu-scheduler/device-env"] = mode
    review = review_with(annotations, labels, pods_containers, name)
    response = clients[0].post("/", json=review)
    assert response.status_code == 200
    answer = response.get_json()["response"]
    assert answer["uid"] == review["request"]["uid"]
    if not answer["allowed"]:
        assert answer["status"]["message"]
        return
    for op in json.loads(base64.b64decode(answer.get("patch", "W10="))):
        assert op["op"] == "add"
        if op["path"].startswith("/metadata/labels"):
            assert op["value"] in ("true", {"gpu-scheduler/managed": "true"})
            continue
        if op["path"].startswith("/spec/containers/0/resources"):
            assert_only_quota_requests(op)
            continue
        index = int(re.fullmatch(r"/spec/containers/(\d+)/env", op["path"]).group(1))
        before = [v for v in pods_containers[index].get("env", []) if v["name"] not in OWNED]
        after = [v for v in op["value"] if v["name"] not in OWNED]
        assert after == before  # everything else is kept, in order
        for var in op["value"]:
            if var["name"] in OWNED:
                assert SAFE_VALUE.fullmatch(var["value"]), var


@SETTINGS
@given(json_values, json_values, json_values, json_values)
def test_mutate_review_with_odd_fields(clients, metadata, name, namespace, annotations):
    """A well-formed envelope around an odd pod: answered, never a 5xx (found: a non-object
    metadata once crashed the log line)."""
    review = copy.deepcopy(REVIEW)
    review["request"].update(name=name, namespace=namespace)
    review["request"]["object"]["metadata"] = metadata
    if isinstance(metadata, dict):
        metadata["annotations"] = annotations
    response = clients[0].post("/", json=review)
    assert response.status_code == 200 or rejected_clearly(response), response.data


ce_headers = st.dictionaries(
    st.sampled_from(["Ce-Specversion", "Ce-Id", "Ce-Type", "Ce-Source", "Ce-Subject", "Content-Type"]),
    st.one_of(st.sampled_from(["1.0", "0.3", "dev.knative.apiserver.resource.add", "dev.knative.sources.ping",
                               "application/json", "application/cloudevents+json", "x"]),
              st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=10)))


@SETTINGS
@given(ce_headers, st.one_of(st.binary(max_size=500), json_values.map(lambda v: json.dumps(v).encode())))
def test_bind_random_cloudevents(clients, headers, body):
    response = clients[1].post("/", data=body, headers=headers)
    assert response.status_code in (200, 503) or rejected_clearly(response), response.data
    assert response.get_json(silent=True) is not None and no_crash(response), response.data


@SETTINGS
@given(json_values)
def test_bind_random_pod_data(clients, data):
    headers = dict(ADD["headers"])
    response = clients[1].post("/", data=json.dumps(data), headers=headers)
    assert response.status_code in (200, 503) or rejected_clearly(response), response.data
    assert no_crash(response), response.data


@SETTINGS
@given(st.integers(0, len(json.dumps(ADD["body"])) - 1))
def test_bind_truncated_event(clients, cut):
    response = clients[1].post("/", data=json.dumps(ADD["body"])[:cut], headers=ADD["headers"])
    assert rejected_clearly(response)


def test_oversized_bodies_are_refused(clients):
    big = b"x" * (3 * 1024 * 1024 + 1)
    assert clients[0].post("/", data=big).status_code == 413
    # bind: 400, not 413, which the adapter would redeliver five times for the same answer
    response = clients[1].post("/", data=big, headers=ADD["headers"])
    assert response.status_code == 400 and "larger than" in response.get_json()["error"]


pod_fields = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.sampled_from(["w-0", "w-1"]), "namespace": st.just("ns"),
                                       "uid": st.just("u")},
                                      optional={"annotations": json_values, "labels": json_values,
                                                "deletionTimestamp": json_values}),
}, optional={"spec": st.one_of(json_values, st.fixed_dictionaries(
    {"schedulerName": st.just("gpu-scheduler")},
    optional={"nodeName": json_values, "tolerations": json_values, "containers": json_values})),
    "kind": st.sampled_from(["Pod", "Node"])})


@SETTINGS
@given(pod_fields)
def test_bind_odd_pods_in_well_formed_events(clients, data):
    response = clients[1].post("/", data=json.dumps(data), headers=dict(ADD["headers"]))
    assert response.status_code in (200, 503) or rejected_clearly(response), response.data
    assert no_crash(response), response.data
