"""Pools (issue 44): a Deployment's pods take a free entry of the map. Create-to-bound and bind's API
writes per placement of a pinned Deployment of 100 replicas, side by side with a pinned StatefulSet
of 100 replicas (the same pod template and map), on one stack.

Each run: the workload created through the API in a fresh namespace, bench.run.map_for(100) as its
map (100 entries over node1..node4, no GPU held by another workload); the Deployment and ReplicaSet
controllers (or the StatefulSet controller, podManagementPolicy Parallel) create the pods through
the webhook, bind places them (its watch, and the event source). A watch of the namespace
(bench.run.BoundWatch) sees each pod created and bound. Create-to-bound is the first pod seen
created to the last seen bound (as bench.workloads and bench.gang count it), shown with its parts:
the workload's creation to its first pod (for a Deployment, the Deployment controller creating the
ReplicaSet first), first to last created (the controllers' pace: the ReplicaSet controller creates
pods in growing batches, 1, 2, 4, ...) and last created to last bound (bind's part). The two
alternate, their order swapped every repetition, after one run of the StatefulSet not counted (a
fresh stack's first workload is slower); medians, and Deployment / StatefulSet (the issue's goal:
at most 1.1).

API writes per placement: bind has no counter of its own API calls (functions/bind/metrics.py
counts attempts, not requests), so they are counted by the API server: FlowSchemas that match
only bind's ServiceAccount (localcp.stack.BIND_ACCOUNT), one per kind of write (Binding, other pod
writes, Lease create / update / delete, Events, any other write) and one for its reads, all at
bind's usual priority level (workload-low, where the default `service-accounts` schema puts it), so
that apiserver_flowcontrol_dispatched_requests_total{flow_schema} counts bind's requests by kind
and nothing else's. Read once bind was quiet before the workload was created and once every pod
was bound and bind quiet again (its Events are written in the background): the difference over
the pods bound is the writes per placement; and again once the pods were deleted and bind let go
of its records (its Leases back to their number before, or steady for 2 s).
The issue's goal: the Deployment's at most one more per placement than the StatefulSet's. bind's
sweep deletes free records every 30 s, in whichever window it falls: the Leases created and deleted
are printed for the whole series, not per run (each record created is deleted once, or taken over
by an update that is counted where it happens). bind's
CPU (user + system of its processes, from /proc) over the same window, per placement.

A run whose pods are not all bound within DEADLINE_S is printed as not bound, with how many were
created and bound and why (the pending pod's condition, or the namespace's last Warning Event),
and later runs of that kind are skipped: a bind without pools leaves a Deployment's pods pending.

    python -m bench.quick --only pool [--replicas 100 --reps 4]
"""
from __future__ import annotations

import json
import re
import statistics
import time
import urllib.error

from kubernetes import client

from bench import framework, gang, namespace_name, profile, run as bench_run  # bench.run imports this one
from localcp.stack import BIND_ACCOUNT, LocalStack

PODS = 100
KINDS = ("Deployment", "StatefulSet")
GOAL = 1.1  # Deployment / StatefulSet, create-to-bound
WRITES_GOAL = 1.0  # Deployment - StatefulSet, API writes per placement
CPU_GOAL = 1.2  # issue 53: bind's CPU per placement, Deployment / StatefulSet
DEADLINE_S = 60.0  # per run, from the workload's creation to its last pod bound
NAME = "bench"

