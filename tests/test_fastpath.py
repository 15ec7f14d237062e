"""The fast path (serving/fastpath.py) answers exactly what Flask and the cloudevents SDK
answer: the same requests to each function served with it and without it
(GPU_SCHEDULER_FAST_PATH=off), status and body compared. bind's API server is down here, so
every pod it would bind is kept and retried by its queue in both."""
from __future__ import annotations

import copy
import json
import uuid

import pytest

from conftest import FunctionServer, sample

ADD = "apiserversource-add-gpu-scheduler-check-0.json"
UPDATE_BOUND = "apiserversource-update-gpu-scheduler-check-2-bound.json"
REVIEW = "admissionreview-v1-create-gpu-scheduler-check-3.json"


@pytest.fixture(scope="module")
def bind_pair(unreachable_kubeconfig):
    env = {"KUBECONFIG": str(unreachable_kubeconfig), "LOG_LEVEL": "WARNING"}
    fast, slow = FunctionServer("bind", env), FunctionServer("bind", {**env, "GPU_SCHEDULER_FAST_PATH": "off"})
    yield fast, slow
    fast.stop()
    slow.stop()


@pytest.fixture(scope="module")
def mutate_pair():
    fast = FunctionServer("mutate", {"LOG_LEVEL": "WARNING"})
    slow = FunctionServer("mutate", {"LOG_LEVEL": "WARNING", "GPU_SCHEDULER_FAST_PATH": "off"})
    yield fast, slow
    fast.stop()
    slow.stop()


def same(pair, body, headers=None, path="/"):
    answers = []
    headers = {k: v for k, v in (headers or {}).items() if v is not None}
    for server in pair:
        status, raw, response_headers = server.post(body, headers, path=path)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        answers.append((status, parsed, response_headers.get("Content-Type")))
    assert answers[0] == answers[1]
    return answers[0]


def event(name=ADD):
    captured = copy.deepcopy(sample(name))
    return captured["body"], {**captured["headers"], "Ce-Id": str(uuid.uuid4())}


def bind_cases():
    pod, headers = event()
    yield "placeable pod: queued", pod, headers, "/"
    yield "already bound: ignored", *event(UPDATE_BOUND), "/"
    yield "other type: ignored", pod, {**headers, "Ce-Type": "dev.knative.apiserver.resource.delete"}, "/"
    other = copy.deepcopy(pod)
    other["spec"]["schedulerName"] = "default-scheduler"
    yield "other scheduler", other, headers, "/"
    broken = copy.deepcopy(pod)
    broken["metadata"]["annotations"]["gpu-scheduling-map"] = "0=Node_1:0\n"
    yield "malformed map: 200", broken, headers, "/"
    yield "no Ce-Id", pod, {**headers, "Ce-Id": None}, "/"
    yield "no Ce-Source", pod, {k: v for k, v in headers.items() if k != "Ce-Source"}, "/"
    yield "specversion 0.3", pod, {**headers, "Ce-Specversion": "0.3"}, "/"
    yield "specversion 9.9", pod, {**headers, "Ce-Specversion": "9.9"}, "/"
    yield "text/plain", json.dumps(pod), {**headers, "Content-Type": "text/plain"}, "/"
    yield "charset", pod, {**headers, "Content-Type": "application/json; charset=utf-8"}, "/"
    yield "not JSON", b"{broken", headers, "/"
    yield "empty body", b"", headers, "/"
    yield "array", [], headers, "/"
    yield "no uid", {"metadata": {"name": "p", "namespace": "n"}}, headers, "/"
    yield "extension attribute", pod, {**headers, "Ce-Traceparent": "00-abc-def-01"}, "/"
    yield "another path", pod, headers, "/anything"
    yield "robots.txt", pod, headers, "/robots.txt"
    yield "health path", pod, headers, "/health/liveness"
    yield "ping: API down", {"reason": "resync"}, {"Ce-Id": "1", "Ce-Source": "/ping", "Ce-Specversion": "1.0",
                                             "Ce-Type": "dev.knative.sources.ping", "Content-Type": "application/json"}, "/"
    structured = {"specversion": "1.0", "id": "1", "source": "s", "type": headers["Ce-Type"],
                  "datacontenttype": "application/json", "data": pod}
    yield "structured mode", structured, {"Content-Type": "application/cloudevents+json"}, "/"


@pytest.mark.parametrize("case", list(bind_cases()), ids=lambda case: case[0])
def test_bind_answers_the_same_with_and_without_the_fast_path(bind_pair, case):
    _, body, headers, path = case
    status, answer, _ = same(bind_pair, body, headers, path)
    if case[0] == "placeable pod: queued":
        assert status == 200 and answer["result"] == "Retry" and answer["queued"] is True


def mutate_cases():
    review = sample(REVIEW)
    yield "captured review", review, "/"
    yield "v1beta1", {**review, "apiVersion": "admission.k8s.io/v1beta1"}, "/"
    no_map = copy.deepcopy(review)
    no_map["request"]["object"]["metadata"].pop("annotations")
    yield "no annotation", no_map, "/"
    yield "no request", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "/"
    yield "not JSON", b"{broken", "/"
    yield "empty", b"", "/"
    yield "another path", review, "/mutate"
    yield "robots.txt", review, "/robots.txt"
    yield "health path", review, "/health/readiness"


@pytest.mark.parametrize("case", list(mutate_cases()), ids=lambda case: case[0])
def test_mutate_answers_the_same_with_and_without_the_fast_path(mutate_pair, case):
    _, body, path = case
    status, answer, _ = same(mutate_pair, body, None, path)
    if case[0] == "captured review":
        assert status == 200 and answer["response"]["allowed"] is True
