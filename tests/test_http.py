"""Both functions through a real functions-framework server, with the captured samples and ours.

bind here talks to an API server that refuses connections: every pod it would bind is kept by
its queue (200, "queued"), never a 5xx, and everything it would not touch must still be answered."""
from __future__ import annotations

import base64
import copy
import json
import uuid

import pytest

from conftest import FunctionServer, sample
from jsonpatch import apply_patch

REVIEW = "admissionreview-v1-create-gpu-scheduler-check-3.json"
ADD = "apiserversource-add-gpu-scheduler-check-0.json"
UPDATE_BOUND = "apiserversource-update-gpu-scheduler-check-2-bound.json"


def review_with(annotation: str | None = None, name: str = "gpu-scheduler-check-3", **request) -> dict:
    review = copy.deepcopy(sample(REVIEW))
    obj = review["request"]["object"]
    review["request"]["name"] = obj["metadata"]["name"] = name
    if annotation is None:
        obj["metadata"].pop("annotations", None)
    else:
        obj["metadata"]["annotations"] = {"gpu-scheduling-map": annotation}
    review["request"].update(request)
    return review


def answer(server, body) -> dict:
    status, raw, headers = server.post(body)
    assert status == 200, raw
    assert headers["Content-Type"] == "application/json"
    return json.loads(raw)


def patch_of(response: dict) -> list[dict]:
    return json.loads(base64.b64decode(response["response"]["patch"]))


# -- mutate ---------------------------------------------------------------------------------
def test_mutate_places_the_captured_request(mutate_server):
    review = sample(REVIEW)
    result = answer(mutate_server, review)
    assert result["apiVersion"] == "admission.k8s.io/v1" and result["kind"] == "AdmissionReview"
    assert result["response"]["uid"] == review["request"]["uid"]
    assert result["response"]["allowed"] is True
    assert result["response"]["patchType"] == "JSONPatch"
    requests_op, limits_op, env_op, label_op = patch_of(result)
    assert env_op["path"] == "/spec/containers/0/env"
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": "3"} in env_op["value"]
    assert env_op["value"][0]["name"] == "NODE_NAME"  # the downward-API variable is kept
    # The one GPU it pins, counted for quotas (this mutate has no API server: no GPU type).
    assert requests_op == {"op": "add", "path": "/spec/containers/0/resources/requests",
                           "value": {"gpu-scheduler.io/gpu": "1"}}
    assert limits_op == {**requests_op, "path": "/spec/containers/0/resources/limits"}
    assert label_op == {"op": "add", "path": "/metadata/labels/gpu-scheduler~1managed", "value": "true"}


def test_mutate_answers_v1beta1_in_v1beta1(mutate_server):
    review = sample(REVIEW)
    review["apiVersion"] = "admission.k8s.io/v1beta1"
    result = answer(mutate_server, review)
    assert result["apiVersion"] == "admission.k8s.io/v1beta1"
    assert result["response"]["uid"] == review["request"]["uid"]
    assert result["response"]["allowed"] is True and patch_of(result)


def test_mutate_leaves_pods_without_the_annotation_alone(mutate_server):
    result = answer(mutate_server, review_with(None))
    assert result["response"] == {"uid": sample(REVIEW)["request"]["uid"], "allowed": True}


