"""bind now / before the framework: create-to-bound and CPU per placement of bind from this
working tree and of bind at BEFORE (main before bind became a kube-scheduler-like framework of
plugins and phases), side by side on one stack, for the issue's "no slower".

Both binds watch pods themselves, so two running at once would race for the same pods: here only
one bind runs at any time. The stack's own bind is stopped first (and started again at the end);
for each run a fresh bind is started (this tree's, or the revision's from `git archive`), the
stack's event source is pointed at it, the run's pods are created one after another through the
webhook exactly as bench.run.create_to_bound does for its bind figure, and the bind is stopped
once the pods are gone and it has let go of their records. The two alternate, their order
swapped every repetition; medians.

    python -m bench.quick --only framework [--pods 300 --reps 4] [--before REV]
    BENCH_BEFORE=REV make bench            # another revision as "before"

The same for a gang (gang_cost): a StatefulSet of N replicas annotated `gpu-scheduler/gang: "true"`,
created as bench.gang.one_run creates it, placed by one bind at a time from this tree or from the
revision; create-to-bound (first pod seen created to last seen bound) and bind's CPU per placed
pod. Issue 36's "unchanged, gangs included" is both figures against BEFORE_ISSUE_36:

    python -m bench.quick --only framework36 [--pods 300 --replicas 100 --reps 4]
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench import gang, profile, run as bench_run, scale  # modules: bench.run and bench.gang import this one
from localcp.cluster import REPO, free_port
from localcp.stack import BIND_ACCOUNT, LocalStack

# main's HEAD before the framework work began (bind's own placer, informers and queue)
BEFORE = os.environ.get("BENCH_BEFORE") or "116f88f"
# main's HEAD before preemption (a PostFilter phase that runs on refusals only): bind now against it
# shows what placing pods that need no preemption costs now.
BEFORE_PREEMPTION = "d61a96d"
# main before the framework was finished (issue 36: a registry and profiles as data, one cycle for a
# pod and a gang, PreEnqueue, serving/): its "done when" is bind's create-to-bound and CPU per
# placement unchanged against it, for pods and for gangs.
BEFORE_ISSUE_36 = "afc0447"
WHICH = ("now", "before")


def extract(revision: str, into: Path) -> Path | None:
    """bind's code at `revision` (functions/, gpu_scheduler/, kubeapi/, serving/ if it has one: what start_bind_at takes)
    under `into`; None when this clone does not hold the revision (a shallow clone)."""
    # serving/: the functions' HTTP pieces, in gpu_scheduler/ at a revision without it.
    has_serving = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{revision}:serving"],
                                 capture_output=True).returncode == 0
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "functions", "gpu_scheduler", "kubeapi",
                              *(["serving"] if has_serving else [])], capture_output=True)
    if archive.returncode != 0:
        return None
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


class OneBind:
    """One bind at a time beside the stack: started, fed by the stack's event source, stopped."""

    def __init__(self, stack: LocalStack):
        self.stack = stack
        self.api = scale.admin_api(stack)
        self.count = 0

    def leases(self) -> int:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{BIND_ACCOUNT[0]}/leases"
        return len(self.api._call("GET", path)["items"])

    def settle(self, baseline: int | None = None, steady: float = 2.0, limit: float = 30.0) -> int:
        """Wait until bind's records (Leases in its namespace) are back to `baseline`, or their
        number stayed the same for `steady` seconds (records kept for reuse): the next bind
        then does not start from records of pods that are gone. The number left."""
        seen, since, deadline = self.leases(), time.monotonic(), time.monotonic() + limit
        while ((baseline is None or seen > baseline) and time.monotonic() - since < steady
               and time.monotonic() < deadline):
            time.sleep(0.2)
            now = self.leases()
            if now != seen:
                seen, since = now, time.monotonic()
        return seen

    def start(self, tree: Path) -> tuple[str, str, int]:
        """bind from `tree`, ready, as the stack's admin (the same credentials for both trees: the
        RBAC this tree applies is the current bind's, which an older one may not fit); the event
        source's sink set to it. (process name, URL, pid)."""
        self.count += 1
        name = f"bind-framework-{self.count}"
        url = self.stack.start_bind(name, free_port(), tree, self.stack.cp.kubeconfig)
        self.stack.source.sender.sink = url
        return name, url, self.stack.cp.processes[name].pid

    def stop(self, name: str) -> None:
        process = self.stack.cp.processes.pop(name)
        os.killpg(process.pid, signal.SIGTERM)  # functions-framework's master and its worker
        process.wait(10)


