"""`kubectl gpu-scheduler gpus -o json` at scale (issue 45: on 1000 nodes and 20000 pods it answers
within 2 s). A figure printed next to its goal, never asserted.

On the local control plane, with bind stopped (nothing places the pending pods):
- nodes without kubelets (scale.node_names, 8 GPUs each; kept Ready by renewing their Leases in
  kube-node-lease, as kubelets do), the pods bound at creation as bench.scale makes them
  (scale.bulk_pod: 20 per node at 1000 nodes and 20000 pods, the first four on each node
  gpu-scheduler's, holding GPUs 0-3 with the `gpu-scheduler/devices` annotation bind's Binding
  writes), spread over
  NAMESPACES namespaces, and bind's device record (a Lease in its namespace) for every GPU held;
- `pending` pods of gpu-scheduler (not bound; their map entries name a GPU each: every other one a
  GPU held (explain: it waits), the rest a free one, 6 or 7 (explain: bind)), spread over the
  namespaces of the bound pods, and a gang of GANG pods (bare pods of one map, `gpu-scheduler/gang:
  "true"`) in the largest of them, whose verdict reads its namespace's pods.
Run after bench.scale's scale part on the same stack (`make bench SCALE=1`), it reuses what that
left (its nodes and its pods; `pods` counts them) and adds only what is missing.

Then, alternated, `reps` times each: the wall time of the installed command
(`.venv/bin/kubectl-gpu_scheduler gpus -o json`, the stack's admin kubeconfig, output to /dev/null),
and the floor the issue names, reading alone: `kubectl get pods -A -o json > /dev/null` plus
`kubectl get nodes -o json > /dev/null` (at 20000 pods kubectl's printing is slower than the
command's reading: the split below shows the reading itself). Medians. Also the command's start
alone (`--version`: the interpreter and its imports), and the command run in this process
(cli.main), once per repetition, split into reading (nodes, pods, records, slices:
gpus.Reads.read), the snapshots, the pending pods' verdicts (explain's framework, with the reads
they make), the view and the JSON; the API calls it made, by kind (the nodes' heartbeat, in this
process too, is held off during these runs). One more run in this process under cProfile: the
top entries by cumulative and by own time into bench/profiles/gpus-<nodes>x<pods>.txt.

`python -m bench.gpus [--nodes 1000] [--pods 20000] [--pending 300] [--reps 5]` (`--smoke`: 20
nodes, 400 pods) runs it alone on a stack of its own; `python -m bench.scale --scale --only
scale,gpus` after the scale figures, as `make bench SCALE=1` does."""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from bench import run as bench_run, scale  # modules, not names: bench.scale imports this one
from bench import figure_line
from gpu_scheduler.fit import DEVICES_ANNOTATION, held_devices, workload
from gpu_scheduler.records import RECORD_SELECTOR, lease_for, record_name, workload_key
from kubeapi.client import MERGE_PATCH, Kube
from kubeapi.errors import APIError
from kubeapi.projection import PODS
from localcp.cluster import BIN, REPO
from localcp.stack import BIND_ACCOUNT, LocalStack

GOAL_S = 2.0
COMMAND = REPO / ".venv" / "bin" / "kubectl-gpu_scheduler"
KUBECTL = BIN / "kubectl"
PROFILES = Path(__file__).resolve().parent / "profiles"
NAMESPACES = 10  # the bound pods' namespaces, when this creates them
GANG = 8  # pending members of one gang (their verdict reads their namespace's pods)
FREE_DEVICES = ("6", "7")  # no bulk pod and no bench.scale placement holds these
HELD_DEVICES = ("0", "1", "2", "3")  # scale.bulk_pod's holders
RECORDS_NAMESPACE = BIND_ACCOUNT[0]
# (nodes, pods, pending pods, repetitions)
SIZES = {"smoke": (20, 400, 20, 2), "default": (100, 2000, 100, 3), "scale": (1000, 20000, 300, 5)}


