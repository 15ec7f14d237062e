"""The real Kueue (sigs.k8s.io/kueue v0.17.0) beside the local control plane, after the real JobSet
and LeaderWorkerSet controllers (localcp/workloads.py, LocalStack(workloads=...)), its webhooks
registered by URL with a CA of ours, managing the namespaces labelled KUEUE_NAMESPACE_LABEL:

- a ResourceFlavor `default` and a ClusterQueue covering cpu and gpu-scheduler.io/gpu (nominal
  100 and 8), a LocalQueue in each test's namespace;
- an Indexed Job with the kueue.x-k8s.io/queue-name label is created suspended by Kueue's Job
  webhook, its Workload is admitted, and Kueue unsuspends it: the job controller makes its pods;
- a Job asking for more GPUs than the ClusterQueue has stays suspended, its Workload pending
  (QuotaReserved False) and never Admitted;
- a plain Pod with the label gets the kueue.x-k8s.io/admission scheduling gate from Kueue's pod
  webhook, and Kueue removes it once its Workload is admitted;
- pods and Jobs without the label, or in a namespace without KUEUE_NAMESPACE_LABEL (the
  webhooks' namespaceSelector), are left alone.

No node runs these pods: their scheduler (no-such-scheduler) does not exist, so they stay Pending.
Everything is polled, nothing slept. Needs localcp/build-workloads.sh's build (localcp/build.sh).
"""
from __future__ import annotations

import json
import re

import pytest
from kubernetes import client

from localcp.stack import LocalStack
from localcp.workloads import KUEUE_NAMESPACE_LABEL
from tests.conftest import release_namespace

pytestmark = pytest.mark.controlplane

KUEUE = "kueue.x-k8s.io"
V = "v1beta2"
QUEUE_LABEL = f"{KUEUE}/queue-name"
GATE = f"{KUEUE}/admission"
GPU = "gpu-scheduler.io/gpu"
CLUSTER_QUEUE = "gpus"
LOCAL_QUEUE = "team"


@pytest.fixture(scope="module")
def kueue_stack():
    with LocalStack(workloads=("jobset", "lws", "kueue"), event_source=False) as running:
        print(f"\nworkload controllers (jobset, lws, kueue) started in {running.workloads.started_seconds:.1f}s")
        yield running


def custom(stack) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(stack.api_client)


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


@pytest.fixture(scope="module")
def cluster_queue(kueue_stack):
    api = custom(kueue_stack)
    api.create_cluster_custom_object(KUEUE, V, "resourceflavors", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "ResourceFlavor", "metadata": {"name": "default"}})
    api.create_cluster_custom_object(KUEUE, V, "clusterqueues", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", GPU],
            "flavors": [{"name": "default", "resources": [{"name": "cpu", "nominalQuota": "100"},
                                                          {"name": GPU, "nominalQuota": "8"}]}]}]}})
    kueue_stack.wait_for(lambda: (condition(api.get_cluster_custom_object(KUEUE, V, "clusterqueues", CLUSTER_QUEUE),
                                            "Active") or {}).get("status") == "True", 60, "ClusterQueue Active")
    yield CLUSTER_QUEUE
    api.delete_cluster_custom_object(KUEUE, V, "clusterqueues", CLUSTER_QUEUE)
    api.delete_cluster_custom_object(KUEUE, V, "resourceflavors", "default")


@pytest.fixture
def ns(kueue_stack, cluster_queue, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"kq-{request.node.name.lower()}")[:40].strip("-")
    kueue_stack.create_namespace(name, labels=KUEUE_NAMESPACE_LABEL)
    custom(kueue_stack).create_namespaced_custom_object(KUEUE, V, name, "localqueues", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE},
        "spec": {"clusterQueue": cluster_queue}})
    yield name
    release_namespace(kueue_stack, name)


def pod_spec(requests: dict[str, str]) -> dict:
    return {"schedulerName": "no-such-scheduler", "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "pause", "resources": {"requests": requests, "limits": requests}}]}


def job(name: str, requests: dict[str, str], queue: str | None = LOCAL_QUEUE, count: int = 2) -> dict:
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count, "backoffLimit": 0,
                     "template": {"spec": pod_spec(requests)}}}


def create_job(stack, namespace: str, body: dict) -> dict:
    created = client.BatchV1Api(stack.api_client).create_namespaced_job(namespace, body, _preload_content=False)
    return json.loads(created.data)


def get_job(stack, namespace: str, name: str) -> dict:
    return json.loads(client.BatchV1Api(stack.api_client).read_namespaced_job(name, namespace,
                                                                              _preload_content=False).data)


def workload_of(stack, namespace: str, kind: str, name: str) -> dict | None:
    """The Workload Kueue made for the object `kind`/`name` (its owner)."""
    for workload in custom(stack).list_namespaced_custom_object(KUEUE, V, namespace, "workloads")["items"]:
        if any(o["kind"] == kind and o["name"] == name for o in workload["metadata"].get("ownerReferences") or []):
            return workload
    return None


