"""`make demo`: the seed StatefulSet placed and run on the local stack, start to finish: four real
nodes (kubelet + containerd each), the webhook, the event source and bind.

`make demo DRA=1` (--dra): the seed in DRA mode. Each replica gets a ResourceClaim that bind
allocates to exactly its map entry's devices, published by Kubernetes' DRA test driver on each
node, and the kubelet prepares it (CDI) before the container starts. The seed gives node4's device
3 to index 3 and 4; a device belongs to one claim, so in DRA mode index 4 takes device 2.

`make demo GANG=1` (--gang): the seed as a gang (docs/gangs.md), all or nothing. A workload that
holds node4's GPU 3 runs first; the seed then applied with `gpu-scheduler/gang: "true"` stays
wholly unbound, each member with bind's FailedScheduling Event naming the holder, until the holder
is deleted; then all five are placed and Running. The demo fails (exit 1) if a member of the gang
is bound while the holder is there.

`make demo PREEMPT=1` (--preempt): priority and preemption. The same holder, of a low-priority
class, runs first; the seed is applied with a high-priority class. bind evicts the holder through
the Eviction API (DisruptionTarget PreemptionByScheduler, a `Preempted` Event naming the
preemptor), the holder's containers stop, and all five replicas are placed and Running; the holder's
replacement, of lower priority, waits. The demo fails (exit 1) if the holder is not evicted, or if
its replacement takes the GPU back.

`make demo WORKLOAD=jobset` (--workload jobset), `WORKLOAD=lws` (--workload lws): the example
examples/jobset-torchrun.yaml or examples/lws-vllm.yaml, run by the real JobSet or LeaderWorkerSet
controller beside the control plane (localcp/workloads.py), with its containers replaced by the
seed's check container (its map, schedulerName and annotations kept). Its 4 pods Running, each
pod's index (JobSet: job-index × completions + completion index; LWS: group × size + worker), node
and log line; the demo fails (exit 1) unless every pod runs on its entry's node with
CUDA_VISIBLE_DEVICES equal to its entry's devices.

`make demo WORKLOAD=deployment` (--workload deployment): a pool (docs/usage.md, "Deployments and
pools"). examples/deployment-vllm.yaml, a Deployment of 4 replicas whose pods have no index, with
its containers replaced by the seed's check container, run by kube-controller-manager's own
Deployment controller (no other controller). Its 4 pods Running, each with the entry bind gave it
(gpu-scheduler/entry), its node, its devices (gpu-scheduler/devices) and its log line; then a
rollout (a template annotation): maxSurge 0, so each old pod leaves before a new one takes its
entry; the new ReplicaSet's 4 pods Running and the old ones gone, shown the same way. The demo
fails (exit 1) if two pods of the Deployment that have not ended (one of them being deleted
included: its containers may still run) hold one entry at any time it looks, or if a pod's log
line names other devices than its gpu-scheduler/devices annotation, or than its entry's.

`make demo WORKLOAD=kueue` (--workload kueue): the real Kueue queues pinned jobs
(examples/kueue/): its ClusterQueue covers 8 of gpu-scheduler.io/gpu, which mutate writes on each
pinned template (docs/quotas.md). Two Indexed Jobs of examples/kueue/job.yaml, 4 pods × 2 GPUs
each, with the check container, on different devices (the first GPUs 0,1 of every node, the second
2,3): only the queue separates them. The first is admitted and Running (each pod's node and log
line); the second waits, its Workload pending, its Job suspended, no pod; the first is deleted and
the second runs. The demo fails (exit 1) if a pod of the second exists before the first is
deleted, or if a pod is not on its entry's node with its entry's devices."""
from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import time

import yaml

from gpu_scheduler.schedmap import parse_map

from . import knative
from .cluster import DRA_SERVED, KUBERNETES_VERSION, REPO, ensure_built
from .incluster import NAMESPACE
from .stack import LocalStack
from .workloads import KUEUE_NAMESPACE_LABEL

SEED = REPO / "check" / "statefulset.yaml"
SELECTOR = "app=gpu-scheduler-check"
DRA_CHANGES = {"gpu-scheduler/device-env": "dra", "gpu-scheduler/device-class": "test-driver.cdi.k8s.io"}
DRA_INDEX_4 = ("4=node4:3", "4=node4:2")
GANG = {"gpu-scheduler/gang": "true"}
HOLDER = "gpu-holder"  # --gang: the workload that holds node4's GPU 3 first
HOLDER_MAP = "0=node4:3\n"
SEED_NAME = "gpu-scheduler-check"
# --preempt: the holder's class and the seed's
LOW_CLASS, HIGH_CLASS = "gpu-scheduler-demo-low", "gpu-scheduler-demo-high"
PRIORITY_CLASSES = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                     "value": value, "description": "make demo PREEMPT=1"}
                    for name, value in ((LOW_CLASS, 100), (HIGH_CLASS, 100000))]
HOLDER_GRACE_SECONDS = 5  # the holder's containers are given this long to stop once evicted


def seed(dra: bool, gang: bool = False, priority_class: str = "") -> str:
    """The seed as applied: unchanged, or in DRA mode (two annotations, index 4 on device 2), or
    as a gang (one annotation), or of a PriorityClass."""
    if not dra and not gang and not priority_class:
        return SEED.read_text()
    manifest = yaml.safe_load(SEED.read_text())
    annotations = manifest["spec"]["template"]["metadata"]["annotations"]
    if dra:
        annotations.update(DRA_CHANGES)
        annotations["gpu-scheduling-map"] = annotations["gpu-scheduling-map"].replace(*DRA_INDEX_4)
    if gang:
        annotations.update(GANG)
    if priority_class:
        manifest["spec"]["template"]["spec"]["priorityClassName"] = priority_class
    return json.dumps(manifest)


def holder(priority_class: str = "") -> dict:
    """The seed's StatefulSet renamed gpu-holder, one replica, map 0=node4:3: another workload,
    placed by bind, that holds node4's GPU 3 (of `priority_class`, stopping within
    HOLDER_GRACE_SECONDS, when given)."""
    manifest = yaml.safe_load(SEED.read_text())
    manifest["metadata"] = {"name": HOLDER, "namespace": "default", "labels": {"app": HOLDER}}
    spec = manifest["spec"]
    spec.update(replicas=1, serviceName=HOLDER, selector={"matchLabels": {"app": HOLDER}})
    spec["template"]["metadata"] = {"labels": {"app": HOLDER}, "annotations": {"gpu-scheduling-map": HOLDER_MAP}}
    if priority_class:
        spec["template"]["spec"].update(priorityClassName=priority_class,
                                        terminationGracePeriodSeconds=HOLDER_GRACE_SECONDS)
    return manifest


