"""bind and mutate as pods on the four real nodes, from their images, as Knative would run them
(LocalStack(in_cluster=True), localcp/incluster.py): bind reads the API with its pod's
ServiceAccount token through the kubernetes Service, the API server calls mutate through its
Service (MutatingWebhookConfiguration clientConfig.service), and the seed lands where its map says."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localcp import incluster
from localcp.stack import LocalStack
from tests.test_end_to_end import EXPECTED, statefulset
from tests.test_nodes import placement_from_logs, running
import tests.test_rbac as rbac  # as a module: its tests are not collected again here

pytestmark = pytest.mark.controlplane


@pytest.fixture(scope="module")
def cluster_stack():
    with LocalStack(in_cluster=True) as running_stack:
        podnet = running_stack.cp.processes["podnet"]
        yield running_stack
    # Torn down like the other stacks: nothing of the nodes, their namespaces or podnet is left.
    assert podnet.poll() is not None
    assert not running_stack.nodes.leftovers(), running_stack.nodes.leftovers()


def function_pod(stack: LocalStack, name: str) -> dict:
    [pod] = [p for p in stack.pods(incluster.NAMESPACE, f"app={name}") if not p["metadata"].get("deletionTimestamp")]
    return pod


def container_process(stack: LocalStack, name: str) -> int:
    """The PID of the function's main process (the container's PID 1), from its node's containerd."""
    pod = function_pod(stack, name)
    node = stack.nodes[pod["spec"]["nodeName"]]
    [container_id] = [s["containerID"].split("//", 1)[1] for s in pod["status"]["containerStatuses"]]
    tasks = node.ctr("tasks", "ls").stdout.splitlines()[1:]
    [pid] = [int(line.split()[1]) for line in tasks if line.split()[0] == container_id]
    return pid


def test_the_seed_lands_where_its_map_says_placed_by_bind_in_its_pod(cluster_stack):
    stack = cluster_stack
    stack.create_namespace("seed")
    stack.apply(statefulset("seed"))
    pods = stack.wait_for(lambda: running(stack, "seed", 5), 120, "5 check pods Running")
    assert ({int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]): p["spec"]["nodeName"] for p in pods} ==
            {i: node for i, (node, _) in EXPECTED.items()})
    assert placement_from_logs(stack, "seed", pods) == EXPECTED  # CUDA_VISIBLE_DEVICES from mutate in its pod
    # Placed by bind in its pod (its log, through the API server), not by anything on the machine.
    log = stack.cp.kubectl("logs", "-n", incluster.NAMESPACE, "deployment/bind").stdout
    decisions = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    bound = {e["pod"] for e in decisions if e.get("decision") == "Bound"}
    assert {f"seed/{p['metadata']['name']}" for p in pods} <= bound
    admitted = [json.loads(line) for line in stack.cp.kubectl("logs", "-n", incluster.NAMESPACE,
                                                               "deployment/mutate").stdout.splitlines()
                if line.startswith("{")]
    assert {e["pod"] for e in admitted if e.get("decision") == "Placed"} >= {f"seed/{p['metadata']['name']}" for p in pods}
    stack.cp.kubectl("delete", "namespace", "seed", "--wait=false")


def test_the_api_server_calls_mutate_through_its_service(cluster_stack):
    for webhook in json.loads(cluster_stack.cp.get(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-scheduler"))["webhooks"]:
        assert webhook["clientConfig"]["service"] == {"namespace": incluster.NAMESPACE, "name": "mutate",
                                                     "port": 443, "path": "/"}
        assert "url" not in webhook["clientConfig"]
    assert cluster_stack.ready_endpoints("mutate") == [function_pod(cluster_stack, "mutate")["status"]["podIP"]]


@pytest.mark.parametrize("name", ["bind", "mutate"])
def test_the_functions_run_as_non_root_on_a_read_only_root(cluster_stack, name):
    pod = function_pod(cluster_stack, name)
    spec = pod["spec"]
    [container] = spec["containers"]
    assert container["image"] == incluster.knative_service(name)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["securityContext"]["runAsNonRoot"] is True
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (65532, 65532)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["serviceAccountName"] == name
    assert pod["status"]["podIP"].startswith(f"10.244.{spec['nodeName'][-1]}.")
    # From inside: the process's user is the image's numeric USER, its / is mounted read-only,
    # and its TMPDIR is the writable tmpfs the image names.
    pid = container_process(cluster_stack, name)
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Uid"].split()[:2] == ["65532", "65532"] and status["Gid"].split()[0] == "65532"
    mounts = {line.split()[4]: line.split()[5] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()}
    assert mounts["/"].split(",")[0] == "ro"
    assert mounts["/dev/shm"].split(",")[0] == "rw"
    environ = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in e)
    assert environ["TMPDIR"] == "/dev/shm"
    # The in-cluster configuration, nothing else: each its ServiceAccount's token (mutate's reads
    # nodes, for quotas; what each may do: test_each_account_can_do_exactly_what_it_needs).
    assert "KUBECONFIG" not in environ
    token = Path(f"/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token")
    assert token.exists()
    assert environ["KUBERNETES_SERVICE_HOST"] == "10.96.0.1" and environ["KUBERNETES_SERVICE_PORT"] == "443"


def test_bind_places_with_only_its_token(cluster_stack):
    """bind's pod holds one credential, its ServiceAccount's projected token (no KUBECONFIG: see
    above); the API server authenticates it as system:serviceaccount:gpu-scheduler:bind, bound
    to that pod, and a pod created now is placed by bind with it (what the account may do:
    test_each_account_can_do_exactly_what_it_needs)."""
    pid = container_process(cluster_stack, "bind")
    token = Path(f"/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token").read_text()
    review = json.loads(cluster_stack.cp.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}))
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == "system:serviceaccount:gpu-scheduler:bind"
    assert (review["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"] ==
            [function_pod(cluster_stack, "bind")["metadata"]["name"]])
    # A pod placed now, by bind's event, with that token.
    cluster_stack.create_namespace("token")
    cluster_stack.apply(statefulset("token", "0=node1:3\n", replicas=1))  # a GPU the seed does not hold
    [pod] = cluster_stack.wait_for(lambda: running(cluster_stack, "token", 1), 90, "the replica Running")
    assert pod["spec"]["nodeName"] == "node1"
    assert placement_from_logs(cluster_stack, "token", [pod]) == {0: ("node1", "3")}


@pytest.mark.parametrize("account", sorted(rbac.CLUSTER))
def test_each_account_can_do_exactly_what_it_needs(cluster_stack, account):
    """tests/test_rbac.py's SubjectAccessReviews, on this stack's API server."""
    rbac.test_each_account_can_do_what_it_needs(cluster_stack, account)
    rbac.test_each_account_can_do_nothing_else(cluster_stack, account)
