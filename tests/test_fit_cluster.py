"""Fit and GPU accounting on the real control plane: what bind now refuses, and kube-scheduler (the stack's)
asked the same fit questions side by side.

Each test has a node of its own (`fit_node`, a Node object kept Ready by the test, with small
allocatable amounts), so filler pods never touch the shared node1..node4. Pods bound to it stay
Pending (no kubelet) and count as kube-scheduler counts them: non-terminal, on the node."""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.error

import pytest

from conftest import FunctionServer
from decide import problem as fit_problem
from gpu_scheduler.fit import DEVICES_ANNOTATION
from gpu_scheduler.plugins.nodeports import PORTS_REASON
from gpu_scheduler.schedmap import Placement
from localcp.cluster import now
from test_end_to_end import pod_manifest, statefulset
from test_faults import post_event
from test_scheduler_contract import events_for, wait_event

ALLOCATABLE = {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi", "pods": "8", "nvidia.com/gpu": "4",
               "example.com/fpga": "2"}


def _ready() -> list[dict]:
    stamp = now()
    return [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test heartbeat",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]


@pytest.fixture
def fit_node(stack, namespace):
    """A Ready, untainted node of the test's own: labels zone=a, gen=3; 4 cpu, 8 pods, 4 GPUs."""
    name = f"fit-{namespace}"[:60].rstrip("-")
    stack.cp.request("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": "a", "gen": "3"}},
        "status": {"capacity": ALLOCATABLE, "allocatable": ALLOCATABLE, "conditions": _ready()}})
    stop = threading.Event()

    def beat():
        while not stop.wait(5):
            try:
                stack.cp.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": _ready()}},
                                 "application/strategic-merge-patch+json")
            except (OSError, urllib.error.HTTPError):
                pass
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    # The API server taints a new node not-ready until the node-lifecycle controller sees it Ready.
    stack.wait_for(lambda: not json.loads(stack.cp.get(f"/api/v1/nodes/{name}"))["spec"].get("taints"),
                   60, f"node {name} untainted", interval=0.5)
    yield name
    stop.set()
    stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False)
    stack.cp.kubectl("delete", "node", name, "--ignore-not-found")


def resources(pod: dict, requests: dict) -> dict:
    pod["spec"]["containers"][0]["resources"] = {"requests": requests}
    return pod


def filler(namespace: str, node: str, name: str = "filler", **requests) -> dict:
    """A pod put on the node directly (spec.nodeName, no scheduler), as a DaemonSet's would be."""
    body = pod_manifest(namespace, name, None, scheduler="default-scheduler")
    body["spec"]["nodeName"] = node
    return resources(body, requests) if requests else body


def force_delete(stack, namespace: str, *names: str) -> None:
    stack.cp.kubectl("delete", "pod", "-n", namespace, "--grace-period=0", "--force", *names)


def pod_named(stack, namespace, name) -> dict:
    return next(p for p in stack.pods(namespace) if p["metadata"]["name"] == name)


def bound_after_resync(stack, namespace, name, node):
    stack.wait_for(lambda: stack.ping()["outcomes"].get("Bound"), 20, f"a resync that binds {name}", interval=1)
    assert pod_named(stack, namespace, name)["spec"]["nodeName"] == node


# -- what bind now refuses -------------------------------------------------------------------------
def test_a_replica_waits_for_the_cpu_a_filler_holds_and_is_bound_once_it_is_gone(stack, namespace, fit_node):
    stack.apply(filler(namespace, fit_node, cpu="3500m"))
    stack.apply(resources(pod_manifest(namespace, "w-0", f"0={fit_node}:0\n"), {"cpu": "1"}))
    (event,) = wait_event(stack, namespace, "w-0", "FailedScheduling")
    assert event.message.startswith(f"node {fit_node}: Insufficient cpu (the pod requests 1; 3500m of 4")
    assert not pod_named(stack, namespace, "w-0")["spec"].get("nodeName")
    force_delete(stack, namespace, "filler")
    bound_after_resync(stack, namespace, "w-0", fit_node)


