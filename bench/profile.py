"""Profiles of bind and mutate under load, on the local control plane, with py-spy
(requirements-dev.txt). Writes, per scenario, into bench/profiles/ (or --out):
  <name>.speedscope.json   the flame graph (open it in speedscope; made from py-spy's raw output)
  <name>.txt               its top entries: functions by self time and by total time, and the
                           share of samples in each layer of the request path

    python -m bench.profile [--label before] [--pods 300] [--only bind-create-to-bound,...]

Scenarios (each on its own fresh namespace):
  bind-create-to-bound  pods created one after another, with the webhook, delivered by Knative's
                        real receive adapter (localcp/adapter.py): what `make bench` compares with
                        kube-scheduler; add events place pods, update events are ignored
  bind-c1 / bind-c8     bind_throughput's load: one add event per pending pod, 1 or 8 senders
  direct-c1 / direct-c8 its direct pods/binding loop (the profile is of an idle bind: the CPU
                        figures are the point, the API server's per binding)
  kube-scheduler-create-to-bound  the same with kube-scheduler placing (for its CPU figures)
  mutate                pod creation one after another with the webhook registered; the event
                        source and bind place them meanwhile, as in a cluster
py-spy samples the thread holding the GIL (--gil) in the function's processes (functions-framework's
gunicorn master and worker, --subprocesses). Alongside, the CPU time each process of the stack
used during the scenario, per pod (from /proc: user + system).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from localcp.cluster import REPO
from localcp.cloudevents import Sender, cloudevent_headers
from localcp.stack import LocalStack

from . import run

PY_SPY = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
OUT = REPO / "bench" / "profiles"

# Layers of the request path, by the first frame that names one (innermost wins): a sample counts
# toward the innermost layer it is in, so the shares add up to 100 %.
LAYERS = [
    ("gunicorn worker/arbiter (accept, poll, parse, write)", ("gunicorn/",)),
    ("werkzeug/flask request handling", ("werkzeug/", "flask/")),
    ("functions-framework", ("functions_framework/",)),
    ("cloudevents from_http", ("cloudevents/",)),
    # The functions' own modules appear by their file name alone (bench/profile.py's BIND, below);
    # matched by their folder, as these were until issue 62, they never matched.
    ("bind/mutate handler (own code)", ("(main.py",)),
    ("placer and core", ("(placer.py", "(handle.py", "gpu_scheduler/")),
    ("Event recorder", ("(recorder.py",)),
    ("kubeapi client", ("kubeapi/",)),
    ("urllib3/http.client/ssl/socket", ("urllib3/", "http/client.py", "ssl.py", "socket.py")),
    ("json", ("json/",)),
    ("logging (jsonlog)", ("logging/", "serving/jsonlog.py")),
    ("prometheus_client", ("prometheus_client/",)),
    # After logging's, so serving/jsonlog.py counts as logging. (In the profiles recorded before
    # serving/ existed, these frames counted toward "placer and core".)
    ("serving (fast path, draining, sink auth)", ("serving/",)),
]


def record_raw(pid: int, rate: int, raw: Path):
    """Start py-spy on pid and its children; returns a stop() that ends it and returns its raw
    (collapsed) samples."""
    # --gil: only the thread holding the GIL, i.e. where the function spends Python CPU. (Without
    # it, py-spy on this machine counts threads blocked in epoll or a queue as running.)
    spy = subprocess.Popen([PY_SPY, "record", "--pid", str(pid), "--subprocesses", "--rate", str(rate),
                            "--nonblocking", "--gil", "--format", "raw", "-o", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches

    def stop() -> str:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
        text = raw.read_text() if raw.exists() else ""
        raw.unlink(missing_ok=True)
        return text
    return stop


def record(pid: int, name: str, out: Path, rate: int):
    """Start py-spy on pid and its children; returns a stop() that ends it and writes the files."""
    out.mkdir(parents=True, exist_ok=True)
    stop_raw = record_raw(pid, rate, out / f"{name}.raw.txt")

    def stop() -> None:
        text = stop_raw()
        (out / f"{name}.txt").write_text(summarize(text))
        (out / f"{name}.speedscope.json").write_text(json.dumps(speedscope(text, name)))  # the same samples
    return stop


def _samples(raw: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw (collapsed) lines as (frames, outermost first, each "fn (file)"; samples)."""
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            yield [_short(f) for f in _frames(stack)], int(count)