def test_mutate_denies_a_malformed_map_naming_the_line(mutate_server):
    result = answer(mutate_server, review_with("0=node1:0\n1=node2\n"))
    response = result["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400
    assert "line 2 '1=node2'" in response["status"]["message"]
    assert "':'" in response["status"]["message"]


def test_mutate_allows_an_index_without_entry_with_a_warning(mutate_server):
    result = answer(mutate_server, review_with("0=node1:0\n", name="gpu-scheduler-check-7"))
    response = result["response"]
    assert response["allowed"] is True
    assert patch_of(result) == [{"op": "add", "path": "/metadata/labels/gpu-scheduler~1managed", "value": "true"}]
    assert "pod index 7 has no entry" in response["warnings"][0]


def test_mutate_warns_when_the_index_is_unknown(mutate_server):
    review = review_with("0=node1:0\n", name="")
    result = answer(mutate_server, review)
    assert result["response"]["allowed"] is True
    assert "generateName" in result["response"]["warnings"][0]


def test_mutate_answers_dry_run_the_same(mutate_server):
    wet = answer(mutate_server, review_with("3=node4:1,2\n"))
    dry = answer(mutate_server, review_with("3=node4:1,2\n", dryRun=True))
    assert dry == wet


def test_mutate_is_reinvocation_safe(mutate_server):
    review = sample(REVIEW)
    review["request"]["object"] = apply_patch(review["request"]["object"], patch_of(answer(mutate_server, review)))
    assert "patch" not in answer(mutate_server, review)["response"]


@pytest.mark.parametrize("body, needle", [
    (b"", "malformed JSON"),
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "body: expected a JSON object"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2"}', "apiVersion"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}', "request: expected an object"),
    (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 7}}', "request.uid"),
    (b"\xff\xfe", "malformed JSON"),
    (b"[" * 100000, "malformed JSON"),
])
def test_mutate_rejects_malformed_bodies_with_400(mutate_server, body, needle):
    status, raw, headers = mutate_server.post(body)
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert needle in json.loads(raw)["error"]


def test_mutate_caps_the_body_size(mutate_server):
    status, raw, _ = mutate_server.post(b" " * (3 * 1024 * 1024 + 1))
    assert status == 413 and "larger than" in json.loads(raw)["error"]


def test_mutate_health_and_metrics(mutate_server):
    assert mutate_server.get("/health/liveness")[0] == 200
    assert mutate_server.get("/health/readiness")[0] == 200
    answer(mutate_server, sample(REVIEW))
    status, raw, _ = mutate_server.get("/metrics")
    assert status == 200
    assert b'gpu_scheduler_admission_decisions_total{allowed="true",reason="Placed"}' in raw
    assert mutate_server.get("/")[0] == 405


# -- bind -----------------------------------------------------------------------------------
def binary(name: str = ADD, **changes) -> tuple[dict, dict]:
    event = copy.deepcopy(sample(name))
    event["headers"].update(changes)
    return event["headers"], event["body"]


def test_bind_keeps_a_placeable_pod_while_the_api_is_down(bind_server):
    """Its queue retries the pod once the API answers: a redelivery could not help, and a 503
    would hold up the adapter's next events (it sends one at a time)."""
    headers, pod = binary()
    status, raw, _ = bind_server.post(pod, headers)
    assert status == 200, raw
    body = json.loads(raw)
    # The event is a trigger: the pod is read first, so the failure is the read's, before any node.
    assert body["result"] == "Retry" and body["queued"] is True and "cannot reach the Kubernetes API" in body["message"]


def test_bind_accepts_structured_mode(bind_server):
    headers, pod = binary()
    event = {"specversion": "1.0", "id": str(uuid.uuid4()), "source": headers["Ce-Source"],
             "type": headers["Ce-Type"], "subject": headers["Ce-Subject"], "datacontenttype": "application/json",
             "data": pod}
    status, raw, _ = bind_server.post(event, {"Content-Type": "application/cloudevents+json"})
    assert status == 200 and json.loads(raw)["result"] == "Retry"  # read the pod: the API is down


def test_bind_ignores_already_bound_pods(bind_server):
    headers, pod = binary(UPDATE_BOUND)
    status, raw, _ = bind_server.post(pod, headers)
    assert status == 200 and json.loads(raw) == {"result": "ignored", "why": "already bound to node3"}


def test_bind_ignores_other_schedulers_and_event_types(bind_server):
    headers, pod = binary()
    pod["spec"]["schedulerName"] = "default-scheduler"
    assert bind_server.post(pod, headers)[0] == 200
    headers, pod = binary(**{"Ce-Type": "dev.knative.apiserver.resource.delete"})
    status, raw, _ = bind_server.post(pod, headers)
    assert status == 200 and json.loads(raw)["result"] == "ignored"


