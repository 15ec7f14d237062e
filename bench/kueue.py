"""Kueue's cost for pinned workloads, side by side in one run on a stack with the real Kueue
(LocalStack(workloads=(..., "kueue"))): in a namespace Kueue manages (labelled
KUEUE_NAMESPACE_LABEL, a LocalQueue) against the same objects in a plain namespace, where Kueue's
webhooks are not called (their namespaceSelector) and its controllers leave everything alone.

- admission: the latency of creating, one after another, n pinned pods and n pinned Jobs (one pod
  each) through the webhooks. Managed: labelled with the queue-name of a LocalQueue whose
  ClusterQueue is held (stopPolicy Hold), so that Kueue's webhooks gate each pod
  (kueue.x-k8s.io/admission) and suspend each Job, mutate writes the pod's or the template's counts,
  and nothing is admitted meanwhile. Plain: the pods carry a scheduling gate of ours and the Jobs
  `suspend: true`, so that in both no pod is placed and only the webhooks' path differs.
- create-to-bound: one pinned Indexed Job of n pods (bench.run.map_for(n)), from its creation to
  its last pod seen bound. Managed: queued in a ClusterQueue far larger than the job (Kueue's
  webhook suspends it, its Workload is created, admitted, the Job unsuspended; then the Job
  controller creates the pods, mutate and bind as without). Plain: the same Job without the label.

The two alternate, their order swapped every repetition; medians and managed / plain.

    python -m bench.quick --only kueue [--replicas 100 --reps 2]
"""
from __future__ import annotations

import statistics
import time

from kubernetes import client

from bench import framework, gang, namespace_name, run as bench_run, scale  # bench.run imports this one
from localcp.stack import LocalStack
from localcp.workloads import KUEUE_NAMESPACE_LABEL

KUEUE, V = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = f"{KUEUE}/queue-name"
FLAVOR, OPEN, HELD = "bench-flavor", "bench-open", "bench-held"  # the ClusterQueues; LocalQueues alike
PODS = 100
MODES = ("plain", "kueue")
HOLD_GATE = "bench.gpu-scheduler/hold"


def custom(stack: LocalStack) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(stack.api_client)


def active(obj: dict) -> bool:
    return any(c["type"] == "Active" and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or [])


