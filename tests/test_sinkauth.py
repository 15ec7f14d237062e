"""Sink authentication (Knative's authentication-oidc): the core's rules, and bind on the real API
server reviewing tokens that the TokenRequest API issued, as Knative's sources request them."""
from __future__ import annotations

import json

import pytest

from conftest import FunctionServer
from serving.sinkauth import SinkAuth, Unauthenticated, bearer_token, sender_problem
from test_end_to_end import pod_manifest

from localcp.cloudevents import Sender, cloudevent_headers

AUDIENCE = "serving.knative.dev/service/gpu-scheduler/bind"
SOURCE = "system:serviceaccount:gpu-scheduler:pod-events"
AUTH = SinkAuth(AUDIENCE, frozenset({SOURCE}))


@pytest.mark.parametrize("header, needle", [
    (None, "no Authorization header"), ("", "no Authorization header"), ("Basic abc", "not 'Bearer <token>'"),
    ("Bearer ", "not 'Bearer <token>'"), ("Bearer " + "x" * 20000, "longer than"),
])
def test_a_missing_or_odd_authorization_header_is_refused(header, needle):
    with pytest.raises(Unauthenticated, match=needle):
        bearer_token(header)


def test_the_token_is_taken_from_a_bearer_header():
    assert bearer_token("Bearer abc.def") == "abc.def" and bearer_token("bearer  abc ") == "abc"


@pytest.mark.parametrize("status, needle", [
    ({"authenticated": True, "audiences": [AUDIENCE], "user": {"username": SOURCE}}, None),
    ({"authenticated": False, "error": "token expired"}, "token expired"),
    ({"authenticated": True, "audiences": ["other"], "user": {"username": SOURCE}}, "not issued for audience"),
    ({"authenticated": True, "audiences": [AUDIENCE], "user": {"username": "system:serviceaccount:x:y"}},
     "is not a sender of this sink"),
    ({}, "not authenticated"),
])
def test_a_token_review_admits_only_the_named_senders(status, needle):
    problem = sender_problem(status, AUTH)
    assert problem is None if needle is None else needle in problem


def test_on_without_senders_is_a_start_up_error_and_off_is_none():
    assert SinkAuth.from_settings("", "") is None
    with pytest.raises(ValueError, match="SINK_SENDERS names no sender"):
        SinkAuth.from_settings(AUDIENCE, " , ")
    assert SinkAuth.from_settings(AUDIENCE, f"{SOURCE}, a:b").senders == {SOURCE, "a:b"}


def test_bind_admits_the_sources_token_and_refuses_others_on_the_real_api_server(stack, namespace):
    guarded = FunctionServer("bind", {"KUBECONFIG": str(stack.bind_kubeconfig), "SINK_AUDIENCE": AUDIENCE,
                                      "SINK_SENDERS": SOURCE})
    try:
        stack.source.paused = True  # only this test's requests reach the guarded bind
        stack.apply(pod_manifest(namespace, "w-0", "0=node2:1\n"))
        pod = stack.wait_for(lambda: stack.pods(namespace), 20, "the pod")[0]
        sender = Sender(guarded.url, delays=())

        def post(token: str | None):
            headers = cloudevent_headers("add", pod, stack.cp.server)
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            response = sender.http.request("POST", guarded.url, body=json.dumps(pod).encode(), headers=headers)
            return response.status, json.loads(response.data)

        wrong_audience = stack.cp.service_account_token("gpu-scheduler", "pod-events", 600, ["somewhere-else"])
        someone_else = stack.cp.service_account_token("gpu-scheduler", "mutate", 600, [AUDIENCE])
        source = stack.cp.service_account_token("gpu-scheduler", "pod-events", 600, [AUDIENCE])
        for token, needle in ((None, "no Authorization header"), ("garbage", "not valid for audience"),
                              (wrong_audience, "not valid for audience"), (someone_else, "is not a sender")):
            status, body = post(token)
            assert status == 401 and needle in body["error"], (status, body)
        status, body = post(source)  # the stack's own bind may have placed it from its watch already
        # Admitted: the answer is bind's own (it may have placed the pod from its watch already,
        # and the copy posted here may have been read after that).
        assert status == 200 and body["result"] in ("Bound", "AlreadyBound", "ignored"), body
    finally:
        stack.source.paused = False
        guarded.stop()