def _innermost(frames: list[str], table: list[tuple[str, tuple[str, ...]]], otherwise: str) -> str:
    """The label of the innermost frame that names one of `table`'s parts (the first in the table
    for that frame), else `otherwise`."""
    for frame in reversed(frames):
        hit = next((label for label, keys in table if any(k in frame for k in keys)), None)
        if hit:
            return hit
    return otherwise


def speedscope(raw: str, name: str) -> dict:
    """py-spy's raw (collapsed) stacks as a speedscope "sampled" profile."""
    frames: dict[str, int] = {}
    samples, weights = [], []
    for stack, count in _samples(raw):
        samples.append([frames.setdefault(f, len(frames)) for f in stack])
        weights.append(count)
    return {"$schema": "https://www.speedscope.app/file-format-schema.json", "name": name,
            "shared": {"frames": [{"name": f} for f in frames]},
            "profiles": [{"type": "sampled", "name": name, "unit": "none", "startValue": 0,
                          "endValue": sum(weights), "samples": samples, "weights": weights}]}


def _frames(stack: str) -> list[str]:
    # py-spy raw: "process;thread;fn (file:line);fn (file:line) count"; keep "fn (file)"
    frames = []
    for frame in stack.split(";"):
        if "(" in frame:
            fn, _, where = frame.partition(" (")
            frames.append(f"{fn} ({where.rsplit(':', 1)[0].rstrip(')')})")
    return frames


def _short(frame: str) -> str:
    fn, _, path = frame.rpartition(" (")
    for marker in ("site-packages/", "lib/python3.11/", str(REPO) + "/"):
        if marker in path:
            return f"{fn} ({path.split(marker, 1)[1]}"
    return frame


def summarize(raw: str, top: int = 30) -> str:
    own, total = collections.Counter(), collections.Counter()
    layers = collections.Counter()
    samples = 0
    for frames, n in _samples(raw):
        samples += n
        if not frames:
            continue
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
        layers[_innermost(frames, LAYERS, "other (interpreter, threading, imports)")] += n
    lines = [f"samples (the thread holding the GIL): {samples}", "", "share of samples by innermost layer of the request path:"]
    lines += [f"  {n / samples:6.1%}  {label}" for label, n in layers.most_common()] if samples else []
    lines += ["", f"top {top} by self time:"]
    lines += [f"  {n / samples:6.1%}  {f}" for f, n in own.most_common(top)] if samples else []
    lines += ["", f"top {top} by total time (self + callees):"]
    lines += [f"  {n / samples:6.1%}  {f}" for f, n in total.most_common(top)] if samples else []
    return "\n".join(lines) + "\n"