def suggested(stack: LocalStack) -> str:
    """What `kubectl gpu-scheduler suggest -f check/statefulset.yaml --gpus 2` prints on the stack."""
    from kubectl_gpu_scheduler.cli import main as plugin

    out, err = io.StringIO(), io.StringIO()
    plugin(["suggest", "-f", str(SEED), "--gpus", "2", "--kubeconfig", str(stack.cp.kubeconfig)],
           stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def running(stack: LocalStack, count: int) -> list[dict] | None:
    pods = stack.pods("default", SELECTOR)
    up = [p for p in pods if p["status"].get("phase") == "Running"]
    return pods if len(pods) == count and len(up) == count else None


class GangBroken(Exception):
    """A member of the gang was bound while the holder held GPU 3: not all or nothing."""


def failed_scheduling(stack: LocalStack, pod: dict) -> list[dict]:
    """The pod's FailedScheduling Events."""
    query = f"fieldSelector=reason%3DFailedScheduling,involvedObject.uid%3D{pod['metadata']['uid']}"
    return json.loads(stack.cp.get(f"/api/v1/namespaces/default/events?{query}"))["items"]


def gang_waiting(stack: LocalStack, holder_pod: str) -> tuple[list[dict], dict[str, dict]]:
    """Polls until all five members exist, none bound, each with bind's gang Event naming the
    holder (the pods, and that Event by pod name); raises GangBroken as soon as a member is bound."""
    expected = re.compile(rf"gang default/{SEED_NAME}: \d+ of 5 members placeable; member (default/)?{SEED_NAME}-\d+: "
                          rf"GPU 3 on node4 is held by .*{holder_pod}")

    def waiting():
        pods = stack.pods("default", SELECTOR)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        if bound:
            raise GangBroken(", ".join(f"{p['metadata']['name']} on {p['spec']['nodeName']}" for p in bound))
        if len(pods) < 5:
            return None
        events = {p["metadata"]["name"]: next((e for e in failed_scheduling(stack, p) if expected.match(e["message"])),
                                              None) for p in pods}
        return (pods, events) if all(events.values()) else None
    return stack.wait_for(waiting, 90, "every member of the gang Pending with bind's Event naming the holder")


def blocked_gang(stack: LocalStack) -> str | None:
    """--gang up to the holder's deletion: the holder Running, the seed applied as a gang and
    shown waiting with nothing bound. None, or why the gang is not all or nothing."""
    step(f"A workload that holds node4's GPU 3 first: StatefulSet {HOLDER}, one replica, map {HOLDER_MAP.strip()}")
    print(stack.apply(holder()), end="")

    def holder_running():
        pods = [p for p in stack.pods("default", f"app={HOLDER}") if p["status"].get("phase") == "Running"]
        return pods[0] if pods else None
    held = stack.wait_for(holder_running, 120, f"{HOLDER}-0 Running")
    holder_pod = held["metadata"]["name"]
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", f"app={HOLDER}").stdout, end="")
    step(f"kubectl apply -f {SEED.relative_to(REPO)} as a gang: annotation {GANG} on the pod template\n"
         "    (podManagementPolicy: Parallel, as shipped); index 3 and 4 want node4's GPU 3")
    print(stack.apply(seed(False, gang=True)), end="")
    try:
        _, events = gang_waiting(stack, holder_pod)
    except (GangBroken, TimeoutError) as failed:
        print(stack.cp.kubectl("get", "pod", "-o", "wide").stdout, end="")
        for pod in stack.pods("default", SELECTOR):
            for event in failed_scheduling(stack, pod):
                print(f"    {pod['metadata']['name']}: FailedScheduling: {event['message']}")
        if isinstance(failed, TimeoutError):
            return f"{failed}: bind's Events (above) do not say that the gang waits for {holder_pod}"
        return (f"gang member bound while {holder_pod} holds GPU 3 on node4: {failed}"
                " (the gang is not all or nothing)")
    step("kubectl get pod -o wide   (the holder Running; no member of the gang bound)")
    print(stack.cp.kubectl("get", "pod", "-o", "wide").stdout, end="")
    step("Each member's FailedScheduling Event (bind's, one per member, counted up while it stays the same)")
    for name, event in sorted(events.items()):
        plugin = (event["metadata"].get("annotations") or {}).get("gpu-scheduler/plugin", "")
        print(f"    {name}: {event['message']}   (count {event.get('count', 1)}; plugin {plugin or '-'})")
    step(f"kubectl delete statefulset {HOLDER}   (GPU 3 on node4 freed: the gang is placed whole)")
    print(stack.cp.kubectl("delete", "statefulset", HOLDER).stdout, end="")
    return None


def preempted(stack: LocalStack) -> str | None:
    """--preempt up to the holder's eviction: the holder Running at low priority, the seed applied
    at high priority, the holder evicted by bind with its condition and Event. None, or what failed."""
    step(f"PriorityClasses {LOW_CLASS} (100) and {HIGH_CLASS} (100000); StatefulSet {HOLDER} of {LOW_CLASS},"
         f" one replica, map {HOLDER_MAP.strip()}")
    for priority_class in PRIORITY_CLASSES:
        print(stack.apply(priority_class), end="")
    print(stack.apply(holder(LOW_CLASS)), end="")

    def holder_running():
        pods = [p for p in stack.pods("default", f"app={HOLDER}") if p["status"].get("phase") == "Running"]
        return pods[0] if pods else None
    held = stack.wait_for(holder_running, 120, f"{HOLDER}-0 Running")
    name, uid = held["metadata"]["name"], held["metadata"]["uid"]
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", f"app={HOLDER}").stdout, end="")
    step(f"kubectl apply -f {SEED.relative_to(REPO)} of {HIGH_CLASS}   (index 3 and 4 want node4's GPU 3, which"
         f" {name} holds)")
    print(stack.apply(seed(False, priority_class=HIGH_CLASS)), end="")

    def evicted():
        pod = (json.loads(stack.cp.get(f"/api/v1/namespaces/default/pods/{name}"))
               if any(p["metadata"]["uid"] == uid for p in stack.pods("default", f"app={HOLDER}")) else None)
        query = f"fieldSelector=reason%3DPreempted,involvedObject.uid%3D{uid}"
        events = json.loads(stack.cp.get(f"/api/v1/namespaces/default/events?{query}"))["items"]
        if not events:
            return None
        condition = next((c for c in ((pod or {}).get("status") or {}).get("conditions") or []
                          if c["type"] == "DisruptionTarget"), None)
        return events[0], condition, pod
    try:
        event, condition, pod = stack.wait_for(evicted, 60, f"{name} preempted")
    except TimeoutError as failed:
        print(stack.cp.kubectl("get", "pod", "-o", "wide").stdout, end="")
        return f"{failed}: bind did not preempt {name}"
    step(f"{name} preempted by bind (its Event; its condition while it terminates)")
    print(f"    Event {event['reason']}: {event['message']}")
    if condition is not None:
        print(f"    condition DisruptionTarget={condition['status']} reason {condition['reason']}: {condition['message']}")
    if pod is not None:
        print(f"    deletionTimestamp {pod['metadata'].get('deletionTimestamp')}, grace {HOLDER_GRACE_SECONDS}s")
    if condition is not None and condition["reason"] != "PreemptionByScheduler":
        return f"{name}'s DisruptionTarget reason is {condition['reason']}, not PreemptionByScheduler"
    return None


def holder_waits(stack: LocalStack) -> str | None:
    """After the seed is Running: the holder's replacement, of lower priority, has not taken GPU 3 back."""
    step(f"kubectl get pod -l app={HOLDER}   (its replacement, of lower priority, waits: GPU 3 is the seed's)")
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", f"app={HOLDER}").stdout, end="")
    bound = [p for p in stack.pods("default", f"app={HOLDER}") if p["spec"].get("nodeName")
             and not p["metadata"].get("deletionTimestamp")]
    return f"{HOLDER}'s replacement was bound to {bound[0]['spec']['nodeName']}" if bound else None


def shown_up(stack: LocalStack, started: float) -> None:
    """The stack just started: how long it took, its versions and its nodes."""
    print(f"    up in {time.monotonic() - started:.1f}s; API server {stack.cp.server}")
    print("    " + "; ".join(stack.cp.versions()))
    print(stack.cp.kubectl("get", "nodes", "-o", "wide").stdout, end="")
    step("kubectl get pods -n kube-system -o wide   (CoreDNS, the kubelets' --cluster-dns; kube-proxy runs on every"
         " node, each node in its own network namespace)")
    print(stack.cp.kubectl("get", "pods", "-n", "kube-system", "-o", "wide").stdout, end="")


def shown_running(stack: LocalStack, dra: bool, described: str, since: tuple[str, float]) -> None:
    """The five replicas Running: where, each container's log line, (DRA) the claims, and the
    Events of one pod. since: (what, when) the time to Running is counted from."""
    pods = stack.wait_for(lambda: running(stack, 5), 120, "5 check pods Running")
    print(f"    five Running {time.monotonic() - since[1]:.1f}s after {since[0]}")
    step("kubectl get pod -o wide -L apps.kubernetes.io/pod-index   (the label the StatefulSet controller sets)")
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-L", "apps.kubernetes.io/pod-index").stdout, end="")
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        step(f"kubectl logs {name} --tail=1   (its container, on {pod['spec']['nodeName']})")
        line = stack.wait_for(lambda: stack.cp.kubectl("logs", name, "--tail=1").stdout, 15, f"{name}'s log")
        print(line, end="")
    if dra:
        step("kubectl get resourceclaims   (each replica's claim: allocated by bind, reserved for its pod)")
        print(stack.cp.kubectl("get", "resourceclaims", "-o", "custom-columns=CLAIM:.metadata.name,"
                               "NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0],"
                               "DEVICES:.status.allocation.devices.results[*].device,"
                               "RESERVED-FOR:.status.reservedFor[*].name").stdout, end="")
    step(f"kubectl describe pod {described}   (its Events: gpu-scheduler's and the kubelet's)")
    text = stack.cp.kubectl("describe", "pod", described).stdout
    print(text[text.index("Events:"):], end="")
    shown_gpus(stack)


def shown_gpus(stack: LocalStack) -> None:
    """Every GPU of the four nodes as the kubectl plugin's `gpus -o grid` draws it: who holds which."""
    import io

    from kubectl_gpu_scheduler.cli import main as plugin

    step("kubectl gpu-scheduler gpus -o grid   (every GPU of the cluster: a letter per workload holding it, . free)")
    drawn = io.StringIO()
    plugin(["gpus", "-o", "grid", "--kubeconfig", str(stack.cp.kubeconfig)], stdout=drawn, stderr=drawn)
    print(drawn.getvalue(), end="")


# --knative: the project on real Knative Eventing and Serving.
def bind_events(stack: LocalStack) -> list[str]:
    """bind's gpu_scheduler_bind_events_total by type and status, in each of its revision's pods
    (read from the pod's port through the API server)."""
    lines = []
    for pod in stack.pods(NAMESPACE, "serving.knative.dev/service=bind"):
        if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        metrics = stack.cp.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}:8080/proxy/metrics").decode()
        lines += [f"    {pod['metadata']['name']}: {line}" for line in metrics.splitlines()
                  if line.startswith("gpu_scheduler_bind_events_total{")]
    return lines


