"""JobSet and LeaderWorkerSet replicas pinned one by one, on the real control plane with the real
JobSet v0.10.1 and LeaderWorkerSet v0.7.0 controllers and their webhooks (localcp/workloads.py),
mutate as the webhook and bind as the scheduler. Node objects without kubelets: pods are bound and
stay Pending, enough for placement (tests/test_workloads_nodes.py runs them on real nodes).

Each case fails on the code before the JobSet/LWS index sources: there a JobSet's second child Job
and an LWS's second group read the same map entries as the first (their completion and worker
indexes start again at 0), and a gang was one child Job or one StatefulSet."""
from __future__ import annotations

import time

import pytest

from localcp.stack import LocalStack
from tests.conftest import release_namespace
from tests.test_end_to_end import env_of, statefulset
from tests.test_pending_reasons_cluster import failed_scheduling

pytestmark = pytest.mark.controlplane

GANG = "gpu-scheduler/gang"
IMAGE = "pause"  # never run: the nodes have no kubelets


@pytest.fixture(scope="module")
def workload_stack():
    with LocalStack(workloads=("jobset", "lws")) as running:
        yield running


@pytest.fixture
def ns(workload_stack, request) -> str:
    name = f"wl-{request.node.name.lower().replace('_', '-')}"[:50].rstrip("-")
    yield workload_stack.create_namespace(name)
    release_namespace(workload_stack, name)


def pod_template(map_text: str, gang: bool = False, restart: str = "Never") -> dict:
    annotations = {"gpu-scheduling-map": map_text}
    if gang:
        annotations[GANG] = "true"
    return {"metadata": {"annotations": annotations},
            "spec": {"schedulerName": "gpu-scheduler", "restartPolicy": restart, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": IMAGE}]}}


def replicated_job(name: str, replicas: int, parallelism: int, map_text: str, gang: bool = False) -> dict:
    return {"name": name, "replicas": replicas, "template": {"spec": {
        "parallelism": parallelism, "completions": parallelism, "completionMode": "Indexed", "backoffLimit": 0,
        "template": pod_template(map_text, gang)}}}


def jobset(namespace: str, name: str, *jobs: dict) -> dict:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"replicatedJobs": list(jobs)}}


def leader_worker_set(namespace: str, name: str, replicas: int, size: int, map_text: str, gang: bool = False) -> dict:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": {
                "size": size, "workerTemplate": pod_template(map_text, gang, restart="Always")}}}


def devices_of(pod: dict) -> str:
    return env_of(pod).get("CUDA_VISIBLE_DEVICES", "")


def placed(pods: list[dict]) -> dict[str, tuple[str, str, str]]:
    """pod name -> (its node, CUDA_VISIBLE_DEVICES mutate set, the devices bind recorded)."""
    return {p["metadata"]["name"]: (p["spec"].get("nodeName"), devices_of(p),
                                    (p["metadata"].get("annotations") or {}).get("gpu-scheduler/devices"))
            for p in pods}


def jobset_key(pod: dict) -> tuple[str, int, int]:
    labels = pod["metadata"]["labels"]
    return (labels["jobset.sigs.k8s.io/replicatedjob-name"], int(labels["jobset.sigs.k8s.io/job-index"]),
            int(labels["batch.kubernetes.io/job-completion-index"]))


def lws_key(pod: dict) -> tuple[int, int]:
    labels = pod["metadata"]["labels"]
    return int(labels["leaderworkerset.sigs.k8s.io/group-index"]), int(labels["leaderworkerset.sigs.k8s.io/worker-index"])


WORKERS_MAP = "0=node1:0\n1=node1:1\n2=node2:0\n3=node2:1\n"
DRIVER_MAP = "0=node3:2\n"


