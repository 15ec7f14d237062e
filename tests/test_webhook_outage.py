"""The webhook registration as shipped (knative/webhook.yaml), on the stack's Kubernetes: while mutate
hangs or is down, only pods that carry the map are refused (matchConditions, failurePolicy Fail),
and pods in the excluded namespaces are never sent to it."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from test_end_to_end import pod_manifest

WEBHOOK = "mutate.gpu-scheduler.local"


def create(stack, manifest: dict):
    return stack.cp.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)


@pytest.fixture
def mutate_hung(stack):
    """mutate's processes stopped: connections are accepted by the kernel, never answered."""
    group = os.getpgid(stack.cp.processes["mutate"].pid)
    os.killpg(group, signal.SIGSTOP)
    try:
        yield "context deadline exceeded"
    finally:
        os.killpg(group, signal.SIGCONT)


@pytest.fixture
def mutate_down(stack):
    """The webhook's address refuses connections, as when no mutate pod runs."""
    from localcp.cluster import free_port

    registration = stack.webhook_configuration()
    for webhook in registration["webhooks"]:
        webhook["clientConfig"]["url"] = f"https://127.0.0.1:{free_port()}/"
    stack.apply(registration)
    time.sleep(1)  # the API server's webhook configuration is watched, not read per request
    try:
        yield "connection refused"
    finally:
        stack.register_webhook()
        time.sleep(1)


@pytest.mark.parametrize("outage", ["mutate_hung", "mutate_down"])
def test_only_pods_with_the_map_are_refused_while_mutate_is_unavailable(stack, namespace, outage, request):
    symptom = request.getfixturevalue(outage)
    plain = create(stack, pod_manifest(namespace, "plain", None))
    assert plain.returncode == 0, plain.stderr
    excluded = create(stack, pod_manifest("gpu-scheduler", f"excluded-{namespace}"[:63], "0=node1:0\n"))
    assert excluded.returncode == 0, excluded.stderr
    refused = create(stack, pod_manifest(namespace, "mapped", "0=node1:0\n"))
    assert refused.returncode != 0
    assert f'failed calling webhook "{WEBHOOK}"' in refused.stderr and symptom in refused.stderr, refused.stderr
    names = {p["metadata"]["name"] for p in stack.pods(namespace)}
    assert names == {"plain"}
    stack.cp.kubectl("delete", "pod", "-n", "gpu-scheduler", f"excluded-{namespace}"[:63], "--wait=false")


def test_with_mutate_back_the_same_pod_is_admitted(stack, namespace):
    created = create(stack, pod_manifest(namespace, "mapped", "0=node1:0\n"))
    assert created.returncode == 0, created.stderr