# The demo's bind scales to zero (docs/install.md, "bind at zero"): after 10 s without a request
# (Knative's least window is 6 s, its default 60 s), then Knative's scale-to-zero grace period
# (30 s) and queue-proxy's drain of the last pod.
DEMO_ZERO_VALUES = ("--set", "bind.scale.min=0", "--set", "bind.scale.window=10s")


def bind_pods(stack: LocalStack) -> list[dict]:
    """bind's revision pods, terminating ones included (one answers while queue-proxy drains)."""
    return stack.pods(NAMESPACE, "serving.knative.dev/service=bind")


def bound_times(stack: LocalStack, namespace: str, selector: str, count: int, since: float,
                timeout: float = 120) -> dict[str, float]:
    """Each pod's seconds from `since` (a monotonic time) to its spec.nodeName being set, seen by a
    poll every 50 ms (the API server's timestamps are whole seconds)."""
    bound: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(bound) < count and time.monotonic() < deadline:
        for pod in stack.pods(namespace, selector):
            if pod["spec"].get("nodeName") and pod["metadata"]["name"] not in bound:
                bound[pod["metadata"]["name"]] = time.monotonic() - since
        time.sleep(0.05)
    if len(bound) < count:
        raise TimeoutError(f"{count - len(bound)} of {count} pods not bound after {timeout:g}s")
    return bound


def shown_knative_listings(stack: LocalStack, services: str, resync: str) -> None:
    """kn where a Knative user reaches for it, and the ApiServerSource through kubectl."""
    from . import kn

    step(f"kn service list -n {NAMESPACE}   (bind and mutate, {services}; cluster-local URLs)")
    print(kn.kn(stack.cp, "service", "list", "-n", NAMESPACE).stdout, end="")
    step(f"kn revision list -n {NAMESPACE}")
    print(kn.kn(stack.cp, "revision", "list", "-n", NAMESPACE).stdout, end="")
    step(f"kn route list -n {NAMESPACE}   (Ready: Traefik has programmed their KIngresses)")
    print(kn.kn(stack.cp, "route", "list", "-n", NAMESPACE).stdout, end="")
    step(f"kn source ping list -n {NAMESPACE}   (the resync: {resync})")
    print(kn.kn(stack.cp, "source", "ping", "list", "-n", NAMESPACE).stdout, end="")
    step(f"kubectl get apiserversources -n {NAMESPACE}   (kn source apiserver list panics on a matchLabels"
         " selector: an upstream bug, docs/try-it.md)")
    print(stack.cp.kubectl("get", "apiserversources", "-n", NAMESPACE, "-o", "custom-columns=NAME:.metadata.name,"
                           "SINK:.status.sinkUri,READY:.status.conditions[?(@.type=='Ready')].status").stdout, end="")


def main_knative() -> int:
    """The design's workflow on real Knative: the chart for everything but the two Knative
    Services, `func deploy` for those, `kn` to look, the seed, `func invoke` with the captured
    CloudEvents (docs/install.md, "func")."""
    from . import func, kn, traefik

    step("Building what the stack runs, Knative, Traefik, func, kn and helm included, if it is not cached"
         " (first time: about 35 minutes)")
    ensure_built(stack_only=True)
    knative.ensure_built()
    traefik.ensure_built()
    func.ensure_built()
    kn.ensure_built()
    subprocess.run(["bash", str(REPO / "localcp" / "build-helm.sh")], check=True, stdout=subprocess.DEVNULL)
    step(f"Starting the control plane {KUBERNETES_VERSION} and node1..node4 (kubelet, containerd, kube-proxy, CoreDNS);\n"
         f"    Knative Eventing {knative.projects()[0].version} and Serving {knative.projects()[1].version}, and"
         f" Traefik {traefik.version()} as its networking layer;\n"
         "    then, as a func user installs it (docs/install.md, \"func\"):\n"
         "      helm install gpu-scheduler chart/gpu-scheduler --set runtime=knative -f localcp/knative-values.yaml"
         " -f functions/func-values.yaml   (everything but the two Knative Services)\n"
         "      python chart/func_yaml.py functions/mutate functions/bind   (what the chart refuses is never deployed)\n"
         f"      func deploy --path functions/<name> --build=false --push=false --image kind.local/gpu-scheduler-<name>:dev"
         f"   (func {func.version()}: mutate, then bind)")
    started = time.monotonic()
    failure = None
    with LocalStack(knative=True, deployed_by_func=True) as stack:
        shown_up(stack, started)
        print(f"    Knative ready in {stack.knative_seconds:.1f}s, Traefik in {stack.traefik_seconds:.1f}s; func deploy: "
              + ", ".join(f"{name} Ready in {seconds:.1f}s" for name, seconds in stack.func_seconds.items()))
        shown_knative_listings(stack, "created by func deploy", "from the chart")
        step("What func deploy wrote, beside what the chart renders with the same values (a server-side dry run):"
             " each difference and why; none unexplained")
        for name in ("bind", "mutate"):
            deployed = json.loads(stack.cp.get(f"/apis/serving.knative.dev/v1/namespaces/{NAMESPACE}/services/{name}"))
            found = func.differences(deployed, stack.chart_knative_service(name))
            by_reason: dict[str, list[str]] = {}
            for path, _, _, why in found:
                by_reason.setdefault(why or "UNEXPLAINED: func.yaml and the chart drifted apart (make manifests)",
                                     []).append(path)
            for why, paths in by_reason.items():
                print(f"    {name}: {', '.join(paths)}\n        {why}")
            if any(why is None for *_, why in found):
                failure = f"{name}: func.yaml and the chart drifted apart"
        step(f"kubectl apply -f {SEED.relative_to(REPO)}   (5 replicas: admitted by func's mutate, placed by func's bind)")
        since = ("the apply", time.monotonic())
        print(stack.apply(seed(False)), end="")
        shown_running(stack, False, f"{SEED_NAME}-4", since)
        route = json.loads(func.func(stack.cp, "describe", "--path", str(stack.cp.workdir / "func" / "bind"),
                                     "--output", "json").stdout)["Route"]
        step(f"func describe --path functions/bind   (bind's Route: {route})")
        stack.create_namespace("invoke")
        ping = (REPO / "examples" / "ping.json").read_text()
        step(f"func invoke --target {route} --type dev.knative.sources.ping --data \"$(cat examples/ping.json)\"\n"
             "    (from a pod, where the Route resolves; bind's answer is an event: func prints it)")
        done = func.invoke_from_a_pod(stack.cp, "invoke", "bind", "--target", route, "--type", "dev.knative.sources.ping",
                                      "--source", f"/apis/v1/namespaces/{NAMESPACE}/pingsources/resync",
                                      "--id", "demo-ping", "--data", ping)
        print(done.stdout, end="")
        capture = REPO / "tests" / "fixtures" / "sample-events" / "knative-v0.50.0" / "apiserversource-add-gpu-scheduler-check-0.json"
        captured = json.loads(capture.read_text())
        step(f"func invoke ... --type {captured['headers']['Ce-Type']} --data <the capture's pod>\n"
             f"    ({capture.relative_to(REPO)}: its pod lived in namespace capture, which this cluster does not have)")
        done = func.invoke_from_a_pod(stack.cp, "invoke", "bind", "--target", route, "--type", captured["headers"]["Ce-Type"],
                                      "--source", captured["headers"]["Ce-Source"], "--id", captured["headers"]["Ce-Id"],
                                      "--data", json.dumps(captured["body"]))
        print(done.stdout, end="")
        if done.returncode != 0:
            failure = f"func invoke failed: {done.stdout}"
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    return torn_down(nodes, processes, failure)