class Heartbeat:
    """Keeps the nodes Ready as scale.NodeLeases does, starting from Leases that may exist already
    (bench.scale's, left when its part ended)."""

    def __init__(self, api: Kube, nodes: list[str]):
        self.api, self.nodes = api, nodes
        self._stop = threading.Event()
        self._lock = threading.Lock()  # held by a round of renewals, or by held()
        self.renew()
        self._thread = threading.Thread(target=self._run, name="gpus-node-leases", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{scale.NODE_LEASES}/leases"

        def one(node: str) -> None:
            try:
                self.api._call("PATCH", f"{path}/{node}", {"spec": {"renewTime": scale.micro_now()}}, MERGE_PATCH)
            except APIError as error:
                if not error.not_found:
                    raise
                self.api._call("POST", path, {"metadata": {"name": node}, "spec": {
                    "holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": scale.micro_now()}})
        bench_run.parallel(one, self.nodes, scale.CREATORS)

    def _run(self) -> None:
        while not self._stop.wait(scale.LEASE_RENEW_SECONDS):
            try:
                with self._lock:
                    self.renew()
            except Exception as error:  # the next round tries again
                print(f"bench: node lease renewal failed: {error}", flush=True)

    @contextmanager
    def held(self):
        """Renewed now, then no renewal until the block ends (a run measured in this process, where a
        round of 1000 renewals would take its CPU): the nodes stay Ready for the Leases' 40 s."""
        with self._lock:
            self.renew()
            yield

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _all_pods(api: Kube) -> list[dict]:
    return [pod for page, _ in api.list_all_pods(projection=PODS) for pod in page]


def populate(stack: LocalStack, api: Kube, nodes_n: int, pods_n: int, pending_n: int) -> tuple[Heartbeat, dict]:
    """The cluster described in the module's docstring, from what exists: nodes, bound pods,
    records, pending pods; what it holds in the end."""
    names = scale.node_names(nodes_n)
    existing = {(n.get("metadata") or {}).get("name") for page, _ in api.list_nodes() for n in page}
    missing = [name for name in names if name not in existing]
    started = time.perf_counter()
    bench_run.parallel(lambda name: stack.cp.add_node(name, gpus="8"), missing, scale.CREATORS)
    heartbeat = Heartbeat(api, names)
    stack.wait_for(lambda: not scale.tainted(api, set(names)), scale.WAIT_SECONDS,
                   f"{len(names)} nodes Ready and untainted", interval=1)
    figures: dict = {"nodes_ready_s": time.perf_counter() - started}
    ours = set(names)
    pods = _all_pods(api)
    bound = [p for p in pods if (p.get("spec") or {}).get("nodeName") in ours]
    pending_there = [p for p in pods if not (p.get("spec") or {}).get("nodeName")]
    to_create = max(0, pods_n - pending_n - len(bound))
    started = time.perf_counter()
    if to_create:
        spaces = [scale.namespace(stack, f"gpus-team{k}") for k in range(NAMESPACES)]
        first = len(bound)  # holders first: pods 0 .. 4 x nodes hold GPUs 0-3 (scale.bulk_pod)

        def create(i: int) -> None:
            body = scale.bulk_pod(i, names)
            namespace = spaces[i % len(spaces)]
            bound.append(api._call("POST", f"/api/v1/namespaces/{namespace}/pods", body))
        bench_run.parallel(create, range(first, first + to_create), scale.CREATORS)
    figures["bound_created"], figures["bound_create_s"] = to_create, time.perf_counter() - started
    # bind's device records: one for every GPU a bound pod holds on these nodes, unless there is one
    leases = [lease for page, _ in api.list_leases(RECORDS_NAMESPACE, RECORD_SELECTOR) for lease in page]
    recorded = {(lease["metadata"]["name"]) for lease in leases}
    wanted = {}
    for pod in bound:
        meta = pod["metadata"]
        for device in held_devices(pod):
            name = record_name(pod["spec"]["nodeName"], device)
            if name not in recorded and name not in wanted:
                wanted[name] = lease_for(pod["spec"]["nodeName"], device, (workload_key(workload(pod)),), False,
                                         f"{meta['namespace']}/{meta['name']}", meta.get("uid", ""), time.time())
    started = time.perf_counter()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{RECORDS_NAMESPACE}/leases"
    bench_run.parallel(lambda body: api._call("POST", path, body), list(wanted.values()), scale.CREATORS)
    figures["records_created"], figures["records_create_s"] = len(wanted), time.perf_counter() - started
    # the pending pods, in the namespaces of the bound pods (the largest first), and a gang
    by_namespace = collections.Counter(p["metadata"]["namespace"] for p in bound)
    spaces = [namespace for namespace, _ in by_namespace.most_common(NAMESPACES)]
    ours_pending = [p for p in pending_there if (p.get("spec") or {}).get("schedulerName") == "gpu-scheduler"]
    wanted_n = max(0, pending_n - len(ours_pending))
    gang = GANG if wanted_n >= 2 * GANG and spaces else 0
    singles = wanted_n - gang
    bodies = []
    for k, namespace in enumerate(spaces):
        mine = range(k, singles, len(spaces))  # the pending pods' global numbers g, in this namespace
        where = [(names[g * 7 % nodes_n], HELD_DEVICES[g // 2 % 4] if g % 2 == 0 else FREE_DEVICES[g // 2 % 2])
                 for g in mine]
        text = "".join(f"{i}={node}:{device}\n" for i, (node, device) in enumerate(where))
        bodies += [(namespace, {"metadata": {"name": f"w-{i}", "annotations": {"gpu-scheduling-map": text}},
                                "spec": {"schedulerName": "gpu-scheduler", "containers": scale.container(scale.GPU)}})
                   for i in range(len(where))]
    if gang:
        text = "".join(f"{i}={names[(i * 13 + 5) % nodes_n]}:{FREE_DEVICES[i % 2]}\n" for i in range(gang))
        bodies += [(spaces[0], {"metadata": {"name": f"g-{i}", "annotations": {
            "gpu-scheduling-map": text, "gpu-scheduler/gang": "true"}}, "spec": {
            "schedulerName": "gpu-scheduler", "containers": scale.container(scale.GPU)}}) for i in range(gang)]
    started = time.perf_counter()
    bench_run.parallel(lambda item: api._call("POST", f"/api/v1/namespaces/{item[0]}/pods", item[1]), bodies,
                       scale.CREATORS)
    figures["pending_created"], figures["pending_create_s"] = len(bodies), time.perf_counter() - started
    pods = _all_pods(api)
    figures.update(
        nodes=sum(1 for page, _ in api.list_nodes() for _ in page), pods=len(pods),
        bound=sum(1 for p in pods if (p.get("spec") or {}).get("nodeName")),
        pending_ours=sum(1 for p in pods if not (p.get("spec") or {}).get("nodeName")
                         and (p.get("spec") or {}).get("schedulerName") == "gpu-scheduler"),
        holders=sum(1 for p in pods if DEVICES_ANNOTATION in ((p.get("metadata") or {}).get("annotations") or {})),
        records=sum(1 for page, _ in api.list_leases(RECORDS_NAMESPACE, RECORD_SELECTOR) for _ in page),
        pending_namespaces=len(spaces), largest_namespace_pods=max(by_namespace.values(), default=0))
    return heartbeat, figures


# -- measuring ---------------------------------------------------------------------------------
def _argv(kubeconfig: str) -> list[str]:
    return ["gpus", "-o", "json", "--kubeconfig", kubeconfig, "--scheduler-namespace", RECORDS_NAMESPACE]


def _env() -> dict[str, str]:
    """The environment without the variables the plugin would read instead of its flags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPU_SCHEDULER_") and k != "KUBECONFIG"}


def timed(argv: list[str], stdout=subprocess.DEVNULL) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, env=_env(), check=False)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv[:3])}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    return seconds, done


class Split:
    """The command run in this process (cli.main), each step timed by wrapping it in its module,
    and the API calls it made (Kube._call), by kind."""

    STEPS = ("read", "snapshots", "verdicts", "view", "render")

    def __init__(self, ignore: Kube):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()
        self.ignore = ignore  # the bench's own client (the nodes' heartbeat): its calls are not counted

    def run(self, argv: list[str]) -> float:
        from kubectl_gpu_scheduler import cli, gpus
        originals = {"read": (gpus.Reads, "read"), "snapshots": (gpus, "snapshots"), "verdicts": (gpus, "waiters"),
                     "view": (gpus, "gpu_view"), "render": (gpus, "render"), "call": (Kube, "_call")}
        saved = {step: getattr(owner, attr) for step, (owner, attr) in originals.items()}

        def timing(step, fn):
            def wrapper(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds[step] += time.perf_counter() - started
            return wrapper

        def calling(api, method, path, *args, **kwargs):
            if api is not self.ignore:
                query = kwargs.get("query") or (args[2] if len(args) > 2 else None)
                self.calls[_call_kind(method, path, query, kwargs.get("accept", ""))] += 1
            return saved["call"](api, method, path, *args, **kwargs)
        try:
            for step, (owner, attr) in originals.items():
                setattr(owner, attr, calling if step == "call" else timing(step, saved[step]))
            started = time.perf_counter()
            out, err = io.StringIO(), io.StringIO()
            code = cli.main(argv, stdout=out, stderr=err)
            total = time.perf_counter() - started
        finally:
            for step, (owner, attr) in originals.items():
                setattr(owner, attr, saved[step])
        if code:
            raise RuntimeError(f"gpus in this process: exit {code}: {err.getvalue()[-2000:]}")
        self.seconds["total"] += total
        return total


def _call_kind(method: str, path: str, query, accept: str = "") -> str:
    """What a call reads: `list pods` (a page of every namespace's), `list pods of a node`, `list
    pods, <field selector>`, `list pods of a namespace`, `get pod`, `get node`, ... (`, metadata
    only` where only the objects' metadata is asked for)."""
    parts = path.split("?")[0].strip("/").split("/")
    query = query or {}
    verb = {"GET": "get"}.get(method, method)
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        rest = parts[parts.index("namespaces") + 2:]
        if len(rest) == 1:
            return f"list {rest[0]} of a namespace"
        return f"{verb} {rest[0].removesuffix('s')}" + (f" {'/'.join(rest[2:])}" if len(rest) > 2 else "")
    if len(parts) >= 2 and parts[-2] in ("nodes", "namespaces"):
        return f"{verb} {parts[-2].removesuffix('s')}"
    selector = query.get("fieldSelector") or ""
    if selector.startswith("spec.nodeName=") and "," not in selector:
        return f"list {parts[-1]} of a node"
    return (f"list {parts[-1]}" + (f", {selector}" if selector else "")
            + (", metadata only" if "PartialObjectMetadata" in accept else ""))


def profile_once(argv: list[str], into: Path, header: str) -> None:
    from kubectl_gpu_scheduler import cli
    profiler = cProfile.Profile()
    out, err = io.StringIO(), io.StringIO()
    profiler.runcall(cli.main, argv, stdout=out, stderr=err)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(10)
    stats.sort_stats("tottime").print_stats(10)
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_text(header + text.getvalue())


def measure(stack: LocalStack, api: Kube, nodes_n: int, pods_n: int, pending_n: int, reps: int,
            label: str = "") -> dict:
    """Populate, then time the command, the floor and the split (the module's docstring)."""
    heartbeat, figures = populate(stack, api, nodes_n, pods_n, pending_n)
    try:
        kubeconfig = str(stack.cp.kubeconfig)
        argv = [str(COMMAND), *_argv(kubeconfig)]
        # once, to see that it answers what it should (and to warm the API server's caches alike)
        _, done = timed(argv, subprocess.PIPE)
        data = json.loads(done.stdout)
        states = collections.Counter(g["state"] for g in data["gpus"])
        verdicts = collections.Counter(w["action"] for g in data["gpus"] for w in g["waiting"])
        figures.update(gpus=len(data["gpus"]), states=dict(states), json_bytes=len(done.stdout),
                       waiting_pods=len({w["pod"] for g in data["gpus"] for w in g["waiting"]}),
                       verdicts=dict(verdicts))
        runs: dict[str, list[float]] = {"gpus": [], "kubectl get pods": [], "kubectl get nodes": [], "start": [],
                                        "in process": []}
        floor = {"kubectl get pods": [str(KUBECTL), "--kubeconfig", kubeconfig, "get", "pods", "-A", "-o", "json"],
                 "kubectl get nodes": [str(KUBECTL), "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"],
                 "start": [str(COMMAND), "--version"]}
        split = Split(api)
        for rep in range(reps):
            order = ["gpus", *floor] if rep % 2 == 0 else [*floor, "gpus"]
            for what in order:
                runs[what].append(timed(argv if what == "gpus" else floor[what])[0])
            with heartbeat.held():
                runs["in process"].append(split.run(_argv(kubeconfig)))
        figures["runs"] = runs
        figures["median_s"] = {what: statistics.median(values) for what, values in runs.items()}
        figures["floor_s"] = statistics.median(pods + nodes for pods, nodes
                                               in zip(runs["kubectl get pods"], runs["kubectl get nodes"]))
        figures["split_s"] = {step: split.seconds[step] / reps for step in (*Split.STEPS, "total")}
        figures["calls"] = {kind: count / reps for kind, count in sorted(split.calls.items())}
        name = f"gpus-{label or f'{nodes_n}x{pods_n}'}.txt"
        when = time.strftime("%Y-%m-%d %H:%M")
        header = (f"kubectl gpu-scheduler gpus -o json in one process under cProfile ({when},"
                  f" bench/gpus.py): {figures['nodes']} nodes, {figures['pods']} pods ({figures['bound']} bound,"
                  f" {figures['pending_ours']} pending of gpu-scheduler), {figures['records']} device records;"
                  f" {figures['gpus']} GPUs in the answer.\nWithout the profiler, medians of {reps}: the command"
                  f" {figures['median_s']['gpus']:.2f} s, in this process {figures['median_s']['in process']:.2f} s;"
                  f" split (means): " + ", ".join(f"{k} {v:.2f} s" for k, v in figures["split_s"].items())
                  + "\nAPI calls per run: " + ", ".join(f"{k} {v:g}" for k, v in figures["calls"].items()) + "\n\n")
        with heartbeat.held():
            profile_once(_argv(kubeconfig), PROFILES / name, header)
        figures["profile"] = str((PROFILES / name).relative_to(REPO))
    finally:
        heartbeat.stop()
    return figures


def rows(g: dict) -> list[str]:
    out = []

    def row(name, value, goal="(report)", ok=None):
        out.append(figure_line(name, value, goal, ok))
    m = g["median_s"]
    row(f"gpus -o json: {g['nodes']} nodes, {g['pods']} pods, {g['pending_ours']} pending (s)", f"{m['gpus']:.2f}",
        f"<= {GOAL_S:g}", m["gpus"] <= GOAL_S)
    row("  floor: kubectl get pods -A -o json + get nodes -o json (s)",
        f"{g['floor_s']:.2f} ({m['kubectl get pods']:.2f}+{m['kubectl get nodes']:.2f})")
    row("  gpus / floor", f"{m['gpus'] / g['floor_s']:.2f}")
    s = g["split_s"]
    row("  in one process (s): total; start alone (--version)", f"{m['in process']:.2f}; {m['start']:.2f}")
    row("  split (s): read; snapshots; pending verdicts; view; JSON",
        f"{s['read']:.2f}; {s['snapshots']:.2f}; {s['verdicts']:.2f}; {s['view']:.2f}; {s['render']:.2f}")
    row("  GPUs (states); pending pods shown, verdicts",
        f"{g['gpus']} ({', '.join(f'{k} {v}' for k, v in sorted(g['states'].items()))}); {g['waiting_pods']}, "
        + ", ".join(f"{k} {v}" for k, v in sorted(g["verdicts"].items())))
    row("  API calls per run", ", ".join(f"{k} {v:g}" for k, v in g["calls"].items()))
    row("  runs (s): gpus; floor pods; floor nodes", "; ".join(
        " ".join(f"{x:.2f}" for x in g["runs"][k]) for k in ("gpus", "kubectl get pods", "kubectl get nodes")))
    row("  cProfile of one run in this process", g["profile"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="20 nodes, 400 pods, 20 pending, 2 repetitions")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--pods", type=int, help="pods in all: bound ones and the pending ones")
    parser.add_argument("--pending", type=int, help="pending pods of gpu-scheduler (a gang of 8 among them)")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--label", default="", help="the profile's name: bench/profiles/gpus-<label>.txt")
    args = parser.parse_args()
    nodes_n, pods_n, pending_n, reps = SIZES["smoke" if args.smoke else "scale"]
    nodes_n, pods_n = args.nodes or nodes_n, args.pods or pods_n
    pending_n, reps = args.pending if args.pending is not None else pending_n, args.reps or reps
    with LocalStack(webhook=False, event_source=False) as stack, tempfile.TemporaryDirectory(prefix="bind-at-") as into:
        api = scale.admin_api(stack)
        scale.Binds(stack, api, Path(into)).stop("bind", pods_deleted=False)  # nothing places the pending pods
        figures = measure(stack, api, nodes_n, pods_n, pending_n, reps, args.label)
    print(json.dumps(figures, indent=2))
    print("\n".join(rows(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