def create_pod(stack, namespace: str, name: str, labels: dict[str, str]) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": pod_spec({"cpu": "500m"})}
    return json.loads(stack.api.create_namespaced_pod(namespace, body, _preload_content=False).data)


def gates(pod: dict) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def test_indexed_job_suspended_by_kueue_then_admitted(kueue_stack, ns):
    created = create_job(kueue_stack, ns, job("train", {"cpu": "2", GPU: "1"}))
    assert created["spec"]["suspend"] is True  # Kueue's Job webhook, at create

    def admitted():
        workload = workload_of(kueue_stack, ns, "Job", "train")
        if workload and (condition(workload, "Admitted") or {}).get("status") == "True":
            return workload
    workload = kueue_stack.wait_for(admitted, 60, "the Workload of Job train Admitted")
    assert workload["spec"]["queueName"] == LOCAL_QUEUE
    assert workload["status"]["admission"]["clusterQueue"] == CLUSTER_QUEUE
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"] == {"cpu": "default", GPU: "default"}
    assert assignment["count"] == 2

    kueue_stack.wait_for(lambda: get_job(kueue_stack, ns, "train")["spec"]["suspend"] is False, 60,
                         "Job train unsuspended by Kueue")
    pods = kueue_stack.wait_for(lambda: (lambda p: p if len(p) == 2 else None)(
        kueue_stack.pods(ns, "batch.kubernetes.io/job-name=train")), 60, "the 2 pods of Job train")
    assert sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert all(GATE not in gates(p) for p in pods)  # a Job's pods are the Job's to Kueue, not pods of its own


def test_job_over_quota_stays_suspended(kueue_stack, ns):
    assert create_job(kueue_stack, ns, job("huge", {"cpu": "1", GPU: "6"}))["spec"]["suspend"] is True  # 2 × 6 > 8

    def pending():
        workload = workload_of(kueue_stack, ns, "Job", "huge")
        reserved = condition(workload, "QuotaReserved") if workload else None
        if reserved and reserved["status"] == "False" and reserved["reason"] == "Pending":
            return workload, reserved
    workload, reserved = kueue_stack.wait_for(pending, 60, "the Workload of Job huge tried and Pending")
    assert GPU in reserved["message"], reserved
    assert (condition(workload, "Admitted") or {}).get("status") != "True"
    assert "admission" not in workload.get("status", {})
    assert get_job(kueue_stack, ns, "huge")["spec"]["suspend"] is True
    assert kueue_stack.pods(ns, "batch.kubernetes.io/job-name=huge") == []


def test_pod_gated_by_kueue_until_admitted(kueue_stack, ns):
    created = create_pod(kueue_stack, ns, "solo", {QUEUE_LABEL: LOCAL_QUEUE})
    assert GATE in gates(created)  # Kueue's pod webhook, at create
    assert created["metadata"]["labels"][f"{KUEUE}/managed"] == "true"

    def admitted():
        workload = workload_of(kueue_stack, ns, "Pod", "solo")
        if workload and (condition(workload, "Admitted") or {}).get("status") == "True":
            return workload
    kueue_stack.wait_for(admitted, 60, "the Workload of Pod solo Admitted")

    def pod():
        return json.loads(kueue_stack.api.read_namespaced_pod("solo", ns, _preload_content=False).data)
    kueue_stack.wait_for(lambda: GATE not in gates(pod()), 60, "the admission gate of Pod solo removed")
    assert not pod()["spec"].get("nodeName")  # ungated, for its scheduler (none here) to place


def test_pods_and_jobs_without_opting_in_are_left_alone(kueue_stack, ns):
    plain = kueue_stack.create_namespace(f"{ns[:30]}-plain")  # without KUEUE_NAMESPACE_LABEL
    try:
        for namespace, labels in ((ns, {}), (plain, {QUEUE_LABEL: LOCAL_QUEUE})):
            pod = create_pod(kueue_stack, namespace, "free", labels)
            assert gates(pod) == [] and f"{KUEUE}/managed" not in pod["metadata"].get("labels", {}), namespace
            assert not pod["metadata"].get("finalizers"), namespace
        assert create_job(kueue_stack, ns, job("free", {"cpu": "1"}, queue=None))["spec"]["suspend"] is False
        assert create_job(kueue_stack, plain, job("free", {"cpu": "1"}))["spec"]["suspend"] is False
        # the Jobs run their pods without a Workload: Kueue's reconcilers leave them be too
        for namespace in (ns, plain):
            kueue_stack.wait_for(lambda n=namespace: len(kueue_stack.pods(n, "batch.kubernetes.io/job-name=free")) == 2,
                                 60, f"the pods of Job free in {namespace}")
        assert get_job(kueue_stack, plain, "free")["spec"]["suspend"] is False
        assert workload_of(kueue_stack, ns, "Job", "free") is None
        assert workload_of(kueue_stack, plain, "Job", "free") is None
    finally:
        release_namespace(kueue_stack, plain)