def test_every_pod_of_a_jobset_is_on_its_own_entry(workload_stack, ns):
    workload_stack.apply(jobset(ns, "train", replicated_job("workers", 2, 2, WORKERS_MAP),
                                replicated_job("driver", 1, 1, DRIVER_MAP)))
    pods = workload_stack.wait_bound(ns, 5, "jobset.sigs.k8s.io/jobset-name=train")
    want = {("workers", 0, 0): ("node1", "0"), ("workers", 0, 1): ("node1", "1"), ("workers", 1, 0): ("node2", "0"),
            ("workers", 1, 1): ("node2", "1"), ("driver", 0, 0): ("node3", "2")}
    got = {jobset_key(p): (p["spec"]["nodeName"], devices_of(p)) for p in pods}
    assert got == want
    for pod in pods:
        assert pod["metadata"]["annotations"]["gpu-scheduler/devices"] == devices_of(pod)
    # mutate wrote the Job's completions on every pod, which its index needs
    assert {p["metadata"]["annotations"]["gpu-scheduler/job-completions"] for p in pods} == {"2", "1"}


LWS_MAP = "0=node1:0\n1=node1:1\n2=node2:0\n3=node3:0\n4=node3:1\n5=node4:0\n"


def test_every_pod_of_a_leader_worker_set_is_on_its_own_entry(workload_stack, ns):
    workload_stack.apply(leader_worker_set(ns, "serve", 2, 3, LWS_MAP))
    pods = workload_stack.wait_bound(ns, 6, "leaderworkerset.sigs.k8s.io/name=serve")
    entries = {0: ("node1", "0"), 1: ("node1", "1"), 2: ("node2", "0"), 3: ("node3", "0"), 4: ("node3", "1"),
               5: ("node4", "0")}
    got = {lws_key(p): (p["spec"]["nodeName"], devices_of(p)) for p in pods}
    assert got == {(g, w): entries[g * 3 + w] for g in range(2) for w in range(3)}


def held_gpu_3_on_node4(stack, namespace: str) -> dict:
    """Another workload that holds node4's GPU 3: a StatefulSet of one replica, bound."""
    stack.apply(statefulset(namespace, "0=node4:3\n", replicas=1, name="holder"))
    [pod] = stack.wait_bound(namespace, 1, "app=holder")
    return pod


def release(stack, namespace: str, holder: dict) -> float:
    """Delete the holder for good (its pod at once: no kubelet finishes a graceful deletion); the
    time it is gone."""
    stack.cp.kubectl("delete", "statefulset", "holder", "-n", namespace, "--cascade=orphan")
    stack.api.delete_namespaced_pod(holder["metadata"]["name"], namespace, grace_period_seconds=0)
    stack.wait_for(lambda: not stack.pods(namespace, "app=holder"), 30, "the holder gone")
    return time.monotonic()


def gang_waiting(stack, namespace: str, selector: str, count: int, prefix: str) -> list[dict]:
    """The gang's `count` members, none bound, each with bind's FailedScheduling Event starting with
    `prefix`; fails as soon as a member is bound."""
    def waiting():
        pods = stack.pods(namespace, selector)
        bound = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        assert not bound, f"members bound while the gang is blocked: {bound}"
        if len(pods) < count:
            return None
        told = all(any(e["message"].startswith(prefix) for e in failed_scheduling(stack, namespace, p["metadata"]["uid"]))
                   for p in pods)
        return pods if told else None
    return stack.wait_for(waiting, 60, f"{count} members waiting with '{prefix}...'")