def wait_idle(stack: LocalStack, steady: float = 1.0, limit: float = 30.0) -> None:
    """Until the event source has sent everything it saw and saw nothing new for `steady` s."""
    since, deadline = time.monotonic(), time.monotonic() + limit
    sent = len(stack.source.sent)
    while time.monotonic() - since < steady and time.monotonic() < deadline:
        time.sleep(0.1)
        if not stack.source.idle() or len(stack.source.sent) != sent:
            sent, since = len(stack.source.sent), time.monotonic()


def measured(stack: LocalStack, binds: OneBind, tree: Path, pods: int, baseline: int,
             workload: Callable[[Callable[[], None]], dict]) -> dict:
    """`workload(after_bound)` placed by a fresh bind from `tree`, once it is ready and quiet; its
    figures, with bind's CPU per placed pod: what bind's processes (master and worker) used from
    before the workload began until all `pods` were seen bound, the event source had sent their
    last updates and bind was quiet again (it writes its Events in the background), before the pods
    are deleted. Then the deletions are delivered to this bind, not to the next, and its records
    let go."""
    name, _, pid = binds.start(tree)
    try:
        def cpu() -> dict[str, float]:
            return {"bind": profile.cpu_seconds(pid)}
        scale.quiet(cpu, 10)  # done starting (its first lists of pods, nodes and records)
        before = profile.cpu_seconds(pid)
        used: dict[str, float] = {}

        def settled() -> None:
            wait_idle(stack)
            scale.quiet(cpu, 10)
            used["cpu_s"] = profile.cpu_seconds(pid) - before
        figures = workload(settled)
        figures["bind_cpu_ms_per_pod"] = 1000 * used["cpu_s"] / pods
        wait_idle(stack)
        binds.settle(baseline)
    finally:
        binds.stop(name)
    return figures


def one_run(stack: LocalStack, binds: OneBind, tree: Path, n: int, baseline: int) -> dict:
    """create_to_bound of `n` pods, created one after another, through a fresh bind from `tree`."""
    return measured(stack, binds, tree, n, baseline,
                    lambda settled: bench_run.create_to_bound(stack, n, "bind", cpu=True, after_bound=settled))


def side_by_side(stack: LocalStack, before: str, reps: int, one) -> dict[str, list[dict]] | None:
    """one(binds, tree, baseline) for this tree and for `before`, after one run not counted,
    alternated (order swapped every repetition), `reps` times each; their figures by WHICH, or None when this clone does not hold
    the revision. The stack's bind is stopped meanwhile and started again at the end."""
    with tempfile.TemporaryDirectory(prefix="bind-before-") as into:
        old = extract(before, Path(into) / before)
        if old is None:
            return None
        trees = {"now": REPO, "before": old}
        binds = OneBind(stack)
        assert stack.source, "the stack's event source feeds the binds measured"
        wait_idle(stack)
        baseline = binds.settle()  # the stack's bind let go of the records of earlier figures
        binds.stop("bind")
        runs: dict[str, list[dict]] = {which: [] for which in WHICH}
        try:
            # One run not counted first: the stack's first workload after a while is slower for
            # reasons of its own (the StatefulSet controller's, the webhook's first calls), and
            # the first counted run would otherwise always be "now"'s.
            one(binds, trees["before"], baseline)
            for rep in range(reps):
                for which in (WHICH if rep % 2 == 0 else WHICH[::-1]):
                    runs[which].append(one(binds, trees[which], baseline))
        finally:
            stack.source.sender.sink = stack.bind_url  # the stack as it was: its own bind
            stack.start_bind("bind", stack.bind_port)
    return runs


