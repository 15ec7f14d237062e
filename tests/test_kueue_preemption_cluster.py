"""Kueue's own preemption frees a pinned workload's GPUs for the one it admits instead, on the real
Kueue v0.17.0 beside the control plane, mutate and bind (localcp/workloads.py).

A ClusterQueue of 8 gpu-scheduler.io/gpu that preempts lower priority within itself. A low-priority
Indexed Job pinning 4 × 2 GPUs is admitted and bound; a high-priority Job pinning the same GPUs
then needs the whole queue: Kueue evicts the low one (its Job suspended, the Job controller deletes
its pods), bind sees the deletions, and places the high one on the same devices. Kueue counts the
pinned GPUs because mutate wrote them on the Jobs' templates (gpu_scheduler/templatecount.py):
before that, the templates requested nothing and both would have been admitted at once.

The nodes have no kubelets, so the test confirms the evicted pods' deletion as a kubelet would
(grace period 0) once the Job controller has deleted them."""
from __future__ import annotations

import json
import re

import pytest
from kubernetes import client

from localcp.stack import LocalStack
from localcp.workloads import KUEUE_NAMESPACE_LABEL
from tests.conftest import release_namespace
from tests.test_end_to_end import env_of
from tests.test_kueue_controller_cluster import GPU, KUEUE, V, condition, custom

pytestmark = pytest.mark.controlplane

MAP = "0=node1:0,1\n1=node2:0,1\n2=node3:0,1\n3=node4:0,1\n"


@pytest.fixture(scope="module")
def kueue_stack():
    with LocalStack(workloads=("kueue",)) as running:
        yield running


@pytest.fixture(scope="module")
def queue(kueue_stack):
    api = custom(kueue_stack)
    api.create_cluster_custom_object(KUEUE, V, "resourceflavors", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "ResourceFlavor", "metadata": {"name": "pinned"}})
    api.create_cluster_custom_object(KUEUE, V, "clusterqueues", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "ClusterQueue", "metadata": {"name": "preempting"},
        "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                     {"name": "pinned", "resources": [{"name": GPU, "nominalQuota": "8"}]}]}]}})
    for name, value in (("low", 100), ("high", 1000)):
        api.create_cluster_custom_object(KUEUE, V, "workloadpriorityclasses", {
            "apiVersion": f"{KUEUE}/{V}", "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})
    kueue_stack.wait_for(lambda: (condition(api.get_cluster_custom_object(KUEUE, V, "clusterqueues", "preempting"),
                                            "Active") or {}).get("status") == "True", 60, "ClusterQueue Active")
    yield "preempting"
    api.delete_cluster_custom_object(KUEUE, V, "clusterqueues", "preempting")
    for name in ("low", "high"):
        api.delete_cluster_custom_object(KUEUE, V, "workloadpriorityclasses", name)
    api.delete_cluster_custom_object(KUEUE, V, "resourceflavors", "pinned")


@pytest.fixture
def ns(kueue_stack, queue, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"kp-{request.node.name.lower()}")[:40].strip("-")
    kueue_stack.create_namespace(name, labels=KUEUE_NAMESPACE_LABEL)
    custom(kueue_stack).create_namespaced_custom_object(KUEUE, V, name, "localqueues", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "LocalQueue", "metadata": {"name": "team"}, "spec": {"clusterQueue": queue}})
    yield name
    release_namespace(kueue_stack, name)


def pinned_job(name: str, priority: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {
        f"{KUEUE}/queue-name": "team", f"{KUEUE}/priority-class": priority}},
        "spec": {"completionMode": "Indexed", "completions": 4, "parallelism": 4, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {"gpu-scheduling-map": MAP}},
            "spec": {"schedulerName": "gpu-scheduler", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "pause"}]}}}}


def job_pods(stack, namespace: str, name: str) -> list[dict]:
    return stack.pods(namespace, f"batch.kubernetes.io/job-name={name}")


def all_bound(stack, namespace: str, name: str) -> list[dict] | None:
    pods = [p for p in job_pods(stack, namespace, name) if not p["metadata"].get("deletionTimestamp")]
    return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None


def test_kueue_preempting_a_pinned_workload_frees_its_gpus_for_the_one_it_admits(kueue_stack, ns):
    batch = client.BatchV1Api(kueue_stack.api_client)
    batch.create_namespaced_job(ns, pinned_job("low", "low"))
    low = kueue_stack.wait_for(lambda: all_bound(kueue_stack, ns, "low"), 60, "the low-priority Job's 4 pods bound")
    job = json.loads(batch.read_namespaced_job("low", ns, _preload_content=False).data)
    counted = job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert counted[GPU] == "2", "mutate wrote the largest entry's GPUs on the Job's template"

    batch.create_namespaced_job(ns, pinned_job("high", "high"))

    def evicted_and_confirmed():
        """The low Job's pods deleted by its controller (Kueue suspended it); their deletion
        confirmed as the kubelet would."""
        terminating = [p for p in job_pods(kueue_stack, ns, "low") if p["metadata"].get("deletionTimestamp")]
        for pod in terminating:
            kueue_stack.api.delete_namespaced_pod(pod["metadata"]["name"], ns, grace_period_seconds=0)
        return not job_pods(kueue_stack, ns, "low")
    kueue_stack.wait_for(evicted_and_confirmed, 60, "the low-priority Job evicted by Kueue and its pods gone")
    assert json.loads(batch.read_namespaced_job("low", ns, _preload_content=False).data)["spec"]["suspend"] is True

    high = kueue_stack.wait_for(lambda: all_bound(kueue_stack, ns, "high"), 30, "the high-priority Job's 4 pods bound")
    where = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]:
             (p["spec"]["nodeName"], env_of(p)["CUDA_VISIBLE_DEVICES"]) for p in high}
    assert where == {"0": ("node1", "0,1"), "1": ("node2", "0,1"), "2": ("node3", "0,1"), "3": ("node4", "0,1")}
    assert {p["spec"]["nodeName"] for p in low} == {"node1", "node2", "node3", "node4"}