def cluster_queues(stack: LocalStack) -> None:
    """The flavor and two ClusterQueues: OPEN, whose quota no run reaches, and HELD, which admits nothing."""
    api = custom(stack)
    api.create_cluster_custom_object(KUEUE, V, "resourceflavors", {
        "apiVersion": f"{KUEUE}/{V}", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
    resources = [{"name": "cpu", "nominalQuota": "100000"}, {"name": "memory", "nominalQuota": "100000Gi"},
                 {"name": "gpu-scheduler.io/gpu", "nominalQuota": "100000"}]
    for name in (OPEN, HELD):
        api.create_cluster_custom_object(KUEUE, V, "clusterqueues", {
            "apiVersion": f"{KUEUE}/{V}", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, **({"stopPolicy": "Hold"} if name == HELD else {}),
                     "resourceGroups": [{"coveredResources": [r["name"] for r in resources],
                                         "flavors": [{"name": FLAVOR, "resources": resources}]}]}})
    stack.wait_for(lambda: active(api.get_cluster_custom_object(KUEUE, V, "clusterqueues", OPEN)), 60,
                   f"ClusterQueue {OPEN} Active")


def namespace(stack: LocalStack, mode: str) -> str:
    """A fresh namespace: plain, or managed by Kueue with LocalQueues OPEN and HELD (OPEN Active)."""
    if mode == "plain":
        return stack.create_namespace(namespace_name())
    name = stack.create_namespace(namespace_name(), labels=KUEUE_NAMESPACE_LABEL)
    api = custom(stack)
    for queue in (OPEN, HELD):
        api.create_namespaced_custom_object(KUEUE, V, name, "localqueues", {
            "apiVersion": f"{KUEUE}/{V}", "kind": "LocalQueue", "metadata": {"name": queue},
            "spec": {"clusterQueue": queue}})
    stack.wait_for(lambda: active(api.get_namespaced_custom_object(KUEUE, V, name, "localqueues", OPEN)), 60,
                   f"LocalQueue {OPEN} of {name} Active")
    return name


def job(namespace: str, pods: int, map_text: str, queue: str | None, suspend: bool = False) -> dict:
    """A pinned Indexed Job of `pods` pods (busybox: the bench's nodes run nothing)."""
    template = {"metadata": {"annotations": {"gpu-scheduling-map": map_text}},
                "spec": {"schedulerName": "gpu-scheduler", "restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "busybox"}]}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "bench", "namespace": namespace, "labels": {QUEUE_LABEL: queue} if queue else {}},
            "spec": {"completionMode": "Indexed", "completions": pods, "parallelism": pods, "backoffLimit": 0,
                     "suspend": suspend, "template": template}}


def admission(stack: LocalStack, mode: str, n: int) -> dict[str, list[float]]:
    """The creation latencies (s) of n pinned pods, then n pinned one-pod Jobs, one after another,
    none of them placed (see the module's docstring)."""
    ns = namespace(stack, mode)
    batch = client.BatchV1Api(stack.api_client)
    map_text = bench_run.map_for(n)
    latencies: dict[str, list[float]] = {"pod": [], "job": []}
    try:
        for i in range(n):
            body = bench_run.pod(ns, i, map_text)
            if mode == "kueue":
                body["metadata"]["labels"] = {QUEUE_LABEL: HELD}
            else:
                body["spec"]["schedulingGates"] = [{"name": HOLD_GATE}]
            started = time.perf_counter()
            stack.api.create_namespaced_pod(ns, body, _preload_content=False)
            latencies["pod"].append(time.perf_counter() - started)
        for i in range(n):
            body = job(ns, 1, f"0=node{i % 4 + 1}:{i % 4}\n", HELD if mode == "kueue" else None, suspend=True)
            body["metadata"]["name"] = f"bench-{i}"
            started = time.perf_counter()
            batch.create_namespaced_job(ns, body, _preload_content=False)
            latencies["job"].append(time.perf_counter() - started)
    finally:
        emptied(stack, ns)
    return latencies


def emptied(stack: LocalStack, ns: str) -> None:
    """The namespace's Jobs deleted (orphaning their pods), then every pod of it gone."""
    client.BatchV1Api(stack.api_client).delete_collection_namespaced_job(
        ns, body=client.V1DeleteOptions(propagation_policy="Orphan"))
    gang.emptied(stack, ns)


def create_to_bound(stack: LocalStack, mode: str, pods: int) -> dict:
    """One pinned Indexed Job of `pods` pods, created, until every pod was seen bound: create-to-
    bound, first pod created, last created to last bound (tail), in s."""
    ns = namespace(stack, mode)
    watch = bench_run.BoundWatch(stack, ns)
    try:
        started = time.perf_counter()
        client.BatchV1Api(stack.api_client).create_namespaced_job(
            ns, job(ns, pods, bench_run.map_for(pods), OPEN if mode == "kueue" else None), _preload_content=False)
        last_bound = scale.wait_all_bound(watch, pods)
    finally:
        watch.stop()
        emptied(stack, ns)
    return {"create_to_bound_s": last_bound - started, "first_pod_s": min(watch.seen.values()) - started,
            "tail_s": last_bound - max(watch.seen.values())}


def kueue_cost(stack: LocalStack, pods: int = PODS, reps: int = 2, n: int | None = None) -> dict:
    """Admission of n pods and n Jobs (n: `pods` unless given), and create-to-bound of a Job of
    `pods`, plain and managed by Kueue, alternated, `reps` times each."""
    n = n or pods
    cluster_queues(stack)
    framework.wait_idle(stack)
    latencies = {mode: {"pod": [], "job": []} for mode in MODES}
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for rep in range(reps):
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            for kind, values in admission(stack, mode, n).items():
                latencies[mode][kind] += values
            framework.wait_idle(stack)
            runs[mode].append(create_to_bound(stack, mode, pods))
            framework.wait_idle(stack)
    figures: dict = {"pods": pods, "admitted_each": n * reps, "reps": reps}
    for mode in MODES:
        figures[mode] = {f"{kind}_admission_{q}_ms": (statistics.median(v) if q == "p50" else
                                                      bench_run.percentile(v, 99)) * 1000
                         for kind, v in latencies[mode].items() for q in ("p50", "p99")}
        figures[mode].update(create_to_bound_s=statistics.median(r["create_to_bound_s"] for r in runs[mode]),
                             first_pod_s=statistics.median(r["first_pod_s"] for r in runs[mode]),
                             tail_s=statistics.median(r["tail_s"] for r in runs[mode]), runs=runs[mode])
    k, p = figures["kueue"], figures["plain"]
    figures["ratios"] = {"pod_admission_p50": k["pod_admission_p50_ms"] / p["pod_admission_p50_ms"],
                         "job_admission_p50": k["job_admission_p50_ms"] / p["job_admission_p50_ms"],
                         "create_to_bound": k["create_to_bound_s"] / p["create_to_bound_s"]}
    return figures


def rows(f: dict) -> list[str]:
    """The figures as rows of bench.run's table."""
    k, p, r = f["kueue"], f["plain"], f["ratios"]
    return [f"kueue: pod admission p50 Kueue/plain {r['pod_admission_p50']:.2f} ({k['pod_admission_p50_ms']:.1f}/"
            f"{p['pod_admission_p50_ms']:.1f} ms; p99 {k['pod_admission_p99_ms']:.1f}/{p['pod_admission_p99_ms']:.1f} ms;"
            f" {f['admitted_each']} each)",
            f"kueue: Job admission p50 Kueue/plain {r['job_admission_p50']:.2f} ({k['job_admission_p50_ms']:.1f}/"
            f"{p['job_admission_p50_ms']:.1f} ms; p99 {k['job_admission_p99_ms']:.1f}/{p['job_admission_p99_ms']:.1f} ms)",
            f"kueue: Indexed Job of {f['pods']} create-to-bound Kueue/plain {r['create_to_bound']:.2f} "
            f"({k['create_to_bound_s']:.2f}/{p['create_to_bound_s']:.2f} s; first pod {k['first_pod_s']:.2f}/"
            f"{p['first_pod_s']:.2f} s; tail {k['tail_s']:.2f}/{p['tail_s']:.2f} s) runs "
            f"{[round(x['create_to_bound_s'], 2) for x in k['runs']]} {[round(x['create_to_bound_s'], 2) for x in p['runs']]}"]

