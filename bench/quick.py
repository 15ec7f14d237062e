"""The figures of issue 11 only, smaller than `make bench`, for measuring one step against the
last: python -m bench.quick [--pods 300] [--reps 2] [--only peers,throughput,admission,cold,fit,dra,framework,gang,preemption,quota,framework36,issue39,workloads,kueue,pool]
[--before REV] (framework: bind now / before the framework, against REV, default bench.framework.BEFORE;
preemption: bind now / before preemption, bench.framework.BEFORE_PREEMPTION)
[--replicas 100] (gang: a gang of that many against the same StatefulSet without the annotation;
workloads: a JobSet of that many pods, 4 child Jobs, against a StatefulSet of as many, gang and not;
framework36: bind now / before issue 36, bench.framework.BEFORE_ISSUE_36, for --pods pods created one
by one and for a gang of --replicas; kueue: admission of --pods pods and Jobs, and create-to-bound of an
Indexed Job of --replicas pods, in a namespace the real Kueue manages against a plain one;
pool: a pinned Deployment of --replicas replicas against a pinned StatefulSet of as many,
create-to-bound and bind's API writes per placement, issue 44)
Each figure is a ratio measured side by side in this one run (see bench/run.py)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from localcp.stack import LocalStack

from . import framework, gang, kueue, pool, quota, run, scale, workloads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--only", default="throughput,admission,cold,peers")
    parser.add_argument("--out", default="")
    parser.add_argument("--before", default=framework.BEFORE, help="the revision 'framework' compares with")
    parser.add_argument("--replicas", type=int, default=gang.REPLICAS, help="the StatefulSet's replicas for 'gang'")
    args = parser.parse_args()
    only = set(args.only.split(","))
    results: dict = {"when": time.strftime("%H:%M:%S"), "pods": args.pods, "reps": args.reps}
    if only & {"throughput", "admission", "cold", "fit"}:
        with LocalStack(webhook=False, event_source=False) as stack:
            if "fit" in only:
                results["fit_cost"] = run.fit_cost(stack, args.pods, args.reps)
            if "throughput" in only:
                results["bind_throughput"] = {str(c): f for c, f in run.bind_throughput(stack, args.pods, args.reps).items()}
                results["peak_rss_mb"] = {"bind": run.peak_rss_mb(stack.cp.processes["bind"].pid)}
            if "admission" in only:
                results["admission"] = run.admission_overhead(stack, args.pods, args.reps)
                results.setdefault("peak_rss_mb", {})["mutate"] = run.peak_rss_mb(stack.cp.processes["mutate"].pid)
            if "cold" in only:
                results["cold_start_s"] = {t: run.cold_start(t, str(stack.bind_kubeconfig), 3) for t in ("mutate", "bind")}
    if only & {"peers", "dra", "framework", "gang", "preemption", "quota", "framework36", "issue39", "workloads",
                "kueue", "pool"}:
        with LocalStack(workloads=(("jobset",) if "workloads" in only else ()) + (("kueue",) if "kueue" in only else ())
                        ) as stack:
            if "peers" in only:
                results["placement_peers"] = run.placement_peers(stack, args.pods, args.reps)
            if "dra" in only:  # not in the default: bench.run has it
                results["dra_peers"] = run.dra_peers(stack, args.pods, args.reps)
            if "framework" in only:  # not in the default: bench.run has it
                results["framework_cost"] = framework.framework_cost(stack, args.pods, args.reps, args.before)
            if "gang" in only:  # not in the default: bench.run has it
                results["gang"] = gang.gang_speed(stack, args.replicas, args.reps)
            if "preemption" in only:  # not in the default: bench.run has it
                results["preemption_cost"] = framework.framework_cost(stack, args.pods, args.reps,
                                                                      framework.BEFORE_PREEMPTION)
            if "quota" in only:  # not in the default: bench.run has it
                results["quota"] = quota.quota_cost(stack, args.pods, args.reps)
            if "framework36" in only:  # not in the default: bench.run has it
                results["issue36_pods"] = framework.framework_cost(stack, args.pods, args.reps,
                                                                   framework.BEFORE_ISSUE_36)
                results["issue36_gang"] = framework.gang_cost(stack, args.replicas, args.reps,
                                                              framework.BEFORE_ISSUE_36)
            if "workloads" in only:  # not in the default: bench.run has it
                results["workloads"] = workloads.workload_speed(stack, args.replicas, args.reps)
            if "kueue" in only:  # not in the default: bench.run has it
                results["kueue"] = kueue.kueue_cost(stack, args.replicas, args.reps, n=args.pods)
            if "pool" in only:  # not in the default: bench.run has it
                results["pool"] = pool.pool_speed(stack, args.replicas, args.reps)
            if "issue39" in only:  # not in the default: bench.run has it
                results["issue39_pods"] = framework.framework_cost(stack, args.pods, args.reps, scale.BEFORE_ISSUE_39)
    for key, value in results.items():
        if key == "bind_throughput":
            for c, f in value.items():
                print(f"bind/direct c={c}: {f['ratio']:.2f} ({f['bind_pods_per_s']:.0f}/{f['direct_pods_per_s']:.0f}/s)"
                      f" runs bind {[round(x) for x in f['runs_bind']]} direct {[round(x) for x in f['runs_direct']]}")
        elif key == "fit_cost":
            for c in ("1", "8"):
                if c in value:
                    f = value[c]
                    print(f"bind now/before fit ({value['revision']}) c={c}: {f['ratio']:.2f} "
                          f"({f['now_pods_per_s']:.0f}/{f['before_pods_per_s']:.0f}/s) runs "
                          f"{[round(x) for x in f['runs']['now']]} {[round(x) for x in f['runs']['before']]}")
            if "skipped" in value:
                print(f"fit cost: {value['skipped']}")
        elif key == "admission":
            print(f"admission median ratio {value['median_ratio']:.2f} ({value['without_ms']['p50']:.1f} -> "
                  f"{value['with_ms']['p50']:.1f} ms), p99 ratio {value['p99_ratio']:.2f}; over the null webhook "
                  f"{value['over_null_ratio']:.2f} ({value['null_ms']['p50']:.1f} ms), over it answering with mutate's "
                  f"patch {value['over_null_patch_ratio']:.2f} ({value['null_patch_ms']['p50']:.1f} ms)")
        elif key == "placement_peers":
            print(f"create-to-bound bind/kube-scheduler {value['ratio']:.2f} ({value['bind']['bound_per_s']:.1f}/"
                  f"{value['kube-scheduler']['bound_per_s']:.1f}/s; creation {value['bind']['create_per_s']:.1f}/"
                  f"{value['kube-scheduler']['create_per_s']:.1f}/s) runs {json.dumps(value['bind']['runs'])} "
                  f"{json.dumps(value['kube-scheduler']['runs'])}")
        elif key == "dra_peers":
            print("\n".join(run.dra_rows(value)))
            print("runs " + json.dumps({m: [round(r["bound_per_s"], 1) for r in value[m]["runs"]] for m in run.DRA_MODES})
                  + f" claims allocated {[r['claims_allocated'] for m in run.DRA_MODES[1:] for r in value[m]['runs']]}")
        elif key == "framework_cost":
            print("\n".join(framework.rows(value)))
        elif key == "preemption_cost":
            print("\n".join(framework.rows(value, "preemption")))
        elif key == "issue36_pods":
            print("\n".join(framework.rows(value, "issue 36", cpu_goal=run.ISSUE_36_CPU)))
        elif key == "issue39_pods":
            print("\n".join(framework.rows(value, "issue 39")))
        elif key == "issue36_gang":
            print("\n".join(framework.gang_rows(value, "issue 36", cpu_goal=run.ISSUE_36_CPU)))
        elif key == "workloads":
            print("\n".join(workloads.rows(value)))
        elif key == "gang":
            print("\n".join(gang.rows(value)))
        elif key == "pool":
            print("\n".join(pool.rows(value)))
        elif key == "kueue":
            print("\n".join(kueue.rows(value)))
        elif key == "quota":
            print("\n".join(quota.rows(value)))
        elif key == "cold_start_s":
            print("cold start " + ", ".join(f"{t} {statistics.median(v):.2f} s" for t, v in value.items()))
        else:
            print(f"{key}: {value}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
