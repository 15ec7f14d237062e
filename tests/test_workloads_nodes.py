"""A JobSet restarted by its failure policy, on the four real nodes (kubelet + containerd each) with
the real JobSet v0.10.1 controller: one pod fails on the first attempt, the JobSet deletes every child
Job and creates them again, and the new pods are placed on the same entries as the old ones, each
only once the old pod of its entry is gone; each logs its node and CUDA_VISIBLE_DEVICES.

Fails on the code before the JobSet index source: there job 1's pods read job 0's entries, and,
being another Job's, wait forever behind them."""
from __future__ import annotations

import pytest

from localcp.stack import LocalStack
from tests.conftest import release_namespace
from tests.test_nodes import logged, running

pytestmark = pytest.mark.controlplane

CHECK_IMAGE = "kind.local/gpu-scheduler-check:latest"
MAP = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n"
ENTRIES = {0: ("node1", "0,1"), 1: ("node2", "2"), 2: ("node3", "0,1,2"), 3: ("node4", "3")}
RESTART = "jobset.sigs.k8s.io/restart-attempt"
# The first attempt's pod of job 1, completion 1 fails after a few seconds; every other pod runs the
# check (check/check.py) until stopped.
COMMAND = ("import os, runpy, sys, time\n"
           "if os.environ['ATTEMPT'] == '0' and os.environ['JOB'] == '1' and os.environ['COMPLETION'] == '1':\n"
           "    time.sleep(3); sys.exit(1)\n"
           "runpy.run_path('/app/check.py', run_name='__main__')\n")


@pytest.fixture(scope="module")
def nodes_stack():
    with LocalStack(real_nodes=True, workloads=("jobset",)) as running_stack:
        yield running_stack


def field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def restarting_jobset(namespace: str) -> dict:
    template = {"metadata": {"annotations": {"gpu-scheduling-map": MAP}}, "spec": {
        "schedulerName": "gpu-scheduler", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "check", "image": CHECK_IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["python", "-c", COMMAND], "env": [
                            field_env("NODE_NAME", "spec.nodeName"),
                            field_env("ATTEMPT", f"metadata.labels['{RESTART}']"),
                            field_env("JOB", "metadata.labels['jobset.sigs.k8s.io/job-index']"),
                            field_env("COMPLETION", "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
                            {"name": "CHECK_INTERVAL_SECONDS", "value": "1"}]}]}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "restart", "namespace": namespace},
            "spec": {"failurePolicy": {"maxRestarts": 1}, "replicatedJobs": [{"name": "node", "replicas": 2, "template": {
                "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed", "backoffLimit": 0,
                         "template": template}}}]}}


def index_of(pod: dict) -> int:
    labels = pod["metadata"]["labels"]
    return int(labels["jobset.sigs.k8s.io/job-index"]) * 2 + int(labels["batch.kubernetes.io/job-completion-index"])


def test_a_restarted_jobset_is_placed_on_the_same_entries_once_the_old_pods_are_gone(nodes_stack):
    ns = nodes_stack.create_namespace("jobset-restart")
    try:
        nodes_stack.apply(restarting_jobset(ns))
        selector = "jobset.sigs.k8s.io/jobset-name=restart"
        first = nodes_stack.wait_for(lambda: running(nodes_stack, ns, 4, f"{selector},{RESTART}=0"), 120,
                                     "the first attempt's 4 pods Running")
        assert {index_of(p): p["spec"]["nodeName"] for p in first} == {i: node for i, (node, _) in ENTRIES.items()}

        def second_attempt():
            pods = nodes_stack.pods(ns, selector)
            old = {index_of(p) for p in pods if p["metadata"]["labels"][RESTART] == "0"}
            new = [p for p in pods if p["metadata"]["labels"][RESTART] == "1"]
            early = [p["metadata"]["name"] for p in new if p["spec"].get("nodeName") and index_of(p) in old]
            assert not early, f"bound while the old pod of its entry is still there: {early}"
            up = [p for p in new if p["status"].get("phase") == "Running"]
            return new if not old and len(up) == 4 else None
        second = nodes_stack.wait_for(second_attempt, 180, "the restarted JobSet's 4 pods Running, the old ones gone")
        for pod in second:
            node, devices = ENTRIES[index_of(pod)]
            assert pod["spec"]["nodeName"] == node
            assert logged(nodes_stack, ns, pod["metadata"]["name"]) == f"node={node} CUDA_VISIBLE_DEVICES={devices}"
    finally:
        release_namespace(nodes_stack, ns)