def test_a_node_selector_that_contradicts_the_map_is_warned_at_admission_and_unschedulable(stack, namespace, fit_node):
    manifest = pod_manifest(namespace, "w-0", f"0={fit_node}:0\n")
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node1"}
    result = stack.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    assert "node(s) didn't match Pod's node affinity/selector" in result.stderr  # the admission warning
    (event,) = wait_event(stack, namespace, "w-0", "FailedScheduling")
    assert event.message == (f"node(s) didn't match Pod's node affinity/selector: nodeSelector "
                             f"{{kubernetes.io/hostname=node1}} excludes node {fit_node}")
    # A selector on a label the name does not tell is only known at bind: no warning, same reason.
    manifest = pod_manifest(namespace, "v-0", f"0={fit_node}:1\n")
    manifest["spec"]["nodeSelector"] = {"zone": "b"}
    assert "affinity" not in stack.cp.kubectl("apply", "-f", "-", input=json.dumps(manifest)).stderr
    (event,) = wait_event(stack, namespace, "v-0", "FailedScheduling")
    assert "nodeSelector {zone=b} excludes node" in event.message


def test_a_host_port_held_on_the_node_keeps_the_replica_pending(stack, namespace, fit_node):
    holder = filler(namespace, fit_node, "holder")
    holder["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    stack.apply(holder)
    manifest = pod_manifest(namespace, "w-0", f"0={fit_node}:0\n")
    manifest["spec"]["containers"][0]["ports"] = [{"containerPort": 8000, "hostPort": 8080}]
    stack.apply(manifest)
    (event,) = wait_event(stack, namespace, "w-0", "FailedScheduling")
    assert event.message == f"{PORTS_REASON}: hostPort 8080/TCP is held by {namespace}/holder"


def test_a_gpu_held_by_another_statefulset_names_the_holder_until_it_is_gone(stack, namespace, fit_node):
    stack.apply(statefulset(namespace, f"0={fit_node}:3\n", replicas=1, name="team-a"))
    [holder] = stack.wait_bound(namespace, 1, "app=team-a")
    assert holder["metadata"]["annotations"][DEVICES_ANNOTATION] == "3"  # recorded with the Binding
    stack.apply(statefulset(namespace, f"0={fit_node}:2,3\n", replicas=1, name="team-b"))
    (event,) = wait_event(stack, namespace, "team-b-0", "FailedScheduling")
    assert event.message.startswith(f"GPU 3 on {fit_node} is held by {namespace}/team-a-0")
    cond = next(c for c in pod_named(stack, namespace, "team-b-0")["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["reason"] == "Unschedulable" and "held by" in cond["message"]
    stack.cp.kubectl("delete", "statefulset", "-n", namespace, "team-a", "--cascade=orphan")
    force_delete(stack, namespace, "team-a-0")
    bound_after_resync(stack, namespace, "team-b-0", fit_node)


def test_a_holder_that_finishes_frees_its_gpu_through_the_watch(stack, namespace, fit_node):
    """bind watches only pods that are not terminal (as kube-scheduler's pod informer does): a
    holder whose phase becomes Succeeded leaves the selection, which the watch says as a DELETED
    event; its GPU is free and the pod waiting for it is bound, without a ping."""
    stack.apply(pod_manifest(namespace, "holder-0", f"0={fit_node}:3\n"))
    stack.wait_bound(namespace, 1)
    stack.apply(pod_manifest(namespace, "waiter-0", f"0={fit_node}:2,3\n"))  # another map: another workload
    (event,) = wait_event(stack, namespace, "waiter-0", "FailedScheduling")
    assert "held by" in event.message
    stack.api.patch_namespaced_pod_status("holder-0", namespace, {"status": {"phase": "Succeeded"}})
    stack.wait_for(lambda: pod_named(stack, namespace, "waiter-0")["spec"].get("nodeName") == fit_node, 30,
                   "the waiter bound once the holder finished")


def test_replicas_of_one_statefulset_still_share_their_gpu(stack, namespace, fit_node):
    stack.apply(statefulset(namespace, f"0={fit_node}:1\n1={fit_node}:1\n", replicas=2, name="shared"))
    pods = stack.wait_bound(namespace, 2, "app=shared")
    assert {p["spec"]["nodeName"] for p in pods} == {fit_node}
    assert events_for(stack, namespace, "shared-1", "FailedScheduling") == []


def test_two_workloads_that_opt_in_share_a_gpu(stack, namespace, fit_node):
    for name in ("left", "right"):
        manifest = pod_manifest(namespace, name, f"0={fit_node}:0\n")
        manifest["metadata"]["labels"] = {"apps.kubernetes.io/pod-index": "0"}
        manifest["metadata"]["annotations"]["gpu-scheduler/share-gpus"] = "true"
        stack.apply(manifest)
    assert {p["spec"]["nodeName"] for p in stack.wait_bound(namespace, 2)} == {fit_node}


def test_two_bind_instances_racing_for_one_gpu(stack, namespace, fit_node):
    """Two workloads' pods want GPU 1. bind's own watch places one; the other waits, and a second
    instance that gets its event (it has never seen the first pod's) refuses it too, naming the
    holder: the device record in the API server says who has the GPU."""
    stack.source.paused = True
    try:
        for name, devices in (("first-0", "1"), ("second-0", "1,2")):  # two bare pods, two maps: two workloads
            stack.apply(pod_manifest(namespace, name, f"0={fit_node}:{devices}\n"))
        stack.wait_for(lambda: len(stack.pods(namespace)) == 2, 20, "2 pods created")
        [winner] = stack.wait_for(lambda: [p["metadata"]["name"] for p in stack.pods(namespace)
                                           if p["spec"].get("nodeName")], 20, "one pod bound")
        loser = ({"first-0", "second-0"} - {winner}).pop()
        second = FunctionServer("bind", {"KUBECONFIG": str(stack.bind_kubeconfig)})
        try:
            stack.wait_for(lambda: second.get("/health/readiness")[0] == 200, 30, "the second instance ready")
            status, body = post_event(second.url, pod_named(stack, namespace, loser), stack.cp.server)
        finally:
            second.stop()
    finally:
        stack.source.paused = False
    assert (status, body["result"]) == (200, "Unschedulable"), body
    assert body["message"].startswith(f"GPU 1 on {fit_node} is ") and f"{namespace}/{winner}" in body["message"]
    time.sleep(1)
    assert not pod_named(stack, namespace, loser)["spec"].get("nodeName")


def test_a_forged_event_binds_a_pod_only_where_its_live_map_says(stack, namespace, fit_node):
    """Anyone who reaches bind can post an event: one carrying a real pending pod's name and UID
    with another map. bind places the pod where the live pod's map says, or not at all; and a
    pod already bound stays where it is."""
    stack.source.paused = True  # only the forged events reach bind
    try:
        stack.apply(pod_manifest(namespace, "victim-0", "0=no-such-node:0\n"))
        stack.wait_for(lambda: stack.pods(namespace), 20, "the pod created")
        forged = json.loads(json.dumps(pod_named(stack, namespace, "victim-0")))
        forged["metadata"]["annotations"]["gpu-scheduling-map"] = f"0={fit_node}:0\n"
        status, body = post_event(stack.bind_url, forged, stack.cp.server)
        assert (status, body["result"]) == (200, "Unschedulable") and "no-such-node does not exist" in body["message"]
        assert not pod_named(stack, namespace, "victim-0")["spec"].get("nodeName")
        # The forged map is the live one once the owner says so: then, and only then, it binds
        # (bind's watch sees the change and places it, with or without the event).
        stack.cp.kubectl("annotate", "pod", "-n", namespace, "victim-0", "--overwrite",
                         f"gpu-scheduling-map=0={fit_node}:0")
        status, body = post_event(stack.bind_url, forged, stack.cp.server)
        assert status == 200 and body["result"] in ("Bound", "AlreadyBound") and body["node"] == fit_node, body
        forged["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:0\n"
        status, body = post_event(stack.bind_url, forged, stack.cp.server)
        assert (status, body["result"], body["node"]) == (200, "AlreadyBound", fit_node)
    finally:
        stack.source.paused = False


# -- kube-scheduler (the stack's version) answers the same questions -------------------------------------------------
def _case(rng: random.Random, fit_node: str) -> tuple[list[dict], dict]:
    """Pods already on the node and a candidate, drawn from the shapes the checks distinguish."""
    cpu = lambda: rng.choice(["100m", "500m", "1", "1500m", "2", "3"])  # noqa: E731

    def containers(kind: str) -> list[dict]:
        out = []
        for i in range(rng.randint(1, 2)):
            requests = {"cpu": cpu()}
            if rng.random() < 0.3:
                requests["memory"] = rng.choice(["1Gi", "4Gi", "6Gi"])
            if rng.random() < 0.2:
                requests["example.com/fpga"] = rng.choice(["1", "2"])
            container = {"name": f"{kind}{i}", "image": "busybox", "resources": {"requests": requests}}
            if "example.com/fpga" in requests:  # extended resources are not overcommitted: limit = request
                container["resources"]["limits"] = {"example.com/fpga": requests["example.com/fpga"]}
            if rng.random() < 0.25:
                container["ports"] = [{"containerPort": 80, "hostPort": rng.choice([8080, 8081]),
                                       "protocol": rng.choice(["TCP", "UDP"])}]
            out.append(container)
        return out

    def spec() -> dict:
        body = {"containers": containers("c")}
        if rng.random() < 0.4:
            init = containers("i")
            for container in init:
                if rng.random() < 0.5:
                    container["restartPolicy"] = "Always"
                else:
                    container.pop("ports", None)
            body["initContainers"] = init
        seen = set()  # one pod may not list a host port twice (API validation)
        for container in body.get("initContainers", []) + body["containers"]:
            for port in container.get("ports", []):
                if (port["hostPort"], port["protocol"]) in seen:
                    container.pop("ports")
                else:
                    seen.add((port["hostPort"], port["protocol"]))
        return body

    existing = []
    for i in range(rng.randint(0, 3)):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"on-{i}"}, "spec": spec()}
        body["spec"]["nodeName"] = fit_node
        existing.append(body)
    candidate = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "candidate"}, "spec": spec()}
    candidate["spec"]["nodeSelector"] = {"kubernetes.io/hostname": fit_node}
    if rng.random() < 0.2:
        candidate["spec"]["nodeSelector"]["zone"] = rng.choice(["a", "b"])
    if rng.random() < 0.2:
        candidate["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "gen", "operator": rng.choice(["Gt", "Lt"]), "values": [rng.choice(["2", "4"])]}]}]}}}
    return existing, candidate


def _create(stack, body: dict) -> None:
    result = stack.cp.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode == 0, (result.stderr, body)


def _scheduler_verdict(stack, namespace: str, fit_node: str) -> tuple[bool, str]:
    def decided():
        pod = pod_named(stack, namespace, "candidate")
        if pod["spec"].get("nodeName"):
            return True, pod["spec"]["nodeName"]
        failed = [e for e in events_for(stack, namespace, "candidate", "FailedScheduling")
                  if e.involved_object.uid == pod["metadata"]["uid"]]
        return (False, failed[0].message) if failed else None
    return stack.wait_for(decided, 30, "kube-scheduler's verdict", interval=0.1)


@pytest.mark.parametrize("seed", range(4))
def test_fit_agrees_with_kube_scheduler(stack, namespace, fit_node, seed):
    """10 random cases per seed: pods put on the node, a candidate pinned to it by nodeSelector
    and placed by kube-scheduler. It binds exactly when fit_problem finds nothing, and when it
    does not, its message carries the reason fit_problem gives."""
    rng = random.Random(seed)
    disagreements, verdicts = [], []
    for case in range(10):
        existing, candidate = _case(rng, fit_node)
        for body in existing:
            body["metadata"]["namespace"] = namespace
            _create(stack, body)
        mark = rng.random() < 0.3 and existing
        if mark:  # a terminal pod frees what it held
            stack.cp.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/on-0/status",
                             {"status": {"phase": "Succeeded"}}, "application/strategic-merge-patch+json")
        time.sleep(0.3)  # kube-scheduler's informer sees the pods on the node
        candidate["metadata"]["namespace"] = namespace
        _create(stack, candidate)
        on_node = [p for p in stack.pods(namespace) if p["metadata"]["name"] != "candidate"]
        ours = fit_problem(pod_named(stack, namespace, "candidate"), json.loads(stack.cp.get(f"/api/v1/nodes/{fit_node}")),
                           Placement(fit_node, ("0",)), on_node)
        bound, detail = _scheduler_verdict(stack, namespace, fit_node)
        verdicts.append(bound)
        reason = None if ours is None else ours.split(" (")[0].split(": ")[-1] if ours.startswith("node ") else ours.split(":")[0]
        if bound != (ours is None) or (reason and reason not in detail):
            disagreements.append((case, ours, detail))
        stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
        stack.wait_for(lambda: not stack.pods(namespace), 30, "pods gone", interval=0.2)
    assert not disagreements, disagreements
    assert True in verdicts and False in verdicts, verdicts  # the cases ask both questions