def main_knative_zero() -> int:
    """bind at zero on real Knative, the chart's Knative Services (make demo KNATIVE=1 ZERO=1)."""
    from . import kn, traefik

    step("Building what the stack runs, Knative, Traefik, kn and helm included, if it is not cached"
         " (first time: about 30 minutes)")
    ensure_built(stack_only=True)
    knative.ensure_built()
    traefik.ensure_built()
    kn.ensure_built()
    subprocess.run(["bash", str(REPO / "localcp" / "build-helm.sh")], check=True, stdout=subprocess.DEVNULL)
    step(f"Starting the control plane {KUBERNETES_VERSION} and node1..node4 (kubelet, containerd, kube-proxy, CoreDNS);\n"
         f"    Knative Eventing {knative.projects()[0].version} and Serving {knative.projects()[1].version} from their"
         " release configuration (localcp/knative.py);\n"
         f"    Traefik {traefik.version()} as Knative's networking layer (localcp/traefik.yaml; config-network's"
         " ingress-class);\n"
         "    then `helm install gpu-scheduler chart/gpu-scheduler --set runtime=knative -f localcp/knative-values.yaml"
         f" {' '.join(DEMO_ZERO_VALUES)}`")
    started = time.monotonic()
    failure = None
    with LocalStack(knative=True, knative_values=DEMO_ZERO_VALUES) as stack:
        shown_up(stack, started)
        print(f"    Knative installed and ready in {stack.knative_seconds:.1f}s, Traefik in {stack.traefik_seconds:.1f}s")
        for namespace in (*knative.NAMESPACES, traefik.NAMESPACE):
            step(f"kubectl get pods -n {namespace} -o wide   (Knative's components and its networking layer, as pods)")
            print(stack.cp.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout, end="")
        step(f"kubectl get kingress -n {NAMESPACE}   (the KIngresses Traefik reconciled, behind privtraefik)")
        print(stack.cp.kubectl("get", "ingresses.networking.internal.knative.dev", "-n", NAMESPACE, "-o",
                               "custom-columns=NAME:.metadata.name,CLASS:.metadata.annotations.networking\\.knative\\.dev/ingress\\.class,"
                               "READY:.status.conditions[?(@.type=='Ready')].status,"
                               "PRIVATE:.status.privateLoadBalancer.ingress[0].domainInternal").stdout, end="")
        shown_knative_listings(stack, "the chart's", "every 5 minutes at min-scale 0")
        step("Waiting for bind to scale to zero (min-scale 0, window 10 s): no bind pod at all, terminating ones included")
        began = time.monotonic()
        stack.wait_for(lambda: not bind_pods(stack), 300, "bind at zero", interval=1)
        print(f"    bind at zero {time.monotonic() - began:.0f}s after the release was ready")
        step(f"kubectl get pods -n {NAMESPACE} -l serving.knative.dev/service=bind   (bind's revision: 0 pods)")
        listed = stack.cp.kubectl("get", "pods", "-n", NAMESPACE, "-l", "serving.knative.dev/service=bind")
        print(listed.stdout or listed.stderr, end="")
        step(f"kubectl apply -f {SEED.relative_to(REPO)}   (5 replicas, bind at zero: the first add event,"
             " through Traefik and the activator, wakes it)")
        since = ("the apply", time.monotonic())
        print(stack.apply(seed(False)), end="")
        bound = bound_times(stack, "default", f"app={SEED_NAME}", 5, since[1])
        shown_running(stack, False, f"{SEED_NAME}-4", since)
        step("From zero: each replica bound (spec.nodeName set) this long after the apply, seen every 50 ms")
        for name, seconds in sorted(bound.items(), key=lambda item: item[1]):
            print(f"    {name}: {seconds:.2f}s")
        print(f"    the first pod bound {min(bound.values()):.2f}s after the apply, from zero (goal: within 2 s of its creation);"
              f" all five {max(bound.values()):.2f}s")
        step("gpu_scheduler_bind_events_total by type and status, from bind's /metrics   (the adapters' deliveries)")
        print("\n".join(bind_events(stack)))
        step("Waiting for bind back at zero: the 10 s window, Knative's 30 s scale-to-zero grace period, then"
             " queue-proxy's drain of the last pod")
        began = time.monotonic()
        try:
            stack.wait_for(lambda: not bind_pods(stack), 300, "bind back at zero", interval=1)
            print(f"    bind back at zero {time.monotonic() - began:.0f}s after the replicas ran")
        except TimeoutError as error:
            failure = str(error)
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    return torn_down(nodes, processes, failure)


# --workload: the examples users copy, run with the seed's check container.
EXAMPLES = REPO / "examples"
JOBSET_LABEL, LWS_LABEL = "jobset.sigs.k8s.io", "leaderworkerset.sigs.k8s.io"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
MAP_ANNOTATION = "gpu-scheduling-map"
JOB_COMPLETIONS = "gpu-scheduler/job-completions"
WORKLOADS = {  # --workload: (example, its kind, the label that names its pods' workload)
    "jobset": (EXAMPLES / "jobset-torchrun.yaml", "JobSet", f"{JOBSET_LABEL}/jobset-name"),
    "lws": (EXAMPLES / "lws-vllm.yaml", "LeaderWorkerSet", f"{LWS_LABEL}/name"),
    "deployment": (EXAMPLES / "deployment-vllm.yaml", "Deployment", "app"),  # a pool: no controller to run
}
LOG_LINE = re.compile(r"node=(\S+) CUDA_VISIBLE_DEVICES=(\S+)")


def example_workload(workload: str) -> dict:
    """The example's JobSet or LeaderWorkerSet document, as users copy it."""
    path, kind, _ = WORKLOADS[workload]
    [found] = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]
    return found


def pod_templates(manifest: dict) -> list[dict]:
    """The pod templates of a JobSet (one per replicated job), a LeaderWorkerSet (its leader's,
    if any, and its workers'), a Deployment or a Knative Service (spec.template)."""
    if manifest["kind"] in ("Deployment", "Service"):
        return [manifest["spec"]["template"]]
    if manifest["kind"] == "JobSet":
        return [job["template"]["spec"]["template"] for job in manifest["spec"]["replicatedJobs"]]
    template = manifest["spec"]["leaderWorkerTemplate"]
    return [template[key] for key in ("leaderTemplate", "workerTemplate") if key in template]