def cpu_seconds(pid: int, children: bool = True) -> float:
    """user + system CPU of pid and its live children, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children") if children else None
    if children and children.exists():
        pids += [int(c) for c in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def cpu_meter(stack: LocalStack):
    """Returns a read() giving CPU ms used by each process of the stack (and this one) since now."""
    pids = {name: p.pid for name, p in stack.cp.processes.items()}
    bench = "bench (creator, event source, senders)"
    pids[bench] = os.getpid()  # its children (py-spy, kubectl) are not counted

    def cpu(name: str) -> float:
        return cpu_seconds(pids[name], children=name != bench)
    start = {name: cpu(name) for name in pids}

    def read() -> dict[str, float]:
        return {name: (cpu(name) - start[name]) * 1000 for name in pids}
    return read


def measured(stack: LocalStack, name: str, pods: int, args, work) -> dict:
    """Runs work() under py-spy (the bind or mutate process) and the CPU meter."""
    target = "mutate" if name.startswith("mutate") else "bind"
    stop = record(stack.cp.processes[target].pid, f"{name}{args.suffix}", args.out, args.rate)
    meter = cpu_meter(stack)
    started = time.perf_counter()
    figure = work()
    wall = time.perf_counter() - started
    cpu = meter()
    stop()
    per_pod = {k: round(v / pods, 2) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
    text = "\n".join(f"  {v:7.2f} ms  {k}" for k, v in per_pod.items())
    summary = (f"{name}: {figure}\nwall {wall:.2f} s for {pods} pods; CPU per pod by process "
               f"(2 cores: at most {2000 * wall / pods:.2f} ms per pod in all):\n{text}\n")
    path = args.out / f"{name}{args.suffix}.txt"
    path.write_text(summary + "\n" + path.read_text())
    print(summary, flush=True)
    return {"figure": figure, "cpu_ms_per_pod": per_pod, "wall_s": wall}


def bind_load(stack: LocalStack, pending: list[dict], concurrency: int) -> float:
    sender = Sender(stack.bind_url, delays=())

    def via_bind(p):
        answer = sender.http.request("POST", stack.bind_url, body=json.dumps(p).encode(),
                                     headers=cloudevent_headers("add", p, stack.cp.server))
        assert json.loads(answer.data)["result"] == "Bound", answer.data
    return len(pending) / run.parallel(via_bind, pending, concurrency)


def direct_load(stack: LocalStack, pending: list[dict], concurrency: int) -> float:
    """bench/run.py's direct loop: pods/binding with the kubernetes client, as bind's account."""
    from kubernetes import client, config
    api = client.CoreV1Api(config.new_client_from_config(str(stack.bind_kubeconfig)))

    def via_client(p):
        m = p["metadata"]
        api.create_namespaced_pod_binding(m["name"], m["namespace"], {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": m["name"], "uid": m["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node1"}}, _preload_content=False).release_conn()
    return len(pending) / run.parallel(via_client, pending, concurrency)


def release_all(stack: LocalStack) -> None:
    """Remove every bench pod so far: bound pods hold their GPUs for bind's fit checks, and the
    next scenario's pods (another namespace, another workload) would be refused them."""
    for namespace in stack.api.list_namespace().items:
        if namespace.metadata.name.startswith("bench-"):
            run.release(stack, namespace.metadata.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="", help="suffix of the files, e.g. before / after-step-1")
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--only", default="bind-create-to-bound,kube-scheduler-create-to-bound,mutate,bind-c1,direct-c1,bind-c8,direct-c8")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    only = set(args.only.split(","))
    args.suffix = f"-{args.label}" if args.label else ""
    n = args.pods
    figures = {}
    with LocalStack(webhook=True, event_source=True) as stack:
        if "bind-create-to-bound" in only:
            figures["bind-create-to-bound"] = measured(stack, "bind-create-to-bound", n, args,
                                                       lambda: run.create_to_bound(stack, n, "bind"))
        if "kube-scheduler-create-to-bound" in only:  # no profile of interest: the CPU figures
            figures["kube-scheduler"] = measured(stack, "kube-scheduler-create-to-bound", n, args,
                                                 lambda: run.create_to_bound(stack, n, "kube-scheduler"))
        if "mutate" in only:
            figures["mutate"] = measured(stack, "mutate", n, args, lambda: {"create_p50_ms": 1000 * run.statistics.median(
                run.create_latencies(stack, n, run.map_for(n)))})
            release_all(stack)
        stack.unregister_webhook()
        stack.adapter.stop()  # the receive adapter and its tap: the loads below send their own events
        stack.adapter = stack.source = None
        time.sleep(1)
        for c in (1, 8):
            if f"bind-c{c}" in only:
                pending = run.pending_pods(stack, n, run.map_for(n))
                figures[f"bind-c{c}"] = measured(stack, f"bind-c{c}", n, args,
                                                 lambda: {"pods_per_s": bind_load(stack, pending, c)})
                release_all(stack)
            if f"direct-c{c}" in only:  # for the API server's CPU per binding without bind's Event
                pending = run.pending_pods(stack, n, run.map_for(n))
                figures[f"direct-c{c}"] = measured(stack, f"direct-c{c}", n, args,
                                                   lambda: {"pods_per_s": direct_load(stack, pending, c)})
                release_all(stack)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- where bind's CPU per placement goes (issue 62) ------------------------------------------------
