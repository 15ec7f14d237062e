"""bind at zero behind Knative's front door (issue 60): create-to-bound from zero beside the same
figure warm, measured side by side in one run on the Knative stack (LocalStack(knative=True):
Knative Eventing and Serving, Traefik as the networking layer, the chart with sink.path
knative-route and bind.scale.min 0, window 6 s).

For each case and repetition: wait until bind has no pod at all (terminating ones included), create
the case's pods and time them to bound ("from zero": the add events go through Traefik and the
activator, which holds them while a bind pod starts, lists and becomes ready); then, with that bind
still up, the same case again in a new namespace ("warm"). Cases:
- one pinned pod (its creation to its Binding);
- the seed: the 5-replica StatefulSet on the four real nodes (OrderedReady: each replica created
  once the one before it runs), from its creation to its last replica bound;
- 100 pinned pods (a Parallel StatefulSet) at 100 nodes and 2,000 pods (nodes without kubelets,
  kept Ready by their Leases; pods bound at creation), its creation to its last replica bound: a
  wake lists those 2,000 pods before it is ready.
Bound is seen by a poll of the namespace's pods every 50 ms from this process.

Goals (issue 60): the first pod bound within 2 s of its creation from zero; 100 pods within 1.2x
the warm figure.

    python -m bench.frontdoor [--smoke]     (make bench runs it with the rest)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench import figure_line, namespace_name, scale
from kubeapi.client import Kube
from kubeapi.kubeconfig import from_kubeconfig
from localcp import kn as kn_cli, knative, traefik
from localcp.incluster import NAMESPACE
from localcp.stack import LocalStack
from tests.test_end_to_end import statefulset

WINDOW = "6s"  # Knative's least: the bench waits for zero once per case and repetition
VALUES = ("--set", "bind.scale.min=0", "--set", f"bind.scale.window={WINDOW}",
          # No ping at a moment the bench did not choose (the default at min 0: every 5 minutes).
          "--set", "resync.schedule=0 0 1 1 *")
FIRST_POD_GOAL_S = 2.0
HUNDRED_GOAL_RATIO = 1.2
POLL_S = 0.05


def bind_pods(stack: LocalStack) -> list[dict]:
    return stack.pods(NAMESPACE, "serving.knative.dev/service=bind")


def wait_at_zero(stack: LocalStack) -> float:
    began = time.monotonic()
    stack.wait_for(lambda: not bind_pods(stack), 600, "bind at zero", interval=0.5)
    return time.monotonic() - began


def timed(stack: LocalStack, manifest: dict, count: int, timeout: float = 300) -> dict:
    """Apply `manifest` (a StatefulSet) in a namespace of its own; the seconds from the apply to its
    first and its last pod bound."""
    namespace = manifest["metadata"]["namespace"]
    stack.create_namespace(namespace)
    began = time.monotonic()
    stack.apply(manifest)
    first = None
    deadline = began + timeout
    while time.monotonic() < deadline:
        pods = stack.pods(namespace)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        if bound and first is None:
            first = time.monotonic() - began
        if len(bound) >= count:
            return {"first_s": first, "all_s": time.monotonic() - began}
        time.sleep(POLL_S)
    raise TimeoutError(f"{count} pods of {namespace} not all bound after {timeout:g}s; {why_unbound(stack, namespace)}")


def why_unbound(stack: LocalStack, namespace: str) -> str:
    """The reasons of the Events in the namespace, counted, and bind's pods: why a run failed."""
    events = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events"))["items"]
    reasons: dict[str, int] = {}
    for event in events:
        key = f"{event['reason']}: {event.get('message', '')[:200]}"
        reasons[key] = reasons.get(key, 0) + (event.get("count") or 1)
    pods = [f"{p['metadata']['name']} {p['status'].get('phase')}" for p in bind_pods(stack)]
    return f"events {json.dumps(reasons)[:3000]}; bind pods {pods}"


def cases(nodes: list[str]) -> dict[str, tuple]:
    def one(namespace: str) -> dict:
        return statefulset(namespace, "0=node2:3\n", replicas=1, name="one")

    def seed(namespace: str) -> dict:
        return statefulset(namespace)

    def hundred(namespace: str) -> dict:
        manifest = statefulset(namespace, "".join(f"{i}={node}:7\n" for i, node in enumerate(nodes)),
                               replicas=len(nodes), name="hundred")
        manifest["spec"]["podManagementPolicy"] = "Parallel"
        manifest["spec"]["template"]["spec"]["tolerations"] = [scale.NO_KUBELET_TOLERATION]
        return manifest
    return {"one pod": (one, 1), "the seed (5 replicas, real nodes)": (seed, 5),
            f"{len(nodes)} pods at {len(nodes)} nodes, 2,000 pods": (hundred, len(nodes))}