def framework_cost(stack: LocalStack, n: int, reps: int, before: str = BEFORE) -> dict:
    """Create-to-bound (pods/s) and bind's CPU per placement, bind from this tree and bind at
    `before`, each run on its own n pods, alternated (order swapped every repetition); medians.
    The stack's bind is stopped meanwhile and started again at the end."""
    runs = side_by_side(stack, before, reps, lambda binds, tree, baseline: one_run(stack, binds, tree, n, baseline))
    if runs is None:
        return {"skipped": f"revision {before} is not in this clone", "revision": before}
    figures: dict = {"revision": before, "pods": n, "reps": reps}
    for which, rs in runs.items():
        figures[which] = {"bound_per_s": statistics.median(r["bound_per_s"] for r in rs),
                          "create_per_s": statistics.median(r["create_per_s"] for r in rs),
                          "tail_s": statistics.median(r["tail_s"] for r in rs),
                          "bind_cpu_ms_per_pod": statistics.median(r["bind_cpu_ms_per_pod"] for r in rs),
                          "runs": rs}
    figures["ratio"] = figures["now"]["bound_per_s"] / figures["before"]["bound_per_s"]
    cpu_before = figures["before"]["bind_cpu_ms_per_pod"]  # (counted in ticks of 10 ms)
    figures["cpu_ratio"] = figures["now"]["bind_cpu_ms_per_pod"] / cpu_before if cpu_before else None
    return figures


def gang_run(stack: LocalStack, binds: OneBind, tree: Path, replicas: int, baseline: int) -> dict:
    """bench.gang.one_run's gang (a StatefulSet of `replicas`, gpu-scheduler/gang: "true") placed by
    a fresh bind from `tree`: its timings, create-to-bound as pods/s, and bind's CPU per placed pod
    (`measured`)."""
    def placed(settled: Callable[[], None]) -> dict:
        figures = gang.one_run(stack, replicas, True, after_bound=settled)
        figures["bound_per_s"] = replicas / figures["create_to_bound_s"]
        return figures
    return measured(stack, binds, tree, replicas, baseline, placed)


def gang_cost(stack: LocalStack, replicas: int, reps: int, before: str = BEFORE_ISSUE_36) -> dict:
    """framework_cost for a gang: create-to-bound of a gang of `replicas` (as pods/s, and its
    seconds) and bind's CPU per placed pod, bind from this tree and bind at `before`, alternated
    (order swapped every repetition); medians, and now / before of both."""
    runs = side_by_side(stack, before, reps,
                        lambda binds, tree, baseline: gang_run(stack, binds, tree, replicas, baseline))
    if runs is None:
        return {"skipped": f"revision {before} is not in this clone", "revision": before, "replicas": replicas}
    figures: dict = {"revision": before, "replicas": replicas, "reps": reps}
    for which, rs in runs.items():
        figures[which] = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        figures[which]["runs"] = rs
    figures["ratio"] = figures["now"]["bound_per_s"] / figures["before"]["bound_per_s"]
    cpu_before = figures["before"]["bind_cpu_ms_per_pod"]
    figures["cpu_ratio"] = figures["now"]["bind_cpu_ms_per_pod"] / cpu_before if cpu_before else None
    return figures


GOAL = ">= 1.0 (no slower)"


def per_s(figure: dict) -> str:
    return ", ".join(f"{r['bound_per_s']:.0f}" for r in figure["runs"])