def demo_workload(workload: str) -> dict:
    """The example with each pod template's containers replaced by the seed's check container
    (the seed's image, command and security settings; no volumes, which only the example's
    containers mount); its metadata (map, annotations, labels) and schedulerName kept. A JobSet's
    pods keep restartPolicy Never: the check runs until the pod is deleted."""
    manifest = example_workload(workload)
    seed_spec = yaml.safe_load(SEED.read_text())["spec"]["template"]["spec"]
    for template in pod_templates(manifest):
        spec = template["spec"]
        kept = {key: spec[key] for key in ("schedulerName", "restartPolicy") if key in spec}
        template["spec"] = {**kept, "securityContext": seed_spec["securityContext"],
                            "terminationGracePeriodSeconds": seed_spec["terminationGracePeriodSeconds"],
                            "containers": seed_spec["containers"]}
        if manifest["kind"] == "JobSet":
            template["spec"]["restartPolicy"] = "Never"
    return manifest


def pod_count(manifest: dict) -> int:
    """The pods the workload creates: JobSet, Σ replicas × parallelism; LWS, replicas × size;
    Deployment, replicas."""
    if manifest["kind"] == "Deployment":
        return manifest["spec"].get("replicas", 1)
    if manifest["kind"] == "JobSet":
        return sum(job.get("replicas", 1) * job["template"]["spec"].get("parallelism", 1)
                   for job in manifest["spec"]["replicatedJobs"])
    return manifest["spec"].get("replicas", 1) * manifest["spec"]["leaderWorkerTemplate"].get("size", 1)


def expected_index(manifest: dict, pod: dict) -> int:
    """The pod's map index from its labels and the manifest, computed here as the example's
    comments say (not by gpu_scheduler.podindex, which the demo checks)."""
    labels = pod["metadata"]["labels"]
    if manifest["kind"] == "JobSet":
        replicated = labels[f"{JOBSET_LABEL}/replicatedjob-name"]
        [job] = [j for j in manifest["spec"]["replicatedJobs"] if j["name"] == replicated]
        return int(labels[f"{JOBSET_LABEL}/job-index"]) * job["template"]["spec"]["completions"] + int(
            labels[COMPLETION_INDEX])
    size = manifest["spec"]["leaderWorkerTemplate"]["size"]
    return int(labels[f"{LWS_LABEL}/group-index"]) * size + int(labels[f"{LWS_LABEL}/worker-index"])


def ran_workload(stack: LocalStack, workload: str, manifest: dict) -> str | None:
    """--workload after the apply: every pod Running, shown with its index, node and log line, and
    each checked against its map entry. None, or what failed."""
    name, count = manifest["metadata"]["name"], pod_count(manifest)
    selector = f"{WORKLOADS[workload][2]}={name}"
    started = time.monotonic()
    try:
        pods = stack.wait_for(lambda: (lambda pods: pods if len(pods) == count and all(
            p["status"].get("phase") == "Running" for p in pods) else None)(stack.pods("default", selector)),
            180, f"{count} pods of {manifest['kind']} {name} Running")
    except TimeoutError as failed:
        print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", selector).stdout, end="")
        return str(failed)
    print(f"    {count} Running {time.monotonic() - started:.1f}s after the apply")
    columns = ([f"{JOBSET_LABEL}/job-index", COMPLETION_INDEX] if workload == "jobset"
               else [f"{LWS_LABEL}/group-index", f"{LWS_LABEL}/worker-index"])
    step(f"kubectl get pod -o wide -l {selector} -L {','.join(columns)}   (the labels its controllers set)")
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", selector, "-L", ",".join(columns)).stdout, end="")
    rule = ("job-index × completions + completion index" if workload == "jobset"
            else "group-index × size + worker-index")
    step(f"Each pod: its index ({rule}), its map entry, its node and its log line (kubectl logs --tail=1)")
    wrong = []
    shown = []
    for pod in pods:
        pod_name, index = pod["metadata"]["name"], expected_index(manifest, pod)
        entry = parse_map(pod["metadata"]["annotations"][MAP_ANNOTATION]).get(index)
        line = stack.wait_for(lambda: stack.cp.kubectl("logs", pod_name, "--tail=1").stdout.strip(), 15,
                              f"{pod_name}'s log")
        written = pod["metadata"]["annotations"].get(JOB_COMPLETIONS)  # by mutate, on a JobSet's pods
        shown.append((index, pod_name, pod["spec"].get("nodeName"), entry, line,
                      f"  ({JOB_COMPLETIONS}: {written})" if workload == "jobset" else ""))
    for index, pod_name, node, entry, line, note in sorted(shown):
        want = f"{entry.node}:{entry.visible_devices}" if entry else "no entry"
        print(f"    {pod_name:<28} index {index}  entry {want:<12} node {node:<6} log: {line}{note}")
        logged = LOG_LINE.search(line)
        if entry is None:
            wrong.append(f"{pod_name}: index {index} has no map entry")
        elif node != entry.node or not logged or logged.groups() != (entry.node, entry.visible_devices):
            wrong.append(f"{pod_name} (index {index}): on {node}, logged {line!r}; its entry is"
                         f" {entry.node}:{entry.visible_devices}")
    indexes = sorted(s[0] for s in shown)
    if indexes != list(range(count)):
        wrong.append(f"the pods' indexes are {indexes}, not 0..{count - 1}")
    if not wrong:
        print(f"    all {count}: on their entry's node, CUDA_VISIBLE_DEVICES = their entry's devices")
    return "; ".join(wrong) or None


def torn_down(nodes, processes: list, failure: str | None) -> int:
    """After the `with LocalStack` block (`nodes`, `processes`: the stack's, taken inside it): 1
    if a process or anything of a node is left, or on `failure`; else 0."""
    left = [p.args[0] for p in processes if p.poll() is None]
    leftovers = nodes.leftovers()
    if left or leftovers:
        print(f"    still there: processes {left}; {leftovers}")
        return 1
    print("    done: no process, shim, mount, cgroup, network namespace or interface left")
    if failure:
        print(f"\nFAILED: {failure}", file=sys.stderr)
        return 1
    return 0


def main_workload(workload: str) -> int:
    """--workload jobset|lws."""
    path, kind, _ = WORKLOADS[workload]
    manifest = demo_workload(workload)
    step("Building what the stack runs if it is not cached (first time: about 6-10 minutes)")
    ensure_built(stack_only=True, workloads=(workload,))
    step(f"Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler {KUBERNETES_VERSION}; "
         f"node1..node4 (a kubelet and a containerd each);\n    the real {kind} controller and its webhooks; "
         "mutate (TLS, registered from knative/webhook.yaml), bind, and Knative's ApiServerSource receive adapter")
    started = time.monotonic()
    with LocalStack(real_nodes=True, workloads=(workload,)) as stack:
        print(f"    up in {time.monotonic() - started:.1f}s (the {kind} controller in"
              f" {stack.workloads.started_seconds:.1f}s); API server {stack.cp.server}")
        print("    " + "; ".join(stack.cp.versions()))
        print(stack.cp.kubectl("get", "nodes", "-o", "wide").stdout, end="")
        [shown_map] = {t["metadata"]["annotations"][MAP_ANNOTATION] for t in pod_templates(manifest)}
        step(f"kubectl apply -f {path.relative_to(REPO)}, its containers replaced by the seed's check container"
             f"\n    ({pod_count(manifest)} pods; the example's map, schedulerName and annotations kept):\n"
             + "".join(f"      {line}\n" for line in
                       shown_map.strip().splitlines()))
        print(stack.apply(manifest), end="")
        failure = ran_workload(stack, workload, manifest)
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    return torn_down(nodes, processes, failure)


# --workload deployment: examples/deployment-vllm.yaml, a pool: each pod takes a free entry.
ENTRY_ANNOTATION = "gpu-scheduler/entry"      # bind's Binding: the map index of the entry it chose
DEVICES_ANNOTATION = "gpu-scheduler/devices"  # bind's Binding: that entry's devices
TEMPLATE_HASH = "pod-template-hash"           # the Deployment controller's: one value per ReplicaSet
ROLLOUT = {"demo/rollout": "2"}               # the template change that rolls the Deployment
SHOWN_MESSAGES = 4                            # distinct FailedScheduling messages shown after the rollout