def release(stack: LocalStack, namespace: str) -> None:
    stack.cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False)


def run(smoke: bool, only: str = "") -> dict:
    """only: just the cases whose name starts with it."""
    reps = 1 if smoke else 3
    node_count, bulk = (20, 200) if smoke else (100, 2000)
    results: dict = {"reps": reps, "window": WINDOW, "nodes": node_count, "bulk_pods": bulk, "cases": {}}
    with LocalStack(knative=True, knative_values=VALUES) as stack:
        api = Kube(from_kubeconfig(str(stack.cp.kubeconfig)))
        names = [f"door-{i:03d}" for i in range(node_count)]
        leases = scale.add_nodes(stack, api, names, taint=scale.NO_KUBELET_TAINT)
        try:
            filler = stack.create_namespace(namespace_name())
            bulk_pods(api, filler, bulk, names)
            for case, (make, count) in cases(names).items():
                if (smoke and count > 1) or not case.startswith(only):
                    continue
                zero, warm, woke = [], [], []
                for _ in range(reps):
                    woke.append(wait_at_zero(stack))
                    namespace = namespace_name()
                    zero.append(timed(stack, make(namespace), count))
                    if not [p for p in bind_pods(stack) if not p["metadata"].get("deletionTimestamp")]:
                        raise RuntimeError("bind went back to zero before the warm run")
                    release(stack, namespace)
                    namespace = namespace_name()
                    warm.append(timed(stack, make(namespace), count))
                    release(stack, namespace)
                results["cases"][case] = {
                    "count": count,
                    "zero_first_s": statistics.median(r["first_s"] for r in zero),
                    "zero_all_s": statistics.median(r["all_s"] for r in zero),
                    "warm_first_s": statistics.median(r["first_s"] for r in warm),
                    "warm_all_s": statistics.median(r["all_s"] for r in warm),
                    "runs": {"zero": zero, "warm": warm}, "to_zero_s": woke}
                print(f"bench: frontdoor {case}: {results['cases'][case]}", flush=True)
        finally:
            leases.stop()
        results["versions"] = {"traefik": traefik.version(), "knative": [p.version for p in knative.projects()],
                               "kn": kn_cli.binary().parent.parent.name}
    return results


def bulk_pods(api: Kube, namespace: str, count: int, nodes: list[str]) -> None:
    """`count` pods bound at creation to `nodes` (bench/scale.py's bulk pods: some hold GPUs 0-3
    with their device annotation), which a waking bind lists before it is ready."""
    from bench import run as bench_run

    path = f"/api/v1/namespaces/{namespace}/pods"
    bench_run.parallel(lambda i: api._call("POST", path, scale.bulk_pod(i, nodes)), range(count), 8)


def rows(result: dict) -> list[str]:
    out = [f"bind at zero behind Traefik and the activator (issue 60; window {result['window']}, medians of"
           f" {result['reps']}; create to bound):"]
    for case, c in result["cases"].items():
        if c["count"] == 1:
            out.append(figure_line(f"  {case}: from zero, s", f"{c['zero_all_s']:.2f}", f"<= {FIRST_POD_GOAL_S:g}",
                                   c["zero_all_s"] <= FIRST_POD_GOAL_S))
            out.append(figure_line(f"  {case}: warm, s", f"{c['warm_all_s']:.2f}"))
        else:
            ratio = c["zero_all_s"] / c["warm_all_s"]
            hundred = c["count"] >= 20
            out.append(figure_line(f"  {case}: all bound from zero / warm",
                                   f"{ratio:.2f} ({c['zero_all_s']:.2f}/{c['warm_all_s']:.2f} s)",
                                   f"<= {HUNDRED_GOAL_RATIO:g}" if hundred else "(report)",
                                   ratio <= HUNDRED_GOAL_RATIO if hundred else None))
            out.append(figure_line(f"  {case}: first bound from zero, s", f"{c['zero_first_s']:.2f}",
                                   f"<= {FIRST_POD_GOAL_S:g}", c["zero_first_s"] <= FIRST_POD_GOAL_S))
        out.append(figure_line("    bind at zero after the previous run, s",
                               "/".join(f"{s:.0f}" for s in c["to_zero_s"])))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", default="", help="just the cases whose name starts with this: one, the seed, 100")
    args = parser.parse_args()
    result = run(args.smoke, args.only)
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}))
    print("\n".join(rows(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