FLOW = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"
FLOW_PREFIX = "bench-pool-bind-"
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total{"
LABEL = re.compile(r'(\w+)="([^"]*)"')
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
# (kind of request, verbs, apiGroups, resources): the first that matches counts it (matchingPrecedence
# in this order, all before the default schemas at 1000 and more).
KINDS_OF_REQUEST = (
    ("binding", ["create"], [""], ["pods/binding"]),
    ("pod", WRITE_VERBS, [""], ["pods", "pods/status", "pods/eviction"]),
    ("lease-create", ["create"], ["coordination.k8s.io"], ["leases"]),
    ("lease-update", ["update", "patch"], ["coordination.k8s.io"], ["leases"]),
    ("lease-delete", ["delete", "deletecollection"], ["coordination.k8s.io"], ["leases"]),
    ("event", WRITE_VERBS, ["", "events.k8s.io"], ["events"]),
    ("other-write", WRITE_VERBS, ["*"], ["*"]),
    ("read", ["*"], ["*"], ["*"]),
)
WRITES = tuple(kind for kind, *_ in KINDS_OF_REQUEST if kind != "read")


# -- counting bind's requests --------------------------------------------------------------------
def flow_schemas(stack: LocalStack) -> list[str]:
    """One FlowSchema per kind of bind's requests (KINDS_OF_REQUEST); their names."""
    namespace, account = BIND_ACCOUNT
    names = []
    for precedence, (kind, verbs, groups, resources) in enumerate(KINDS_OF_REQUEST, start=500):
        name = FLOW_PREFIX + kind
        rule = {"verbs": verbs, "apiGroups": groups, "resources": resources, "namespaces": ["*"],
                "clusterScope": True}
        body = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
                "spec": {"priorityLevelConfiguration": {"name": "workload-low"}, "matchingPrecedence": precedence,
                         "distinguisherMethod": {"type": "ByUser"},
                         "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                             "namespace": namespace, "name": account}}], "resourceRules": [rule]}]}}
        try:
            stack.cp.request("POST", FLOW, body)
        except urllib.error.HTTPError as error:
            if error.code != 409:  # left by an earlier call on this stack: the same spec
                raise
        names.append(name)

    def seen() -> bool:  # the API server's APF controller has taken them in (it writes their status)
        return all((json.loads(stack.cp.get(f"{FLOW}/{name}")).get("status") or {}).get("conditions")
                   for name in names)
    try:
        stack.wait_for(seen, 15, "the bench's FlowSchemas taken in", interval=0.2)
    except TimeoutError:
        pass  # counted all the same once the controller catches up; the run before may count nothing
    return names


def remove_flow_schemas(stack: LocalStack, names: list[str]) -> None:
    for name in names:
        try:
            stack.cp.request("DELETE", f"{FLOW}/{name}")
        except urllib.error.HTTPError:
            pass


def bind_requests(stack: LocalStack) -> dict[str, float]:
    """bind's requests so far, by kind (KINDS_OF_REQUEST), from the API server's /metrics."""
    counts = {kind: 0.0 for kind, *_ in KINDS_OF_REQUEST}
    for line in stack.cp.get("/metrics").decode().splitlines():
        if line.startswith(DISPATCHED):
            schema = dict(LABEL.findall(line[:line.rindex("}")])).get("flow_schema", "")
            if schema.startswith(FLOW_PREFIX) and schema[len(FLOW_PREFIX):] in counts:
                counts[schema[len(FLOW_PREFIX):]] += float(line.rsplit(" ", 1)[1])
    return counts


def settled_requests(stack: LocalStack, quiet: float = 2.0, limit: float = 30.0) -> dict[str, float]:
    """bind's request counts once it wrote nothing for `quiet` s but Lease updates (renewals)."""
    counts, deadline = bind_requests(stack), time.perf_counter() + limit
    while time.perf_counter() < deadline:
        time.sleep(quiet)
        again = bind_requests(stack)
        if all(again[kind] == counts[kind] for kind in WRITES if kind != "lease-update"):
            return again
        counts = again
    return counts


def minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {kind: after[kind] - before[kind] for kind in after}


# -- one run ---------------------------------------------------------------------------------------
def deployment(namespace: str, pods: int) -> dict:
    """check/statefulset.yaml's pod template and map (bench.run.statefulset) in a Deployment."""
    sts = bench_run.statefulset(namespace, pods)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": namespace, "labels": sts["metadata"].get("labels", {})},
            "spec": {"replicas": pods, "selector": sts["spec"]["selector"], "template": sts["spec"]["template"]}}


def statefulset(namespace: str, pods: int) -> dict:
    manifest = bench_run.statefulset(namespace, pods)
    manifest["metadata"]["name"] = NAME
    return manifest


def why_not_bound(stack: LocalStack, namespace: str) -> str:
    """What keeps the pods pending: a pending pod's PodScheduled message, else the namespace's last
    Warning Event (a ReplicaSet whose pods the webhook refused: FailedCreate)."""
    for pod in stack.pods(namespace):
        if not pod["spec"].get("nodeName"):
            for condition in (pod.get("status") or {}).get("conditions") or []:
                if condition.get("type") == "PodScheduled" and condition.get("message"):
                    return f"{pod['metadata']['name']}: {condition.get('reason')}: {condition['message']}"[:300]
    warnings = [e for e in stack.api.list_namespaced_event(namespace).items if e.type == "Warning"]
    # a refusal first (FailedScheduling, a controller's FailedCreate), not a warning such as SharedDevices
    warnings = [e for e in warnings if e.reason.startswith("Failed")] or warnings
    if warnings:
        last = max(warnings, key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp or ""))
        return f"{last.involved_object.kind}/{last.involved_object.name}: {last.reason}: {last.message}"[:300]
    return "no pod condition nor Warning Event says why (still being created or placed?)"


