"""The real JobSet (sigs.k8s.io/jobset v0.10.1) and LeaderWorkerSet (sigs.k8s.io/lws v0.7.0)
controllers beside the local control plane (localcp/workloads.py, LocalStack(workloads=...)), with
their CRDs and their webhooks registered by URL with a CA of ours, as envtest runs them:

- a JobSet of one replicated job (2 Jobs of parallelism 2, completions 2) gets its 4 pods, made
  by the JobSet controller's Jobs and the job controller, each labelled by JobSet's pod webhook
  and Job controller: jobset name, job index, replicated job replicas, completion index; the
  (job index, completion index) pairs are the 4 distinct ones;
- a LeaderWorkerSet of 2 groups of size 3 gets its 6 pods (leader StatefulSet, then a worker
  StatefulSet per leader), each with its name, group index, worker index and size; the (group,
  worker) pairs are the 6 distinct ones;
- a JobSet whose replicated job name makes invalid Job names is refused by JobSet's validating
  webhook: the API server calls it.

No node runs these pods: their scheduler (no-such-scheduler) does not exist, so they stay Pending.
Needs localcp/build-workloads.sh's build (localcp/build.sh, `make controlplane`, runs it).
"""
from __future__ import annotations

import json
import re

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localcp.stack import LocalStack
from tests.conftest import release_namespace

pytestmark = pytest.mark.controlplane

POD_SPEC = {"schedulerName": "no-such-scheduler",
            "containers": [{"name": "main", "image": "pause"}]}
JOBSET = "jobset.sigs.k8s.io"
LWS = "leaderworkerset.sigs.k8s.io"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture(scope="module")
def workload_stack():
    with LocalStack(workloads=("jobset", "lws"), event_source=True) as running:
        print(f"\nworkload controllers (jobset, lws) started in {running.workloads.started_seconds:.1f}s")
        yield running


@pytest.fixture
def ns(workload_stack, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"wl-{request.node.name.lower()}")[:40].strip("-")
    yield workload_stack.create_namespace(name)
    release_namespace(workload_stack, name)


def custom(stack) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(stack.api_client)


def jobset(name: str, replicated_job: str = "workers") -> dict:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": replicated_job, "replicas": 2, "template": {"spec": {
                "parallelism": 2, "completions": 2, "backoffLimit": 0,
                "template": {"spec": POD_SPEC}}}}]}}


def pods_when(stack, namespace: str, selector: str, count: int, what: str) -> list[dict]:
    return stack.wait_for(lambda: (lambda pods: pods if len(pods) == count else None)(stack.pods(namespace, selector)),
                          90, what)


def test_jobset_gets_its_indexed_pods(workload_stack, ns):
    custom(workload_stack).create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets",
                                                           jobset("train"))
    pods = pods_when(workload_stack, ns, f"{JOBSET}/jobset-name=train", 4, "4 pods of JobSet train")
    pairs = set()
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations") or {}
        assert labels[f"{JOBSET}/jobset-name"] == "train"
        assert labels[f"{JOBSET}/replicatedjob-replicas"] == "2"
        assert annotations[COMPLETION_INDEX] == labels[COMPLETION_INDEX]
        assert pod["spec"]["schedulerName"] == "no-such-scheduler" and not pod["spec"].get("nodeName")
        pairs.add((labels[f"{JOBSET}/job-index"], labels[COMPLETION_INDEX]))
    assert pairs == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}


def test_leaderworkerset_gets_its_groups(workload_stack, ns):
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "serve"},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 3, "workerTemplate": {"spec": POD_SPEC}}}}
    custom(workload_stack).create_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", ns,
                                                           "leaderworkersets", lws)
    pods = pods_when(workload_stack, ns, f"{LWS}/name=serve", 6, "6 pods of LeaderWorkerSet serve")
    pairs = set()
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations") or {}
        assert labels[f"{LWS}/name"] == "serve"
        assert annotations[f"{LWS}/size"] == "3"
        pairs.add((labels[f"{LWS}/group-index"], labels[f"{LWS}/worker-index"]))
    assert pairs == {(str(g), str(w)) for g in range(2) for w in range(3)}


def test_jobset_validating_webhook_refuses_invalid_job_names(workload_stack, ns):
    with pytest.raises(ApiException) as refused:
        custom(workload_stack).create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets",
                                                               jobset("bad", replicated_job="Not_A_DNS_Label"))
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "vjobset.kb.io" denied the request' in message, message
    assert "Not_A_DNS_Label" in message
    assert custom(workload_stack).list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns,
                                                                "jobsets")["items"] == []
