"""bind started as a new user starts it (docs/try-it.md, "Run a function locally") against a cluster that
lacks what it needs, on the real control plane: each misconfiguration keeps it not ready with
a message naming the fix, the pods it cannot place say the same in their FailedScheduling Event,
and its log says APIError, never PodGone. The stack's own bind is stopped meanwhile, so only the
misconfigured instance sees the pods."""
from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from conftest import FunctionServer
from test_end_to_end import pod_manifest

pytestmark = pytest.mark.controlplane


def readiness(server: FunctionServer) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{server.url}/health/readiness", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@contextmanager
def only(stack, **env):
    """A bind instance with `env`, the stack's own bind stopped while it runs."""
    group = stack.cp.processes["bind"].pid
    os.killpg(group, signal.SIGSTOP)
    server = FunctionServer("bind", env)
    try:
        yield server
    finally:
        server.stop()
        os.killpg(group, signal.SIGCONT)


def scheduler_events(stack, namespace: str, pod: str) -> list[dict]:
    events = json.loads(stack.cp.kubectl("get", "events", "-n", namespace, "-o", "json",
                                         "--field-selector", f"involvedObject.name={pod}").stdout)["items"]
    return [e for e in events if (e.get("source") or {}).get("component") == "gpu-scheduler"]


def test_a_missing_records_namespace_is_named_not_taken_for_a_gone_pod(stack, namespace):
    missing = f"records-{namespace}"[:60].rstrip("-")
    with only(stack, KUBECONFIG=str(stack.cp.kubeconfig), GPU_SCHEDULER_NAMESPACE=missing) as bind:
        # (while its first check runs, readiness says it is checking: wait for the verdict)
        status, body = stack.wait_for(lambda: (r := readiness(bind))[0] == 503 and "does not exist" in r[1] and r,
                                      30, "readiness naming the namespace")
        assert missing in body
        assert "GPU_SCHEDULER_NAMESPACE" in body and f"kubectl create namespace {missing}" in body
        stack.apply(pod_manifest(namespace, "first-0", "0=node1:3\n"))
        [event] = stack.wait_for(lambda: scheduler_events(stack, namespace, "first-0"), 30, "a FailedScheduling Event")
        assert event["reason"] == "FailedScheduling" and f"kubectl create namespace {missing}" in event["message"]
        assert "GPU_SCHEDULER_NAMESPACE" in event["message"]
        pod = stack.pods(namespace)[0]
        condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert (condition["status"], condition["reason"]) == ("False", "SchedulerError")
        log = bind.output()
        assert '"decision": "APIError"' in log and "PodGone" not in log

        # The fix the message names: once the namespace exists, bind is ready and binds the pod.
        stack.create_namespace(missing)
        try:
            stack.wait_for(lambda: readiness(bind)[0] == 200, 30, "ready once the namespace exists")
            stack.wait_bound(namespace, 1, timeout=30)
        finally:
            stack.cp.kubectl("delete", "namespace", missing, "--wait=false")


def test_no_rbac_for_leases_in_the_records_namespace_is_named(stack, namespace):
    """bind's own ServiceAccount, whose Role for Leases is in gpu-scheduler, told to keep its
    records in another namespace."""
    with only(stack, KUBECONFIG=str(stack.bind_kubeconfig), GPU_SCHEDULER_NAMESPACE=namespace) as bind:
        status, body = stack.wait_for(lambda: (r := readiness(bind))[0] == 503 and "forbidden" in r[1] and r, 30,
                                      "readiness naming the Leases")
        assert "leases" in body and namespace in body


def test_a_kubeconfig_context_that_does_not_exist_is_named(stack, tmp_path):
    config = json.loads(stack.cp.kubeconfig.read_text())  # the admin's, JSON
    config["current-context"] = "no-such-context"
    path = tmp_path / "config"
    path.write_text(json.dumps(config))
    with only(stack, KUBECONFIG=str(path)) as bind:
        status, body = readiness(bind)
        assert status == 503 and "no Kubernetes API configuration" in body and "no-such-context" in body