def removed(stack: LocalStack, namespace: str) -> None:
    """The workload and its pods gone at once (its controllers first, or they create the pods again)."""
    orphan = client.V1DeleteOptions(propagation_policy="Orphan")
    apps = client.AppsV1Api(stack.api_client)
    apps.delete_collection_namespaced_deployment(namespace, body=orphan)
    apps.delete_collection_namespaced_replica_set(namespace, body=orphan)
    gang.emptied(stack, namespace)  # the StatefulSet, and the pods (grace 0) until none is left


def one_run(stack: LocalStack, records: framework.OneBind, baseline: int, pods: int, kind: str,
            deadline_s: float = DEADLINE_S) -> dict:
    """One workload of `pods` replicas created, until every pod was seen bound or `deadline_s`
    passed; its timings (s), bind's requests by kind and its CPU (s) while placing, and the
    requests after the pods were deleted."""
    namespace = stack.create_namespace(namespace_name())
    pid = stack.cp.processes["bind"].pid
    framework.wait_idle(stack)
    before = settled_requests(stack)
    cpu_before = profile.cpu_seconds(pid)
    watch = bench_run.BoundWatch(stack, namespace)
    figures: dict = {"kind": kind, "pods": pods}
    try:
        started = time.perf_counter()
        apps = client.AppsV1Api(stack.api_client)
        if kind == "Deployment":
            apps.create_namespaced_deployment(namespace, deployment(namespace, pods), _preload_content=False)
        else:
            apps.create_namespaced_stateful_set(namespace, statefulset(namespace, pods), _preload_content=False)
        while len(watch.bound) < pods and time.perf_counter() - started < deadline_s:
            time.sleep(0.01)
        figures["bound"], figures["created"] = len(watch.bound), len(watch.seen)
        if len(watch.bound) < pods:
            figures["not_bound"] = why_not_bound(stack, namespace)
        framework.wait_idle(stack)  # the pods' last updates sent to bind,
        placed = settled_requests(stack)  # and bind quiet again (its Events in the background)
        figures["bind_cpu_s"] = profile.cpu_seconds(pid) - cpu_before
        figures["placed"] = len(watch.bound)  # (past the deadline too) what the requests and CPU were for
    finally:
        watch.stop()
        removed(stack, namespace)
    framework.wait_idle(stack)  # the deletions delivered to bind,
    records.settle(baseline)  # and its records of those pods let go
    figures["requests"] = minus(placed, before)
    figures["requests_after_delete"] = minus(settled_requests(stack), placed)
    if watch.seen:
        first, last = min(watch.seen.values()), max(watch.seen.values())
        figures.update(first_pod_s=first - started, created_s=last - first)
    if "not_bound" not in figures:
        last_bound = max(watch.bound.values())
        figures.update(create_to_bound_s=last_bound - first, from_workload_s=last_bound - started,
                       tail_s=last_bound - last)
    return figures


