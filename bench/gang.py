"""Gang placement's speed (issue 27): a StatefulSet placed as a gang (`gpu-scheduler/gang: "true"`)
against the same StatefulSet placed replica by replica, side by side on one stack.

Each run: check/statefulset.yaml (podManagementPolicy: Parallel) in a fresh namespace, REPLICAS
replicas, bench.run.map_for's map over node1..node4 (no GPU held by another workload), created
through the API; the StatefulSet controller creates the pods, through the webhook, and the event
source sends them to bind. A watch of the namespace (bench.run.BoundWatch) sees each pod created
and bound. Figures per run: from the first pod seen created to the last seen bound
(create-to-bound), from the last created to the last bound (tail: for a gang, what placing the
whole gang takes once it is complete), and from the first Binding to the last (a gang's are all
after its last member is created). The two alternate, their order swapped every repetition;
medians, and gang / non-gang create-to-bound (the issue's goal: at most 1.2). Between runs, the
pods are deleted at once and bind's records of them let go, so each run starts from free GPUs.

    python -m bench.quick --only gang [--replicas 100 --reps 4]
"""
from __future__ import annotations

import statistics

from kubernetes import client

from bench import framework, namespace_name, run as bench_run, scale  # modules: bench.run imports this one
from localcp.stack import LocalStack

REPLICAS = 100
GANG = "gpu-scheduler/gang"
WHICH = ("gang", "non-gang")
GOAL = "<= 1.2"


def one_run(stack: LocalStack, replicas: int, gang: bool, after_bound=None) -> dict:
    """One StatefulSet of `replicas` created, until every pod was seen bound; its timings (s).
    after_bound: called once every pod was seen bound, before they are deleted (bench.framework
    waits there for bind to be quiet, to read its CPU)."""
    namespace = stack.create_namespace(namespace_name())
    manifest = bench_run.statefulset(namespace, replicas)
    if gang:
        manifest["spec"]["template"]["metadata"]["annotations"][GANG] = "true"
    watch = bench_run.BoundWatch(stack, namespace)
    try:
        client.AppsV1Api(stack.api_client).create_namespaced_stateful_set(namespace, manifest,
                                                                          _preload_content=False)
        last_bound = scale.wait_all_bound(watch, replicas)
        if after_bound:
            after_bound()
    finally:
        watch.stop()
        emptied(stack, namespace)
    first_created, last_created = min(watch.seen.values()), max(watch.seen.values())
    return {"create_to_bound_s": last_bound - first_created, "tail_s": last_bound - last_created,
            "created_s": last_created - first_created, "bindings_s": last_bound - min(watch.bound.values())}


def emptied(stack: LocalStack, namespace: str) -> None:
    """bench.run.release until no pod of the namespace is left."""
    def empty() -> bool:
        if not stack.pods(namespace):
            return True
        bench_run.release(stack, namespace)
        return False
    stack.wait_for(empty, 60, f"no pod left in {namespace}", interval=0.5)


def gang_speed(stack: LocalStack, replicas: int = REPLICAS, reps: int = 3) -> dict:
    """A gang of `replicas` and the same StatefulSet without the annotation, alternated (order
    swapped every repetition), `reps` times each; medians and gang / non-gang."""
    records = framework.OneBind(stack)  # (its Lease count: bind's device records)
    framework.wait_idle(stack)
    baseline = records.settle()
    runs: dict[str, list[dict]] = {which: [] for which in WHICH}
    for rep in range(reps):
        for which in (WHICH if rep % 2 == 0 else WHICH[::-1]):
            runs[which].append(one_run(stack, replicas, which == "gang"))
            framework.wait_idle(stack)  # the deletions delivered to bind,
            records.settle(baseline)  # and its records of those pods let go
    figures: dict = {"replicas": replicas, "reps": reps}
    for which, rs in runs.items():
        figures[which] = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        figures[which]["runs"] = rs
    figures["ratio"] = figures["gang"]["create_to_bound_s"] / figures["non-gang"]["create_to_bound_s"]
    return figures


def rows(f: dict) -> list[str]:
    """The figure as rows of bench.run's table."""
    gang, alone = f["gang"], f["non-gang"]
    value = f"{f['ratio']:.2f} ({gang['create_to_bound_s']:.2f}/{alone['create_to_bound_s']:.2f}s)"

    def ms(figure: dict, key: str) -> str:
        return f"{round(figure[key] * 1000)}"

    def each(figure: dict) -> str:
        return ", ".join(f"{r['create_to_bound_s']:.2f}" for r in figure["runs"])
    return [
        f"{'gang of ' + str(f['replicas']) + ' / same StatefulSet without, create-to-bound':<62} {value:>20}"
        f" {GOAL:>12}  {'PASS' if f['ratio'] <= 1.2 else 'MISS'}",
        f"{'  gang: last member created -> last Binding (ms)':<62} {ms(gang, 'tail_s')}"
        f"   (non-gang: last created -> last bound {ms(alone, 'tail_s')})",
        f"{'  first created -> last created (ms), gang / non-gang':<62} {ms(gang, 'created_s')} / {ms(alone, 'created_s')}",
        f"{'  first Binding -> last Binding (ms), gang / non-gang':<62} {ms(gang, 'bindings_s')} / {ms(alone, 'bindings_s')}",
        f"{'  runs, create-to-bound (s), gang; non-gang':<62} {each(gang)}; {each(alone)}",
    ]