def test_a_jobset_gang_spans_its_replicated_jobs_and_waits_whole_for_a_held_gpu(workload_stack, ns):
    holder = held_gpu_3_on_node4(workload_stack, ns)
    workers = "0=node1:0\n1=node2:0\n2=node3:0\n3=node4:3\n"
    workload_stack.apply(jobset(ns, "train", replicated_job("workers", 2, 2, workers, gang=True),
                                replicated_job("driver", 1, 1, "0=node1:1\n", gang=True)))
    selector = "jobset.sigs.k8s.io/jobset-name=train"
    pods = gang_waiting(workload_stack, ns, selector, 5, f"gang {ns}/train: 4 of 5 members placeable")
    assert {p["metadata"]["annotations"]["gpu-scheduler/gang-size"] for p in pods} == {"5"}
    released = release(workload_stack, ns, holder)
    pods = workload_stack.wait_bound(ns, 5, selector, timeout=10)
    print(f"JobSet gang of 5 bound {time.monotonic() - released:.2f} s after the GPU's release")
    assert {jobset_key(p): p["spec"]["nodeName"] for p in pods} == {
        ("workers", 0, 0): "node1", ("workers", 0, 1): "node2", ("workers", 1, 0): "node3",
        ("workers", 1, 1): "node4", ("driver", 0, 0): "node1"}


def test_each_leader_worker_set_group_is_a_gang_of_its_own(workload_stack, ns):
    holder = held_gpu_3_on_node4(workload_stack, ns)
    lws_map = "0=node1:0\n1=node1:1\n2=node2:0\n3=node3:0\n4=node3:1\n5=node4:3\n"
    workload_stack.apply(leader_worker_set(ns, "serve", 2, 3, lws_map, gang=True))
    selector = "leaderworkerset.sigs.k8s.io/name=serve"
    group_0 = workload_stack.wait_bound(ns, 3, f"{selector},leaderworkerset.sigs.k8s.io/group-index=0")
    assert sorted(lws_key(p) for p in group_0) == [(0, 0), (0, 1), (0, 2)]
    gang_waiting(workload_stack, ns, f"{selector},leaderworkerset.sigs.k8s.io/group-index=1", 3,
                 f"gang {ns}/serve group 1: 2 of 3 members placeable")
    released = release(workload_stack, ns, holder)
    pods = workload_stack.wait_bound(ns, 6, selector, timeout=10)
    print(f"LWS group of 3 bound {time.monotonic() - released:.2f} s after the GPU's release")
    assert {lws_key(p): p["spec"]["nodeName"] for p in pods if lws_key(p)[0] == 1} == {
        (1, 0): "node3", (1, 1): "node3", (1, 2): "node4"}


def test_a_jobset_pod_the_webhook_did_not_admit_is_told_what_is_missing(workload_stack, ns):
    """A pod of job 1 of a JobSet without gpu-scheduler/job-completions (made here as the JobSet's
    controller labels it, mutate's webhook out of the way): bind's Event names the annotation and
    the fix, and the pod is not bound."""
    workload_stack.unregister_webhook()
    try:
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns, "annotations": {
            "gpu-scheduling-map": WORKERS_MAP}}, "spec": pod_template(WORKERS_MAP)["spec"]}
        workload_stack.wait_for(lambda: "gpu-scheduler/managed" not in (workload_stack.api.create_namespaced_pod(
            ns, probe, dry_run="All").metadata.labels or {}), 30, "the API server no longer calling mutate")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "train-workers-1-0", "namespace": ns,
            "labels": {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                       "jobset.sigs.k8s.io/job-index": "1", "batch.kubernetes.io/job-completion-index": "0",
                       "gpu-scheduler/managed": "true"},
            "annotations": {"gpu-scheduling-map": WORKERS_MAP, "batch.kubernetes.io/job-completion-index": "0"}},
            "spec": pod_template(WORKERS_MAP)["spec"]}
        created = workload_stack.api.create_namespaced_pod(ns, pod)
    finally:
        workload_stack.register_webhook()
    uid = created.metadata.uid
    events = workload_stack.wait_for(lambda: failed_scheduling(workload_stack, ns, uid) or None, 30,
                                     "bind's FailedScheduling Event")
    assert "annotation gpu-scheduler/job-completions" in events[0]["message"]
    assert "delete the pod: its Job re-creates it" in events[0]["message"]
    assert not workload_stack.api.read_namespaced_pod(pod["metadata"]["name"], ns).spec.node_name