def pool_speed(stack: LocalStack, pods: int = PODS, reps: int = 4, deadline_s: float = DEADLINE_S) -> dict:
    """The Deployment and the StatefulSet, alternated (order swapped every repetition), `reps` times
    each, after one StatefulSet run not counted; medians, Deployment / StatefulSet, and bind's
    writes per placement for each. A kind whose run left pods unbound (past the deadline) is not
    run again."""
    records = framework.OneBind(stack)  # (its Lease count: bind's device and entry records)
    framework.wait_idle(stack)
    baseline = records.settle()
    schemas = flow_schemas(stack)
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    try:
        warm_up = one_run(stack, records, baseline, pods, "StatefulSet", deadline_s)
        for rep in range(reps):
            for kind in (KINDS if rep % 2 == 0 else KINDS[::-1]):
                if any("not_bound" in r for r in runs[kind]):
                    continue
                runs[kind].append(one_run(stack, records, baseline, pods, kind, deadline_s))
    finally:
        remove_flow_schemas(stack, schemas)
    figures: dict = {"pods": pods, "reps": reps, "deadline_s": deadline_s, "warm_up": warm_up}
    for kind, rs in runs.items():
        figures[kind] = summary(rs)
    d, s = figures["Deployment"], figures["StatefulSet"]
    if "create_to_bound_s" in d and "create_to_bound_s" in s:
        figures["ratio"] = d["create_to_bound_s"] / s["create_to_bound_s"]
        figures["ratio_from_workload"] = d["from_workload_s"] / s["from_workload_s"]
    # Records are deleted by bind's sweep (every 30 s) whichever run's window it falls in: the series'.
    every = [warm_up] + runs["Deployment"] + runs["StatefulSet"]
    figures["leases"] = {what: sum(r[window][kind] for r in every for window in ("requests", "requests_after_delete"))
                         for what, kind in (("created", "lease-create"), ("deleted", "lease-delete"))}
    if d.get("writes_per_placement") is not None and s.get("writes_per_placement") is not None:
        figures["writes_difference"] = d["writes_per_placement"] - s["writes_per_placement"]
    return figures


def summary(rs: list[dict]) -> dict:
    """One kind's runs: medians of the runs all bound; writes per placement over every run."""
    out: dict = {"runs": rs}
    done = [r for r in rs if "not_bound" not in r]
    for key in ("create_to_bound_s", "from_workload_s", "first_pod_s", "created_s", "tail_s"):
        if done:
            out[key] = statistics.median(r[key] for r in done)
    failed = [r for r in rs if "not_bound" in r]
    if failed:
        out["not_bound"] = failed[0]
    placed = sum(r["placed"] for r in rs)
    if placed and any(sum(r["requests"].values()) for r in rs):
        per = {kind: sum(r["requests"][kind] for r in rs) / placed for kind, *_ in KINDS_OF_REQUEST}
        out["requests_per_placement"] = per
        out["writes_per_placement"] = sum(per[kind] for kind in WRITES)
    if placed:
        out["bind_cpu_ms_per_placement"] = 1000 * sum(r["bind_cpu_s"] for r in rs) / placed
    out["placed"] = placed
    return out


