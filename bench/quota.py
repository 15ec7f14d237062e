"""Quotas' cost, side by side in one run: pod creation latency through the webhook (admission) and
create-to-bound with bind, in namespaces with a ResourceQuota on pinned GPUs and without one.

With a quota the API server's quota admission checks and updates the quota's status (a write to
etcd) for every pod it admits, under the quota's own lock: pods of one namespace are admitted one
quota update at a time. That, not mutate's two more requests, is what a quota costs."""
from __future__ import annotations

import contextlib
import json
import statistics

from localcp.stack import LocalStack

from . import run

HARD = {"requests.gpu-scheduler.io/gpu": "100000"}  # never reached: the cost of counting, not of refusing


@contextlib.contextmanager
def namespaces(stack: LocalStack, quota: bool):
    """The namespaces bench.run creates meanwhile, listed; with `quota`, each gets the quota, ready
    (its use computed) before any pod is created in it."""
    original, made = stack.create_namespace, []

    def create(name: str) -> str:
        namespace = original(name)
        made.append(namespace)
        if quota:
            stack.apply({"apiVersion": "v1", "kind": "ResourceQuota",
                         "metadata": {"name": "gpus", "namespace": namespace}, "spec": {"hard": HARD}})
            stack.wait_for(lambda: json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/resourcequotas/gpus"))
                           .get("status", {}).get("used") is not None, 30, f"the quota of {namespace} ready")
        return namespace
    stack.create_namespace = create  # this object only, for the block
    try:
        yield made
    finally:
        del stack.create_namespace


def quota_cost(stack: LocalStack, n: int, reps: int) -> dict:
    """Interleaved runs (drift hits both alike): admission latency of n pods created one after
    another through the webhook, and create-to-bound of n pods placed by bind."""
    latencies: dict[str, list[float]] = {"without": [], "with": []}
    bound: dict[str, list[float]] = {"without": [], "with": []}
    map_text = run.map_for(n)
    for _ in range(reps):
        for mode in ("without", "with"):
            with namespaces(stack, mode == "with") as made:
                latencies[mode] += run.create_latencies(stack, n, map_text)
                # bind places those pods too: gone before the next run wants their GPUs.
                run.release(stack, made[-1])
                stack.wait_for(lambda: not stack.pods(made[-1]), 60, f"the pods of {made[-1]} gone")
                bound[mode].append(run.create_to_bound(stack, n, "bind", map_text)["bound_per_s"])
    figures = {mode: {"admission_p50_ms": statistics.median(latencies[mode]) * 1000,
                      "admission_p99_ms": run.percentile(latencies[mode], 99) * 1000,
                      "bound_per_s": statistics.median(bound[mode]), "runs_bound_per_s": bound[mode]}
               for mode in ("without", "with")}
    figures["admission_p50_ratio"] = figures["with"]["admission_p50_ms"] / figures["without"]["admission_p50_ms"]
    figures["bound_ratio"] = figures["with"]["bound_per_s"] / figures["without"]["bound_per_s"]
    figures["pods"] = n
    return figures


def rows(value: dict) -> list[str]:
    w, o = value["with"], value["without"]
    return [f"quota: admission p50 with/without {value['admission_p50_ratio']:.2f} ({w['admission_p50_ms']:.1f}/"
            f"{o['admission_p50_ms']:.1f} ms; p99 {w['admission_p99_ms']:.1f}/{o['admission_p99_ms']:.1f} ms)",
            f"quota: create-to-bound with/without {value['bound_ratio']:.2f} ({w['bound_per_s']:.1f}/"
            f"{o['bound_per_s']:.1f} pods/s) runs {[round(x, 1) for x in w['runs_bound_per_s']]} "
            f"{[round(x, 1) for x in o['runs_bound_per_s']]}"]
