"""`helm install`, `helm upgrade` and `helm uninstall` of the chart without Knative
(runtime=deployments), on the local control plane with the four real nodes.

The stack is LocalStack(in_cluster=True, functions=False): kubelets with containerd that hold the
bind and mutate images built from this tree (localcp/images.py), and the pod network, but no
gpu-scheduler of its own: the release is all there is. Its values are the chart's with this
machine's images (pullPolicy Never: they are loaded into the nodes, not pulled); the kubelets
probe the pods with the chart's own httpGet probes. Everything else is the default: two replicas each, the chart's own certificate for mutate (no cert-manager here), quotas
on, the uninstall hook.

- install: bind and mutate Ready (two ready endpoints each); the seed StatefulSet
  (check/statefulset.yaml, five replicas over node1..node4) placed where its map says, by the
  release's bind through its mutate; bind advertised the quota resources on every node.
- upgrade (a changed value, so both Deployments roll): the seed's pods untouched (same UIDs,
  nodes, Running), bind's records kept, mutate's certificate and the webhook's caBundle unchanged
  (the chart reused its Secret); a replica created afterwards is placed by the new pods.
- uninstall: the pre-delete hook ran while bind was still running, and nothing of the release is
  left: no node lists a gpu-scheduler.io resource (also once bind's pods are gone), no record
  Lease, no webhook configuration, no ServiceAccount, no RBAC, no Job, no Secret; the seed's pods
  still run.

The knative runtime cannot run here (no Knative): its uninstall hook is covered by
tests/test_chart.py and tests/test_chart_runtime.py (template, RBAC, server dry run) only.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from localcp import images, incluster
from localcp.stack import LocalStack
from gpu_scheduler.records import RECORD_SELECTOR
from tests.test_end_to_end import EXPECTED, statefulset
from tests.test_nodes import running

pytestmark = pytest.mark.controlplane

CHART = str(incluster.REPO / "chart" / "gpu-scheduler")
RELEASE = NAMESPACE = incluster.NAMESPACE  # gpu-scheduler: the fullname is the release's name
INSTALL_TIMEOUT = "6m"


@pytest.fixture(scope="module")
def cluster():
    with LocalStack(in_cluster=True, functions=False, webhook=False, event_source=False) as stack:
        yield stack
    assert not stack.nodes.leftovers(), stack.nodes.leftovers()


def helm_binary() -> str:
    return subprocess.run(["bash", str(incluster.REPO / "localcp" / "build-helm.sh"), "--path"], check=True,
                          capture_output=True, text=True).stdout.strip()


def values() -> list[str]:
    args = ["--set", "runtime=deployments"]
    for name in ("bind", "mutate"):
        repository, tag = images.function_image(name).name.rsplit(":", 1)
        args += ["--set", f"{name}.image.repository={repository}", "--set-string", f"{name}.image.tag={tag}",
                 "--set", f"{name}.image.pullPolicy=Never"]
    return args


def helm(stack: LocalStack, *args: str) -> str:
    result = subprocess.run([helm_binary(), *args, "--kubeconfig", str(stack.cp.kubeconfig)],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pods = stack.cp.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        events = stack.cp.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout
        logs = stack.cp.kubectl("logs", "-n", NAMESPACE, "job/uninstall", check=False).stdout
        pytest.fail(f"helm {' '.join(args[:2])}: {result.stdout}\n{result.stderr}\n{pods}\n{events[-4000:]}\n{logs[-3000:]}")
    return result.stdout


def get(stack: LocalStack, path: str) -> dict:
    return json.loads(stack.cp.get(path))


def exists(stack: LocalStack, path: str) -> bool:
    return stack.cp.kubectl("get", "--raw", path, check=False).returncode == 0


def records(stack: LocalStack) -> dict[str, str]:
    """bind's device records: name -> uid."""
    leases = get(stack, f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases?labelSelector={RECORD_SELECTOR}")
    return {lease["metadata"]["name"]: lease["metadata"]["uid"] for lease in leases["items"]}


def advertised(stack: LocalStack) -> dict[str, list[str]]:
    """Each node's gpu-scheduler.io resources in capacity or allocatable."""
    return {node["metadata"]["name"]: sorted({name for field in ("capacity", "allocatable")
                                              for name in (node["status"].get(field) or {}) if "gpu-scheduler.io" in name})
            for node in get(stack, "/api/v1/nodes")["items"]}


def function_pods(stack: LocalStack, name: str) -> list[dict]:
    return [p for p in stack.pods(NAMESPACE, f"app.kubernetes.io/component={name}") if not p["metadata"].get("deletionTimestamp")]


def seed_state(stack: LocalStack) -> dict[str, tuple[str, str, str]]:
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"], p["status"]["phase"])
            for p in stack.pods("seed")}


def ca_bundle(stack: LocalStack) -> str:
    webhook = get(stack, f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}")["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    return webhook["clientConfig"]["caBundle"]