def cpu_row(f: dict, cpu_goal: float | None) -> str:
    """bind's CPU per placement, now / before: next to `cpu_goal` (a most for now / before), or
    reported."""
    now, before = f["now"]["bind_cpu_ms_per_pod"], f["before"]["bind_cpu_ms_per_pod"]
    ratio = "n/a" if f["cpu_ratio"] is None else format(f["cpu_ratio"], ".2f")
    if cpu_goal is None:
        return f"{'  bind CPU ms per placement, now / before (ratio)':<62} {now:.2f} / {before:.2f} ({ratio})   (report)"
    met = f["cpu_ratio"] is not None and f["cpu_ratio"] <= cpu_goal
    return (f"{'  bind CPU ms per placement, now / before':<62} {f'{ratio} ({now:.2f}/{before:.2f})':>20}"
            f" {'<= ' + format(cpu_goal, '.2f'):>12}  {'PASS' if met else 'MISS'}")


def cpu_runs(f: dict) -> str:
    return "; ".join(", ".join(f"{r['bind_cpu_ms_per_pod']:.2f}" for r in f[which]["runs"]) for which in WHICH)


def rows(f: dict, before_what: str = "the framework", cpu_goal: float | None = None) -> list[str]:
    """The figure as rows of bench.run's table (bind's CPU next to `cpu_goal`, else reported)."""
    label = f"bind now / before {before_what} ({f['revision']})"
    if "skipped" in f:
        return [f"{label:<62} {'skipped':>20}  {f['skipped']}"]
    now, before = f["now"], f["before"]
    ok = f["ratio"] >= 1.0
    value = f"{f['ratio']:.2f} ({now['bound_per_s']:.0f}/{before['bound_per_s']:.0f}/s)"
    return [
        f"{label + ', create-to-bound':<62} {value:>20} {GOAL:>12}  {'PASS' if ok else 'MISS'}",
        f"{'  runs of ' + str(f['pods']) + ' pods, pods/s, now; before':<62} {per_s(now)}; {per_s(before)}",
        f"{'  pod creation rate in the same runs, now / before':<62} "
        f"{now['create_per_s']:.0f}/s / {before['create_per_s']:.0f}/s",
        f"{'  last pod bound after the last created (ms), now / before':<62} "
        f"{round(now['tail_s'] * 1000)} / {round(before['tail_s'] * 1000)}",
        cpu_row(f, cpu_goal),
    ] + ([f"{'  runs, bind CPU ms per placement, now; before':<62} {cpu_runs(f)}"] if cpu_goal is not None else [])


def gang_rows(f: dict, before_what: str = "issue 36", cpu_goal: float | None = 1.05) -> list[str]:
    """gang_cost's figure as rows of bench.run's table."""
    label = f"gang of {f['replicas']}, bind now / before {before_what} ({f['revision']})"
    if "skipped" in f:
        return [f"{label:<62} {'skipped':>20}  {f['skipped']}"]
    now, before = f["now"], f["before"]
    value = f"{f['ratio']:.2f} ({now['bound_per_s']:.0f}/{before['bound_per_s']:.0f}/s)"

    def seconds(figure: dict) -> str:
        return ", ".join(f"{r['create_to_bound_s']:.2f}" for r in figure["runs"])
    return [
        f"{label:<62} {value:>20} {GOAL:>12}  {'PASS' if f['ratio'] >= 1.0 else 'MISS'}",
        f"{'  create-to-bound (s), now / before; runs now; before':<62} {now['create_to_bound_s']:.2f} / "
        f"{before['create_to_bound_s']:.2f}; {seconds(now)}; {seconds(before)}",
        f"{'  first created -> last created (ms), now / before':<62} "
        f"{round(now['created_s'] * 1000)} / {round(before['created_s'] * 1000)}",
        f"{'  last member created -> last bound (ms), now / before':<62} "
        f"{round(now['tail_s'] * 1000)} / {round(before['tail_s'] * 1000)}",
        f"{'  runs, pods/s, now; before':<62} {per_s(now)}; {per_s(before)}",
        cpu_row(f, cpu_goal),
        f"{'  runs, bind CPU ms per placement, now; before':<62} {cpu_runs(f)}",
    ]