def test_bind_judges_the_live_pod_not_the_events_copy(bind_server):
    """An event whose own map is malformed condemns nothing: the pod as the API server has it
    decides (and with the API down, that read is retried by bind's queue). The permanent answers (200 with the
    reason) are shown on the real API server in test_end_to_end and test_fit_cluster."""
    headers, pod = binary()
    pod["metadata"]["annotations"]["gpu-scheduling-map"] = "0=Node_1:0\n"
    status, raw, _ = bind_server.post(pod, headers)
    body = json.loads(raw)
    assert status == 200 and body["result"] == "Retry" and body["queued"] is True


@pytest.mark.parametrize("headers, body, needle", [
    ({}, b"{}", "malformed CloudEvent"),
    ({"Ce-Specversion": "1.0", "Ce-Type": "dev.knative.apiserver.resource.add", "Ce-Source": "s"}, b"{}",
     "malformed CloudEvent"),
    ({"Ce-Specversion": "9.9", "Ce-Id": "1", "Ce-Type": "x", "Ce-Source": "s"}, b"{}", "malformed CloudEvent"),
    ({"Content-Type": "application/cloudevents+json"}, b"{broken", "malformed CloudEvent"),
])
def test_bind_rejects_malformed_cloudevents_with_400(bind_server, headers, body, needle):
    status, raw, _ = bind_server.post(body, {"Content-Type": "application/json", **headers})
    assert status == 400 and needle in json.loads(raw)["error"]


@pytest.mark.parametrize("data, needle", [
    ([], "data: expected the pod as a JSON object"),
    ({"kind": "Node", "metadata": {}}, "data.kind"),
    ({"metadata": {"name": "p", "namespace": "n"}}, "data.metadata.uid"),
    ({"metadata": "x"}, "data.metadata"),
])
def test_bind_rejects_pod_events_without_a_usable_pod(bind_server, data, needle):
    headers, _ = binary()
    status, raw, _ = bind_server.post(data, headers)
    assert status == 400 and needle in json.loads(raw)["error"]


def test_bind_ping_while_the_api_is_down_is_not_redelivered(bind_server):
    """bind's watches list again by themselves once the API server answers."""
    from localcp.cloudevents import ping_headers

    status, raw, _ = bind_server.post(b"{}", ping_headers())
    assert status == 200 and json.loads(raw)["result"] == "Retry"


def test_bind_readiness_means_it_has_listed_the_cluster(bind_server, tmp_path):
    """Ready once its watches have listed pods, nodes and records: with the API down, not ready."""
    status, raw, _ = bind_server.get("/health/readiness")
    assert status == 503 and b"listing" in raw
    assert bind_server.get("/health/liveness")[0] == 200
    unconfigured = FunctionServer("bind", {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)})
    try:
        assert unconfigured.get("/health/liveness")[0] == 200
        assert unconfigured.get("/health/readiness")[0] == 503
        headers, pod = binary()
        assert unconfigured.post(pod, headers)[0] == 503
    finally:
        unconfigured.stop()


def test_bind_metrics(bind_server):
    status, raw, _ = bind_server.get("/metrics")
    assert status == 200 and b"gpu_scheduler_scheduling_attempt_duration_seconds" in raw


def test_bind_answers_an_event_with_an_event_and_a_refusal_without(bind_server):
    """A 2xx answer is a binary-mode CloudEvent, its data the same JSON (what `func invoke` prints);
    a 4xx is plain JSON (func invoke reports the HTTP error)."""
    headers, pod = binary(UPDATE_BOUND)
    status, raw, answered = bind_server.post(pod, headers)
    assert status == 200 and json.loads(raw)["result"] == "ignored"
    assert (answered["Ce-Specversion"], answered["Ce-Type"], answered["Ce-Source"]) == (
        "1.0", "dev.gpu-scheduler.bind.reply", "/gpu-scheduler/bind")
    assert answered["Ce-Id"] and answered["Content-Type"] == "application/json"
    status, raw, refused = bind_server.post(b"{}", {"Content-Type": "application/json"})
    assert status == 400 and "Ce-Type" not in refused