def test_install_place_upgrade_uninstall(cluster):
    stack = cluster
    # -- install -----------------------------------------------------------------------------
    helm(stack, "install", RELEASE, CHART, "--namespace", NAMESPACE, "--create-namespace", *values(),
         "--wait", "--timeout", INSTALL_TIMEOUT)
    for name in ("bind", "mutate"):
        stack.wait_for(lambda: len(stack.ready_endpoints(name)) == 2, 120, f"two ready {name} endpoints", interval=1)
        for pod in function_pods(stack, name):
            assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    webhook = get(stack, f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}")["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    assert webhook["clientConfig"]["service"] == {"namespace": NAMESPACE, "name": "mutate", "port": 443, "path": "/"}

    stack.create_namespace("seed")
    stack.apply(statefulset("seed"))
    pods = stack.wait_for(lambda: running(stack, "seed", 5), 180, "the seed's 5 pods Running")
    assert ({int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]): p["spec"]["nodeName"] for p in pods} ==
            {i: node for i, (node, _) in EXPECTED.items()})
    assert all("gpu-scheduler.io/gpu" in p["spec"]["containers"][0]["resources"]["requests"] for p in pods), (
        "mutate (the release's, through its Service) added the quota requests")
    before = seed_state(stack)
    held = stack.wait_for(lambda: records(stack), 30, "bind's records of the seed")
    nodes = stack.wait_for(lambda: (a := advertised(stack)) and all(a.values()) and a, 60,
                           "every node advertising the quota resources")
    assert all("gpu-scheduler.io/gpu" in names for names in nodes.values()), nodes
    certificate = get(stack, f"/api/v1/namespaces/{NAMESPACE}/secrets/mutate-tls")["data"]
    bundle = ca_bundle(stack)
    old_pods = {p["metadata"]["name"] for name in ("bind", "mutate") for p in function_pods(stack, name)}

    # -- upgrade: a changed value rolls both Deployments -----------------------------------------
    helm(stack, "upgrade", RELEASE, CHART, "--namespace", NAMESPACE, *values(), "--set", "logLevel=DEBUG",
         "--wait", "--timeout", INSTALL_TIMEOUT)
    for name in ("bind", "mutate"):
        stack.wait_for(lambda: len(function_pods(stack, name)) == 2 and not {
            p["metadata"]["name"] for p in function_pods(stack, name)} & old_pods, 180, f"{name} rolled", interval=1)
        stack.wait_for(lambda: len(stack.ready_endpoints(name)) == 2, 120, f"two ready {name} endpoints", interval=1)
    assert seed_state(stack) == before, "the seed's pods untouched: same UIDs, same nodes, still Running"
    assert {phase for _, _, phase in before.values()} == {"Running"}
    assert set(held.items()) <= set(records(stack).items()), "bind's records kept"
    assert get(stack, f"/api/v1/namespaces/{NAMESPACE}/secrets/mutate-tls")["data"] == certificate, "the same certificate"
    assert ca_bundle(stack) == bundle
    # The new pods place a new replica (the webhook still trusts mutate's certificate).
    stack.create_namespace("after")
    stack.apply(statefulset("after", "0=node1:3\n", replicas=1))
    [pod] = stack.wait_for(lambda: running(stack, "after", 1), 120, "the new replica Running")
    assert pod["spec"]["nodeName"] == "node1"

    # -- uninstall ---------------------------------------------------------------------------
    helm(stack, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", INSTALL_TIMEOUT)
    assert advertised(stack) == dict.fromkeys(nodes, []), "no node lists a gpu-scheduler.io resource"
    stack.wait_for(lambda: not stack.pods(NAMESPACE), 120, "bind's and mutate's pods gone")
    assert advertised(stack) == dict.fromkeys(nodes, []), "and none came back: bind could no longer patch a node"
    assert records(stack) == {}
    assert not exists(stack, f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}")
    accounts = get(stack, f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts")["items"]
    assert [a["metadata"]["name"] for a in accounts] == ["default"], "no ServiceAccount of the release"
    selector = f"labelSelector=app.kubernetes.io/instance={RELEASE}"
    for path in ("/apis/rbac.authorization.k8s.io/v1/clusterroles", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                 f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles",
                 f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings",
                 f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", f"/api/v1/namespaces/{NAMESPACE}/secrets",
                 f"/api/v1/namespaces/{NAMESPACE}/services", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets"):
        assert get(stack, f"{path}?{selector}")["items"] == [], path
    assert helm(stack, "list", "--namespace", NAMESPACE, "--all", "-q").strip() == ""
    # What the user runs stays.
    assert {name: state for name, state in seed_state(stack).items()} == before
    for namespace in ("seed", "after"):
        stack.cp.kubectl("delete", "namespace", namespace, "--wait=false")