class SharedEntry(Exception):
    """Two live pods of the Deployment hold one entry."""


def live(pod: dict) -> bool:
    """Not ended (Succeeded, Failed): the pod holds its entry, while it is being deleted too (its
    containers may still run on the entry's GPUs until it is gone: bind holds the entry as long)."""
    return pod["status"].get("phase") not in ("Succeeded", "Failed")


def entry_of(pod: dict) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(ENTRY_ANNOTATION)


def check_entries(pods: list[dict]) -> None:
    """Raises SharedEntry if two live pods (being deleted or not) hold one entry."""
    holders: dict[str, list[str]] = {}
    for pod in pods:
        if live(pod) and entry_of(pod) is not None:
            terminating = " (terminating)" if pod["metadata"].get("deletionTimestamp") else ""
            holders.setdefault(entry_of(pod), []).append(pod["metadata"]["name"] + terminating)
    shared = [f"entry {entry} held by {' and '.join(sorted(names))}"
              for entry, names in sorted(holders.items()) if len(names) > 1]
    if shared:
        raise SharedEntry("; ".join(shared))


def pool_table(stack: LocalStack, pods: list[dict]) -> list[str]:
    """Prints a row per pod: its name, the entry bind gave it, its node, its devices (bind's
    annotations) and its log line. Returns what is wrong: a log line whose CUDA_VISIBLE_DEVICES is
    not the devices annotation, or a pod not where its entry of the map says."""
    rows, wrong = [], []
    for pod in pods:
        name, annotations = pod["metadata"]["name"], pod["metadata"].get("annotations") or {}
        line = stack.wait_for(lambda: stack.cp.kubectl("logs", name, "--tail=1").stdout.strip(), 15, f"{name}'s log")
        entry = entry_of(pod)
        rows.append((int(entry) if entry and entry.isdigit() else -1, name, entry, pod["spec"].get("nodeName"),
                     annotations.get(DEVICES_ANNOTATION), line, annotations.get(MAP_ANNOTATION, "")))
    print(f"    {'POD':<24} {'ENTRY':<6} {'NODE':<6} {'DEVICES':<8} LOG")
    for _, name, entry, node, devices, line, text in sorted(rows):
        print(f"    {name:<24} {entry or '-':<6} {node or '-':<6} {devices or '-':<8} {line}")
        logged = LOG_LINE.search(line)
        if entry is None or devices is None:
            wrong.append(f"{name} on {node}: no {ENTRY_ANNOTATION} or {DEVICES_ANNOTATION} annotation (bound"
                         " without an entry of the pool?)")
            continue
        if not logged or logged.groups() != (node, devices):
            wrong.append(f"{name}: its log line says {logged.group(0) if logged else repr(line)}; it is on {node},"
                         f" its {DEVICES_ANNOTATION} annotation {devices}")
        placement = parse_map(text).get(int(entry)) if entry.isdigit() else None
        if placement is None or (placement.node, placement.visible_devices) != (node, devices):
            want = f"{placement.node}:{placement.visible_devices}" if placement else "no such entry"
            wrong.append(f"{name}: entry {entry} of its map is {want}; the pod is on {node} with devices {devices}")
    return wrong


def ran_pool(stack: LocalStack, manifest: dict, selector: str) -> str | None:
    """--workload deployment after the apply: the pods Running, shown; the rollout; the new pods
    Running and the old ones gone, shown. None, or what failed."""
    name, count = manifest["metadata"]["name"], pod_count(manifest)

    def settled(old_hashes: set[str]):
        """The `count` pods, all Running, none being deleted, none of a ReplicaSet of old_hashes."""
        pods = stack.pods("default", selector)
        check_entries(pods)
        if any(p["metadata"].get("labels", {}).get(TEMPLATE_HASH) in old_hashes for p in pods):
            return None
        if len(pods) != count or not all(p["status"].get("phase") == "Running" and not p["metadata"].get(
                "deletionTimestamp") for p in pods):
            return None
        return pods

    def waited(what: str, old_hashes: set[str], timeout: float) -> tuple[list[dict] | None, str | None]:
        try:
            return stack.wait_for(lambda: settled(old_hashes), timeout, what), None
        except SharedEntry as shared:
            failure = f"two pods of Deployment {name} hold one entry at once: {shared}"
        except TimeoutError as failed:
            failure = str(failed)
        print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", selector, "-L", TEMPLATE_HASH).stdout, end="")
        for message in waiting_messages(stack, name):
            print(f"    FailedScheduling: {message}")
        return None, failure

    started = time.monotonic()
    pods, failure = waited(f"the {count} pods of Deployment {name} Running", set(), 180)
    if failure:
        return failure
    print(f"    {count} Running {time.monotonic() - started:.1f}s after the apply")
    step(f"kubectl get pod -o wide -l {selector} -L {TEMPLATE_HASH}")
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", selector, "-L", TEMPLATE_HASH).stdout, end="")
    step(f"Each pod: the entry bind chose ({ENTRY_ANNOTATION}), its node, its devices ({DEVICES_ANNOTATION},"
         " which CUDA_VISIBLE_DEVICES\n    reads through the downward API) and its log line (kubectl logs --tail=1)")
    wrong = pool_table(stack, pods)
    if wrong:
        return "; ".join(wrong)
    old_hashes = {p["metadata"]["labels"][TEMPLATE_HASH] for p in pods}
    step(f"kubectl patch deployment {name}: template annotation {json.dumps(ROLLOUT)}   (a rollout: a new"
         f" ReplicaSet;\n    maxSurge 0, maxUnavailable 1: an old pod leaves, freeing its entry, before each"
         " new one is created)")
    rolled = time.monotonic()
    patch = {"spec": {"template": {"metadata": {"annotations": ROLLOUT}}}}
    print(stack.cp.kubectl("patch", "deployment", name, "--type", "merge", "-p", json.dumps(patch)).stdout, end="")
    pods, failure = waited(f"the new ReplicaSet's {count} pods Running and the old ones gone", old_hashes, 300)
    if failure:
        return failure
    print(f"    rolled out {time.monotonic() - rolled:.1f}s after the patch: {count} new pods Running, the old"
          f" ReplicaSet's {count} gone")
    messages = waiting_messages(stack, name)
    step("bind's FailedScheduling Events for the Deployment's pods (a new pod waiting for its entry's old holder"
         " to be gone)")
    print("".join(f"    {message}\n" for message in messages[:SHOWN_MESSAGES]) or "    none\n", end="")
    if len(messages) > SHOWN_MESSAGES:
        print(f"    ... and {len(messages) - SHOWN_MESSAGES} more")
    step(f"kubectl get pod -o wide -l {selector} -L {TEMPLATE_HASH}   (only the new ReplicaSet's)")
    print(stack.cp.kubectl("get", "pod", "-o", "wide", "-l", selector, "-L", TEMPLATE_HASH).stdout, end="")
    step("Each new pod: its entry, node, devices and log line")
    wrong = pool_table(stack, pods)
    if not wrong:
        print(f"    all {count}: one entry each, CUDA_VISIBLE_DEVICES = {DEVICES_ANNOTATION} = their entry's devices")
    return "; ".join(wrong) or None