# -- the table -------------------------------------------------------------------------------------
def rows(f: dict) -> list[str]:
    """The figures as rows of bench.run's table."""
    d, s, n = f["Deployment"], f["StatefulSet"], f["pods"]

    def seconds(figure: dict, key: str) -> str:
        return f"{figure[key]:.2f}" if key in figure else "-"

    def ms(figure: dict, key: str) -> str:
        return f"{round(figure[key] * 1000)}" if key in figure else "-"

    def each(figure: dict) -> str:
        return ", ".join(f"{r['create_to_bound_s']:.2f}" if "create_to_bound_s" in r
                         else f"not bound ({r['bound']}/{r['pods']})" for r in figure["runs"]) or "-"

    label = f"Deployment / StatefulSet of {n}, pinned, create-to-bound"
    if "ratio" in f:
        value = f"{f['ratio']:.2f} ({d['create_to_bound_s']:.2f}/{s['create_to_bound_s']:.2f}s)"
        verdict = "PASS" if f["ratio"] <= GOAL else "MISS"
    else:
        value, verdict = "not bound", "MISS"
    out = [f"{label:<62} {value:>20} {'<= ' + str(GOAL):>12}  {verdict}"]
    for kind, figure in (("Deployment", d), ("StatefulSet", s)):
        if "not_bound" in figure:
            r = figure["not_bound"]
            out.append(f"  {kind}: NOT BOUND: {r['bound']} of {r['pods']} pods bound, {r['created']} created,"
                       f" in {f['deadline_s']:g} s: {r['not_bound']}")
    if "ratio_from_workload" in f:
        out.append(f"{'  from the workload created to last bound (s), ratio':<62} {f['ratio_from_workload']:.2f}"
                   f" ({d['from_workload_s']:.2f}/{s['from_workload_s']:.2f})")
    out.append(f"{'  workload created -> first pod (ms), Deployment / StatefulSet':<62}"
               f" {ms(d, 'first_pod_s')} / {ms(s, 'first_pod_s')}")
    out.append(f"{'  first created -> last created (ms, the controllers)':<62} {ms(d, 'created_s')} / {ms(s, 'created_s')}")
    out.append(f"{'  last created -> last bound (ms, bind)':<62} {ms(d, 'tail_s')} / {ms(s, 'tail_s')}")
    out.append(f"{'  runs, create-to-bound (s), Deployment; StatefulSet':<62} {each(d)}; {each(s)}")
    label = "bind's API writes per placement, Deployment / StatefulSet"
    if "writes_difference" in f:
        value = f"{d['writes_per_placement']:.2f} / {s['writes_per_placement']:.2f}"
        out.append(f"{label:<62} {value:>20} {'+' + str(int(WRITES_GOAL)) + ' at most':>12}  "
                   f"{'PASS' if f['writes_difference'] <= WRITES_GOAL else 'MISS'}")
    else:
        out.append(f"{label:<62} {'not counted':>20}  (no pod placed, or no request counted)")
    for kind, figure in (("Deployment", d), ("StatefulSet", s)):
        per = figure.get("requests_per_placement")
        if per:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in per.items() if k != "read" and v >= 0.005)
            out.append(f"  {kind}: {parts or 'none'}; reads {per['read']:.2f}")
    if "leases" in f:
        out.append(f"{'  Leases created / deleted in the series (records; the sweep)':<62}"
                   f" {f['leases']['created']:.0f} / {f['leases']['deleted']:.0f}")
    if "bind_cpu_ms_per_placement" in d or "bind_cpu_ms_per_placement" in s:
        def cpu(figure: dict) -> str:
            return f"{figure['bind_cpu_ms_per_placement']:.2f}" if "bind_cpu_ms_per_placement" in figure else "-"
        out.append(f"{'  bind CPU per placement (ms), Deployment / StatefulSet':<62} {cpu(d)} / {cpu(s)}")
        if d.get("bind_cpu_ms_per_placement") and s.get("bind_cpu_ms_per_placement"):
            ratio = d["bind_cpu_ms_per_placement"] / s["bind_cpu_ms_per_placement"]
            out.append(f"{'  bind CPU per placement, Deployment / StatefulSet':<62} {ratio:>20.2f} "
                       f"{'<= ' + str(CPU_GOAL):>12}  {'PASS' if ratio <= CPU_GOAL else 'MISS'}")
    return out