# kubeapi.client's calls that write: a sample under one of them is that write's, whatever it is
# doing (encoding, TLS, reading the answer), so each write's whole cost is one row.
WRITES = ("bind", "create_lease", "update_lease", "delete_lease", "create_event", "patch_event", "read_event",
          "patch_pod_status", "create_resource_claim", "update_resource_claim", "update_resource_claim_status")
# bind's own modules appear by their file name alone (functions-framework imports main.py from
# its folder, which puts that folder on sys.path).
BIND = ("placer.py", "handle.py", "cache.py", "views.py", "eventhandlers.py", "informers.py", "recorder.py",
        "schedqueue.py", "main.py", "advertiser.py", "config.py", "metrics.py")
# The rest by the innermost frame that names a part (the first match in this order wins for it).
PARTS = [
    ("decode (msgspec, projections)", ("kubeapi/projection.py", "msgspec")),
    ("logging (jsonlog)", ("logging/", "serving/jsonlog.py")),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("the cycle (framework, plugins, core)", ("gpu_scheduler/",)),
    ("views: cache, event handlers, informers", ("(cache.py", "(views.py", "(eventhandlers.py", "(informers.py")),
    ("queue", ("(schedqueue.py",)),
    ("Event recorder (own code)", ("(recorder.py",)),
    ("placer and handle (own code)", ("(placer.py", "(handle.py")),
    ("HTTP: reads and watches (kubeapi, http.client, ssl, socket)",
     ("kubeapi/", "http/client.py", "ssl.py", "socket.py", "selectors.py", "urllib3/")),
    ("request handling (gunicorn, flask, functions-framework, cloudevents, bind's main)",
     ("gunicorn/", "werkzeug/", "flask/", "functions_framework/", "cloudevents/", "(main.py", "serving/")),
    ("json (stdlib)", ("json/",)),
]
# What a thread is, by the function it runs (the outermost frame that names one)
THREADS = [
    ("placer workers (the cycle, the Binding, the record)", ("Placer._work (",)),
    ("informers (watches of pods, nodes, records)", ("Informer._run (",)),
    ("event recorder (Events, conditions)", ("Recorder._run (", "Recorder._write_later (")),
    # gunicorn's gthread worker answers requests from a ThreadPoolExecutor of its own (bind's
    # events through serving/fastlane.py, called from serving/gunicorn_config.py's worker): before
    # the placer's pool, which is one too
    ("requests (events, pings, probes)", ("gunicorn/workers/", "serving/gunicorn_config.py", "serving/fastlane.py")),
    ("a gang's Bindings side by side", ("_worker (concurrent/futures/thread.py",)),
    ("sweeper, records check", ("Placer._sweep_forever", "Placer._check_records_forever")),
]


def breakdown(raw: str) -> dict[str, dict[str, int]]:
    """py-spy's raw samples (recorded with --gil) by thread kind and by part: {thread: {part: n}}."""
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for frames, count in _samples(raw):
        if not frames:
            continue
        thread = next((label for label, keys in THREADS if any(k in f for f in frames for k in keys)), "other")
        calls = [f.split(" (")[0].rpartition(".")[2] for f in frames if "(kubeapi/client.py" in f]
        write = next((call for call in calls if call in WRITES), None)
        part = f"write: {write}" if write else _innermost(frames, PARTS, "other (interpreter, threading, stdlib)")
        table[thread][part] += count
    return {thread: dict(parts) for thread, parts in table.items()}


def breakdown_rows(table: dict[str, dict[str, int]], cpu_ms_per_placement: float) -> list[str]:
    """The breakdown as shares and as ms of the measured CPU per placement (the samples' shares of
    it: py-spy counts the thread holding the GIL, /proc counts the CPU)."""
    parts: collections.Counter = collections.Counter()
    for counts in table.values():
        parts.update(counts)
    samples = sum(parts.values()) or 1
    rows = [f"  {n / samples:6.1%}  {n / samples * cpu_ms_per_placement:5.2f} ms  {part}"
            for part, n in parts.most_common()]
    rows.append("  by thread:")
    rows += [f"  {sum(c.values()) / samples:6.1%}  {sum(c.values()) / samples * cpu_ms_per_placement:5.2f} ms  {thread}"
             for thread, c in sorted(table.items(), key=lambda kv: -sum(kv[1].values()))]
    return rows