def waiting_messages(stack: LocalStack, name: str) -> list[str]:
    """The distinct messages of the FailedScheduling Events of the Deployment's pods (named
    <name>-<hash>-<suffix>), oldest first."""
    query = "fieldSelector=reason%3DFailedScheduling,involvedObject.kind%3DPod"
    events = json.loads(stack.cp.get(f"/api/v1/namespaces/default/events?{query}"))["items"]
    ours = sorted((e for e in events if e["involvedObject"]["name"].startswith(f"{name}-")),
                  key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")
    return list(dict.fromkeys(e["message"] for e in ours))


def main_deployment() -> int:
    """--workload deployment."""
    path, _, label = WORKLOADS["deployment"]
    manifest = demo_workload("deployment")
    selector = f"{label}={manifest['metadata']['name']}"
    step("Building what the stack runs if it is not cached (first time: about 6-10 minutes)")
    ensure_built(stack_only=True)
    step(f"Starting etcd, kube-apiserver, kube-controller-manager (its Deployment controller), kube-scheduler"
         f" {KUBERNETES_VERSION};\n    node1..node4 (a kubelet and a containerd each); "
         "mutate (TLS, registered from knative/webhook.yaml), bind, and Knative's ApiServerSource receive adapter")
    started = time.monotonic()
    with LocalStack(real_nodes=True) as stack:
        shown_up(stack, started)
        [shown_map] = {t["metadata"]["annotations"][MAP_ANNOTATION] for t in pod_templates(manifest)}
        strategy = manifest["spec"]["strategy"]["rollingUpdate"]
        step(f"kubectl apply -f {path.relative_to(REPO)}, its containers replaced by the seed's check container\n"
             f"    ({pod_count(manifest)} replicas, no index: each takes a free entry of the pool; maxSurge"
             f" {strategy['maxSurge']}, maxUnavailable {strategy['maxUnavailable']}; the example's map):\n"
             + "".join(f"      {line}\n" for line in shown_map.strip().splitlines()))
        print(stack.apply(manifest), end="")
        failure = ran_pool(stack, manifest, selector)
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    return torn_down(nodes, processes, failure)


# --workload kueue: examples/kueue/, two pinned Indexed Jobs through one ClusterQueue of 8 GPUs.
KUEUE_EXAMPLES = EXAMPLES / "kueue"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
KUEUE_NAMESPACE = "team"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
FIRST, SECOND = "train-a", "train-b"


def kueue_documents() -> tuple[list[dict], dict]:
    """examples/kueue/queues.yaml's documents (the LocalQueue in KUEUE_NAMESPACE) and its job."""
    queues = [d for d in yaml.safe_load_all((KUEUE_EXAMPLES / "queues.yaml").read_text()) if d]
    for document in queues:
        if document["kind"] == "LocalQueue":
            document["metadata"]["namespace"] = KUEUE_NAMESPACE
    [job] = [d for d in yaml.safe_load_all((KUEUE_EXAMPLES / "job.yaml").read_text()) if d]
    return queues, job


def kueue_job(name: str, devices: str) -> dict:
    """examples/kueue/job.yaml named `name` in KUEUE_NAMESPACE, its containers the seed's check
    container, each entry's devices `devices` (the example's are 0,1)."""
    _, job = kueue_documents()
    job["metadata"].update(name=name, namespace=KUEUE_NAMESPACE)
    template = job["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    annotations[MAP_ANNOTATION] = annotations[MAP_ANNOTATION].replace(":0,1\n", f":{devices}\n")
    seed_spec = yaml.safe_load(SEED.read_text())["spec"]["template"]["spec"]
    spec = template["spec"]
    template["spec"] = {"schedulerName": spec["schedulerName"], "restartPolicy": spec["restartPolicy"],
                        "securityContext": seed_spec["securityContext"],
                        "terminationGracePeriodSeconds": seed_spec["terminationGracePeriodSeconds"],
                        "containers": seed_spec["containers"]}
    return job


def condition_of(obj: dict | None, kind: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def workload_of(stack: LocalStack, job: str) -> dict | None:
    """The Workload Kueue made for Job `job` (its owner)."""
    listing = json.loads(stack.cp.get(f"{KUEUE_API}/namespaces/{KUEUE_NAMESPACE}/workloads"))["items"]
    return next((w for w in listing if any(o["kind"] == "Job" and o["name"] == job
                                           for o in w["metadata"].get("ownerReferences") or [])), None)


def get_job(stack: LocalStack, name: str) -> dict:
    return json.loads(stack.cp.get(f"/apis/batch/v1/namespaces/{KUEUE_NAMESPACE}/jobs/{name}"))


class RanEarly(Exception):
    """A pod of the second job exists while the first holds the queue's 8 GPUs."""


def kueue_running(stack: LocalStack, job: dict, since: tuple[str, float]) -> tuple[list[dict], str | None]:
    """Waits for the job's 4 pods Running, then shows them: node, map entry, log line. since:
    (what, when) the time to Running is counted from. (pods, None) or (pods, what is wrong)."""
    name, count = job["metadata"]["name"], job["spec"]["parallelism"]
    selector = f"{JOB_NAME_LABEL}={name}"

    def up():
        pods = stack.pods(KUEUE_NAMESPACE, selector)
        return pods if len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods) else None
    pods = stack.wait_for(up, 180, f"the {count} pods of Job {name} Running")
    print(f"    Job {name}'s {count} pods Running {time.monotonic() - since[1]:.1f}s after {since[0]}")
    step(f"kubectl -n {KUEUE_NAMESPACE} get pod -o wide -l {selector} -L {COMPLETION_INDEX}")
    print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "get", "pod", "-o", "wide", "-l", selector,
                           "-L", COMPLETION_INDEX).stdout, end="")
    step("Each pod: its completion index, its map entry, its requests (mutate's), its node and its log line")
    wrong = []
    for pod in sorted(pods, key=lambda p: int(p["metadata"]["labels"][COMPLETION_INDEX])):
        pod_name, index = pod["metadata"]["name"], int(pod["metadata"]["labels"][COMPLETION_INDEX])
        entry = parse_map(pod["metadata"]["annotations"][MAP_ANNOTATION]).get(index)
        line = stack.wait_for(lambda: stack.cp.kubectl("-n", KUEUE_NAMESPACE, "logs", pod_name,
                                                       "--tail=1").stdout.strip(), 15, f"{pod_name}'s log")
        gpus = pod["spec"]["containers"][0].get("resources", {}).get("requests", {}).get("gpu-scheduler.io/gpu")
        node = pod["spec"].get("nodeName")
        want = f"{entry.node}:{entry.visible_devices}" if entry else "no entry"
        print(f"    {pod_name:<16} index {index}  entry {want:<10} gpu-scheduler.io/gpu {gpus}  node {node:<6}"
              f" log: {line}")
        logged = LOG_LINE.search(line)
        if entry is None or node != entry.node or not logged or logged.groups() != (entry.node, entry.visible_devices):
            wrong.append(f"{pod_name} (index {index}): on {node}, logged {line!r}; its entry is {want}")
    return pods, "; ".join(wrong) or None