def _verdict(stack, namespace: str, name: str) -> tuple[bool, str] | None:
    """Bound (and where), or refused (and why, from its FailedScheduling Event); None: not yet."""
    pod = pod_named(stack, namespace, name)
    if pod["spec"].get("nodeName"):
        return True, pod["spec"]["nodeName"]
    failed = [e for e in events_for(stack, namespace, name, "FailedScheduling")
              if e.involved_object.uid == pod["metadata"]["uid"]]
    return (False, failed[0].message) if failed else None


@pytest.mark.parametrize("seed", range(2))
def test_bind_and_kube_scheduler_agree_on_pods_that_arrive_right_after_their_node_changed(stack, namespace, seed):
    """Twin nodes with the same fillers; right before the candidates arrive (0.3 s), a filler is
    deleted or the node's zone label flips, on both. kube-scheduler places one candidate on its
    twin, bind the same pod on the other: both from their watches, both bind or both refuse."""
    from test_records_cluster import Nodes

    twins = Nodes(stack, f"tw{seed}-{namespace}"[:30].rstrip("-"), 2, {"zone": "a", "gen": "3"}, ALLOCATABLE)
    rng = random.Random(100 + seed)
    disagreements, verdicts = [], []
    try:
        for case in range(8):
            existing, candidate = _case(rng, "twin")
            for node in twins.names:
                for i, body in enumerate(existing):
                    body = json.loads(json.dumps(body))
                    body["metadata"].update(name=f"{node[-1]}-on-{i}", namespace=namespace)
                    body["spec"]["nodeName"] = node
                    _create(stack, body)
            time.sleep(0.5)  # both schedulers have seen the fillers
            change = rng.choice(["filler deleted", "zone flipped", "nothing"])
            if change == "filler deleted" and existing:
                force_delete(stack, namespace, *[f"{node[-1]}-on-0" for node in twins.names])
            elif change == "zone flipped":
                zone = rng.choice(["a", "b"])
                for node in twins.names:
                    stack.cp.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {"zone": zone}}},
                                     "application/strategic-merge-patch+json")
            time.sleep(0.3)
            pods = []
            for node, scheduler in zip(twins.names, ("default-scheduler", "gpu-scheduler")):
                body = json.loads(json.dumps(candidate))
                body["metadata"] = {"name": f"cand{node[-1]}-0", "namespace": namespace}
                body["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
                body["spec"]["schedulerName"] = scheduler
                if scheduler == "gpu-scheduler":
                    body["metadata"]["annotations"] = {"gpu-scheduling-map": f"0={node}:0\n"}
                pods.append(body["metadata"]["name"])
                _create(stack, body)
            theirs, ours = (stack.wait_for(lambda n=n: _verdict(stack, namespace, n), 30, f"{n} decided", 0.1)
                            for n in pods)
            verdicts.append(theirs[0])
            if theirs[0] != ours[0]:
                disagreements.append((case, change, theirs, ours))
            stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
            stack.wait_for(lambda: not stack.pods(namespace), 30, "pods gone", interval=0.2)
    finally:
        twins.remove()
    assert not disagreements, disagreements
    assert True in verdicts and False in verdicts, verdicts  # the cases ask both questions


def bind_pod_listings(stack) -> float:
    """How many times bind listed pods (its /metrics): once at start, and after a broken watch."""
    import urllib.request
    text = urllib.request.urlopen(f"{stack.bind_url}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('gpu_scheduler_bind_listings_total{view="pods"}'))


def watched_reads(stack) -> float:
    """Events whose pod bind took from its pod watch (its /metrics)."""
    import urllib.request
    text = urllib.request.urlopen(f"{stack.bind_url}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('gpu_scheduler_bind_pod_reads_total{source="watch"}'))


def test_a_holder_bound_by_someone_else_is_seen_through_the_watch_without_a_listing(stack, namespace, fit_node):
    """bind watches every pod: a pod another workload puts on the node (directly, with its device
    annotation) holds its GPU for the next placement at once, without a new listing. The next
    pod's event is answered from the watch's copy, without a GET."""
    stack.source.paused = True  # only the events posted here reach bind
    try:
        stack.apply(pod_manifest(namespace, "first-0", f"0={fit_node}:0\n"))
        stack.wait_for(lambda: pod_named(stack, namespace, "first-0")["spec"].get("nodeName"), 20, "first-0 bound")
        listings = bind_pod_listings(stack)
        holder = filler(namespace, fit_node, "holder-0")
        holder["metadata"]["annotations"] = {DEVICES_ANNOTATION: "1"}
        stack.apply(holder)
        stack.apply(pod_manifest(namespace, "second-0", f"0={fit_node}:1\n"))
        stack.wait_for(lambda: len(stack.pods(namespace)) == 3, 20, "the holder and the second pod created")
        time.sleep(1)  # the watches deliver in milliseconds; a loaded machine gets a second
        reads = watched_reads(stack)
        status, body = post_event(stack.bind_url, pod_named(stack, namespace, "second-0"), stack.cp.server)
        assert (status, body["result"]) == (200, "Unschedulable"), body
        assert watched_reads(stack) == reads + 1  # its pod, from the watch: no GET
        assert body["message"].startswith(f"GPU 1 on {fit_node} is held by {namespace}/holder-0")
        assert bind_pod_listings(stack) == listings  # seen through the watch, not a new listing
    finally:
        stack.source.paused = False
