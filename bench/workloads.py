"""A JobSet's pods against the same pods as a StatefulSet (issue 37): create-to-bound of a 100-pod
JobSet (4 child Jobs × 25, one replicated job) as a gang and not, side by side with a StatefulSet of
100 replicas as a gang and not, on one stack with the real JobSet controller and its webhooks.

Each run: the workload created through the API in a fresh namespace, bench.run.map_for(100) as its
map (node1..node4, no GPU held by another workload); the JobSet and Job controllers (or the
StatefulSet controller) create the pods through the webhooks (JobSet's and mutate, which reads the
JobSet once for the Job's completions and the gang's size), the event source sends them to bind.
A watch of the namespace (bench.run.BoundWatch) sees each pod created and bound; the figure is
first created to last bound, shown with its two parts: first to last created (the controllers' pace:
the Job controller creates a Job's pods in growing batches, the StatefulSet controller with
podManagementPolicy Parallel all at once) and last created to last bound (bind's part; for a gang,
placing all its members once the last exists). The four alternate, their order rotated every repetition; medians,
and JobSet / StatefulSet for gang and non-gang (the issue's goal: at most 1.2 each).

    python -m bench.quick --only workloads [--replicas 100 --reps 3]
"""
from __future__ import annotations

import statistics

from kubernetes import client

from bench import framework, gang, namespace_name, run as bench_run, scale  # bench.run imports this one
from localcp.stack import LocalStack

PODS = 100
JOBS = 4
KINDS = ("JobSet", "StatefulSet")
GOAL = "<= 1.2"


def jobset(namespace: str, pods: int, as_gang: bool) -> dict:
    """check/statefulset.yaml's pod template in a JobSet of JOBS child Jobs of pods / JOBS each."""
    template = bench_run.statefulset(namespace, pods)["spec"]["template"]
    template["spec"]["restartPolicy"] = "Never"
    if as_gang:
        template["metadata"]["annotations"][gang.GANG] = "true"
    per_job = pods // JOBS
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "bench", "namespace": namespace},
            "spec": {"replicatedJobs": [{"name": "node", "replicas": JOBS, "template": {"spec": {
                "parallelism": per_job, "completions": per_job, "completionMode": "Indexed", "backoffLimit": 0,
                "template": template}}}]}}


def one_run(stack: LocalStack, pods: int, kind: str, as_gang: bool) -> dict:
    """One workload of `pods` pods created, until every pod was seen bound: create-to-bound, and
    last created to last bound (tail), in s."""
    namespace = stack.create_namespace(namespace_name())
    watch = bench_run.BoundWatch(stack, namespace)
    try:
        if kind == "JobSet":
            client.CustomObjectsApi(stack.api_client).create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", jobset(namespace, pods, as_gang))
        else:
            manifest = bench_run.statefulset(namespace, pods)
            if as_gang:
                manifest["spec"]["template"]["metadata"]["annotations"][gang.GANG] = "true"
            client.AppsV1Api(stack.api_client).create_namespaced_stateful_set(namespace, manifest,
                                                                              _preload_content=False)
        last_bound = scale.wait_all_bound(watch, pods)
    finally:
        watch.stop()
        if kind == "JobSet":  # its controllers first, or they create the pods again
            client.CustomObjectsApi(stack.api_client).delete_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "bench",
                body=client.V1DeleteOptions(propagation_policy="Orphan"))
            client.BatchV1Api(stack.api_client).delete_collection_namespaced_job(
                namespace, body=client.V1DeleteOptions(propagation_policy="Orphan"))
        gang.emptied(stack, namespace)
    first, last = min(watch.seen.values()), max(watch.seen.values())
    return {"create_to_bound_s": last_bound - first, "tail_s": last_bound - last, "created_s": last - first}


def workload_speed(stack: LocalStack, pods: int = PODS, reps: int = 3) -> dict:
    """The four runs (JobSet and StatefulSet, gang and not), rotated, `reps` times each."""
    records = framework.OneBind(stack)
    framework.wait_idle(stack)
    baseline = records.settle()
    cases = [(kind, as_gang) for as_gang in (False, True) for kind in KINDS]
    runs: dict[tuple[str, bool], list[dict]] = {case: [] for case in cases}
    for rep in range(reps):
        for kind, as_gang in cases[rep % len(cases):] + cases[:rep % len(cases)]:
            runs[(kind, as_gang)].append(one_run(stack, pods, kind, as_gang))
            framework.wait_idle(stack)
            records.settle(baseline)
    figures: dict = {"pods": pods, "jobs": JOBS, "reps": reps}
    for which, as_gang in (("non-gang", False), ("gang", True)):
        jobset_runs, sts_runs = runs[("JobSet", as_gang)], runs[("StatefulSet", as_gang)]
        jobset_s = statistics.median(r["create_to_bound_s"] for r in jobset_runs)
        sts_s = statistics.median(r["create_to_bound_s"] for r in sts_runs)
        figures[which] = {"jobset_s": jobset_s, "statefulset_s": sts_s, "ratio": jobset_s / sts_s,
                          "jobset_tail_s": statistics.median(r["tail_s"] for r in jobset_runs),
                          "statefulset_tail_s": statistics.median(r["tail_s"] for r in sts_runs),
                          "jobset_created_s": statistics.median(r["created_s"] for r in jobset_runs),
                          "statefulset_created_s": statistics.median(r["created_s"] for r in sts_runs),
                          "runs": {"jobset": jobset_runs, "statefulset": sts_runs}}
    return figures


def rows(f: dict) -> list[str]:
    """The figures as rows of bench.run's table."""
    def each(runs: list[dict]) -> str:
        return ", ".join(f"{r['create_to_bound_s']:.2f}" for r in runs)

    out = []
    for which in ("non-gang", "gang"):
        g = f[which]
        value = f"{g['ratio']:.2f} ({g['jobset_s']:.2f}/{g['statefulset_s']:.2f}s)"
        label = f"JobSet {JOBS}x{f['pods'] // JOBS} / StatefulSet of {f['pods']}, {which}, create-to-bound"
        out.append(f"{label:<62} {value:>20} {GOAL:>12}  {'PASS' if g['ratio'] <= 1.2 else 'MISS'}")
        out.append(f"{'  first created -> last created (ms, the controllers), JobSet / StatefulSet':<62}"
                   f" {round(g['jobset_created_s'] * 1000)} / {round(g['statefulset_created_s'] * 1000)}")
        out.append(f"{'  last created -> last bound (ms, bind), JobSet / StatefulSet':<62} {round(g['jobset_tail_s'] * 1000)}"
                   f" / {round(g['statefulset_tail_s'] * 1000)}")
        out.append(f"{'  runs, create-to-bound (s), JobSet; StatefulSet':<62} {each(g['runs']['jobset'])};"
                   f" {each(g['runs']['statefulset'])}")
    return out