def kueue_demo(stack: LocalStack) -> str | None:
    """--workload kueue on a running stack. None, or what failed."""
    queues, _ = kueue_documents()
    first, second = kueue_job(FIRST, "0,1"), kueue_job(SECOND, "2,3")
    step(f"kubectl create namespace {KUEUE_NAMESPACE} (labelled {KUEUE_NAMESPACE_LABEL}: the namespaces this"
         f" stack's Kueue manages);\n    kubectl apply -f examples/kueue/queues.yaml   (ResourceFlavor, ClusterQueue"
         f" gpus: gpu-scheduler.io/gpu 8; LocalQueue team)")
    stack.create_namespace(KUEUE_NAMESPACE, labels=KUEUE_NAMESPACE_LABEL)
    for document in queues:
        print(stack.apply(document), end="")
    stack.wait_for(lambda: condition_of(json.loads(stack.cp.get(f"{KUEUE_API}/clusterqueues/gpus")),
                                        "Active").get("status") == "True", 60, "ClusterQueue gpus Active")
    step(f"kubectl apply: Job {FIRST} (examples/kueue/job.yaml, the check container): 4 pods × 2 GPUs, map\n"
         + "".join(f"      {line}\n" for line in first["spec"]["template"]["metadata"]["annotations"][MAP_ANNOTATION]
                   .strip().splitlines()))
    applied = time.monotonic()
    print(stack.apply(first), end="")
    template = get_job(stack, FIRST)["spec"]["template"]
    step(f"What mutate wrote on Job {FIRST}'s template (Kueue counts templates × pods)")
    print(f"    requests {json.dumps(template['spec']['containers'][0]['resources']['requests'])}")
    print(f"    annotation gpu-scheduler/template-counts: "
          f"{template['metadata']['annotations'].get('gpu-scheduler/template-counts')}")
    try:
        _, wrong = kueue_running(stack, first, ("the apply", applied))
    except TimeoutError as failed:
        print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "get", "workloads,jobs,pods", "-o", "wide").stdout, end="")
        return str(failed)
    if wrong:
        return wrong
    step(f"kubectl apply: Job {SECOND}, the same but GPUs 2,3 of each node (free: only the queue can hold it back)")
    print(stack.apply(second), end="")

    def ran_early():
        early = stack.pods(KUEUE_NAMESPACE, f"{JOB_NAME_LABEL}={SECOND}")
        if early:
            raise RanEarly(", ".join(p["metadata"]["name"] for p in early))

    def pending():
        ran_early()
        workload = workload_of(stack, SECOND)
        reserved = condition_of(workload, "QuotaReserved")
        return (workload, reserved) if reserved.get("status") == "False" and reserved.get("reason") == "Pending" else None
    try:
        workload, reserved = stack.wait_for(pending, 60, f"the Workload of Job {SECOND} Pending")
        time.sleep(5)  # and still held back a while later
        ran_early()
    except RanEarly as early:
        return f"pods of Job {SECOND} exist while Job {FIRST} holds the queue's 8 GPUs: {early}"
    except TimeoutError as failed:
        print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "get", "workloads,jobs,pods", "-o", "wide").stdout, end="")
        return str(failed)
    step(f"kubectl -n {KUEUE_NAMESPACE} get workloads,jobs,pods   ({SECOND}: Workload pending, Job suspended, no pod)")
    print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "get", "workloads,jobs,pods").stdout, end="")
    print(f"    Workload {workload['metadata']['name']}: QuotaReserved {reserved['status']} ({reserved['reason']}):"
          f" {reserved['message']}")
    print(f"    Job {SECOND}: suspend {get_job(stack, SECOND)['spec'].get('suspend')}")
    usage = json.loads(stack.cp.get(f"{KUEUE_API}/clusterqueues/gpus")).get("status", {})
    reserved_gpus = [r["total"] for f in usage.get("flavorsReservation") or [] for r in f["resources"]
                     if r["name"] == "gpu-scheduler.io/gpu"]
    print(f"    ClusterQueue gpus: gpu-scheduler.io/gpu reserved {'+'.join(reserved_gpus) or 0} of 8;"
          f" workloads admitted {usage.get('admittedWorkloads')}, pending {usage.get('pendingWorkloads')}")
    step(f"kubectl -n {KUEUE_NAMESPACE} delete job {FIRST}   (its 8 GPUs back to the queue)")
    deleted = time.monotonic()
    print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "delete", "job", FIRST, "--wait=false").stdout, end="")
    try:
        _, wrong = kueue_running(stack, second, (f"Job {FIRST}'s deletion", deleted))
    except TimeoutError as failed:
        print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "get", "workloads,jobs,pods", "-o", "wide").stdout, end="")
        return str(failed)
    step(f"kubectl -n {KUEUE_NAMESPACE} get workloads")
    print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "get", "workloads").stdout, end="")
    print(stack.cp.kubectl("-n", KUEUE_NAMESPACE, "delete", "job", SECOND, "--wait=false").stdout, end="")
    return wrong


def main_kueue() -> int:
    """--workload kueue."""
    step("Building what the stack runs if it is not cached (first time: about 6-10 minutes)")
    ensure_built(stack_only=True, workloads=("kueue",))
    step(f"Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler {KUBERNETES_VERSION}; "
         "node1..node4 (a kubelet and a containerd each);\n    the real Kueue and its webhooks; "
         "mutate (TLS, registered from knative/webhook.yaml), bind, and Knative's ApiServerSource receive adapter")
    started = time.monotonic()
    with LocalStack(real_nodes=True, workloads=("kueue",)) as stack:
        print(f"    up in {time.monotonic() - started:.1f}s (Kueue in {stack.workloads.started_seconds:.1f}s);"
              f" API server {stack.cp.server}")
        print("    " + "; ".join(stack.cp.versions()))
        print(stack.cp.kubectl("get", "nodes", "-o", "wide").stdout, end="")
        failure = kueue_demo(stack)
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    return torn_down(nodes, processes, failure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcp.demo", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dra", action="store_true", help="the seed in DRA mode, through the DRA test driver")
    mode.add_argument("--gang", action="store_true",
                      help="the seed as a gang: blocked whole by a workload holding node4's GPU 3, then placed whole")
    mode.add_argument("--preempt", action="store_true",
                      help="the seed at high priority preempts a low-priority workload holding node4's GPU 3")
    mode.add_argument("--knative", action="store_true",
                      help="the seed on real Knative Eventing and Serving: the chart for everything but bind and"
                           " mutate, func deploy for those, kn's listings, func invoke with the captured events")
    parser.add_argument("--zero", action="store_true",
                        help="with --knative: the chart's Knative Services with bind at min-scale 0, scaled to"
                             " zero and woken by the seed")
    mode.add_argument("--workload", choices=sorted([*WORKLOADS, "kueue"]),
                      help="instead of the seed, the example JobSet (examples/jobset-torchrun.yaml) or"
                           " LeaderWorkerSet (examples/lws-vllm.yaml), run by its real controller; deployment:"
                           " the example Deployment (examples/deployment-vllm.yaml), a pool, placed and then"
                           " rolled; kueue: two pinned Jobs (examples/kueue/) through one ClusterQueue of 8 GPUs")
    args = parser.parse_args(argv)
    if args.dra and not DRA_SERVED:
        parser.error(f"DRA mode needs resource.k8s.io/v1, served from Kubernetes 1.34: the stack's version is"
                     f" {KUBERNETES_VERSION} (GPU_SCHEDULER_K8S, make K8S=)")
    if args.zero and not args.knative:
        parser.error("--zero goes with --knative")
    if args.knative:
        return main_knative_zero() if args.zero else main_knative()
    if args.workload == "kueue":
        return main_kueue()
    if args.workload == "deployment":
        return main_deployment()
    if args.workload:
        return main_workload(args.workload)
    failure = None
    step("Building what the stack runs if it is not cached (first time: about 6-10 minutes)")
    ensure_built(stack_only=True)
    step(f"Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler {KUBERNETES_VERSION}; "
         "node1..node4 (a kubelet and a containerd each);\n"
         "    mutate (TLS, registered from knative/webhook.yaml), bind, and Knative's ApiServerSource receive adapter")
    started = time.monotonic()
    with LocalStack(real_nodes=True) as stack:
        shown_up(stack, started)
        step(f"kubectl gpu-scheduler suggest -f {SEED.relative_to(REPO)} --gpus 2   (a map from the nodes as they"
             " are, before the seed:\n    each replica 2 GPUs on one node, one replica per node first; the seed"
             " is applied with its own map)")
        print(suggested(stack), end="")
        if args.dra:
            step(f"kubectl apply -f {SEED.relative_to(REPO)} in DRA mode: annotations {DRA_CHANGES},"
                 f"\n    map entry {DRA_INDEX_4[0]} -> {DRA_INDEX_4[1]} (a device belongs to one claim)")
            print(stack.cp.kubectl("get", "resourceslices", "-o", "custom-columns=SLICE:.metadata.name,"
                                   "NODE:.spec.nodeName,DRIVER:.spec.driver,DEVICES:.spec.devices[*].name").stdout,
                  end="")
        elif not args.gang and not args.preempt:
            step(f"kubectl apply -f {SEED.relative_to(REPO)}   (5 replicas, the seed map; unchanged)")
        if args.gang:
            failure = blocked_gang(stack)
            since = ("the holder's deletion", time.monotonic())
        elif args.preempt:
            since = ("the apply", time.monotonic())
            failure = preempted(stack)
        else:
            since = ("the apply", time.monotonic())
            print(stack.apply(seed(args.dra)), end="")
        if not failure:
            shown_running(stack, args.dra, f"{SEED_NAME}-3" if args.gang or args.preempt else f"{SEED_NAME}-4", since)
        if not failure and args.preempt:
            failure = holder_waits(stack)
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    return torn_down(nodes, processes, failure)


if __name__ == "__main__":
    sys.exit(main())
