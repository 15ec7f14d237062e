"""bind with more than one instance, without its event source, and killed between its two writes,
on the real control plane: the device records in the API server keep every GPU with one
workload, and bind's own watch finds every pending pod.

Each test has nodes of its own (Node objects kept Ready by the test, 4 GPUs each), so that its
races touch nothing of node1..node4. Pods bound to them stay Pending (no kubelet)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import FunctionServer
from gpu_scheduler.records import record_name
from localcp.cluster import now
from test_end_to_end import pod_manifest
from test_faults import post_event, sts

CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"}
RECORDS = "/apis/coordination.k8s.io/v1/namespaces/gpu-scheduler/leases"


def _ready() -> list[dict]:
    stamp = now()
    return [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test heartbeat",
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]


class Nodes:
    """`count` Ready nodes of the test's own, with heartbeats, removed afterwards. `spec`: the
    nodes' own (their taints, say), there from their creation on."""

    def __init__(self, stack, prefix: str, count: int, labels: dict | None = None, capacity: dict = CAPACITY,
                 spec: dict | None = None):
        self.stack, self.names = stack, [f"{prefix}-{i}" for i in range(count)]
        for name in self.names:
            stack.cp.request("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                "spec": spec or {},
                "status": {"capacity": capacity, "allocatable": capacity, "conditions": _ready()}})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        own = [t["key"] for t in (spec or {}).get("taints", [])]
        for name in self.names:  # a new node is tainted not-ready until the lifecycle controller sees it Ready
            stack.wait_for(lambda n=name: [t["key"] for t in json.loads(stack.cp.get(f"/api/v1/nodes/{n}"))["spec"]
                                           .get("taints", [])] == own, 60, f"node {name} with only its own taints",
                           interval=0.5)

    def _beat(self):
        while not self._stop.wait(5):
            for name in self.names:
                try:
                    self.stack.cp.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": _ready()}},
                                          "application/strategic-merge-patch+json")
                except (OSError, urllib.error.HTTPError):
                    pass

    def remove(self):
        self._stop.set()
        for name in self.names:
            self.stack.cp.kubectl("delete", "node", name, "--ignore-not-found", check=False)


@pytest.fixture
def own_nodes(stack, namespace):
    made = []

    def make(count: int, **labels) -> list[str]:
        nodes = Nodes(stack, f"r{len(made)}-{namespace}"[:40].rstrip("-"), count, labels)
        made.append(nodes)
        return nodes.names
    yield make
    for nodes in made:
        nodes.remove()


def ready_instance(stack, **env) -> FunctionServer:
    """Another bind, as Knative would start one more instance: the same account, its own process."""
    server = FunctionServer("bind", {"KUBECONFIG": str(stack.bind_kubeconfig), **env})
    stack.wait_for(lambda: _status(f"{server.url}/health/readiness") == 200, 60, "the instance ready")
    return server


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def record_of(stack, node: str, device: str) -> dict | None:
    try:
        return json.loads(stack.cp.get(f"{RECORDS}/{record_name(node, device)}"))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def bound(stack, namespace) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in stack.pods(namespace) if p["spec"].get("nodeName")}


def test_three_bind_instances_racing_for_one_gpu_give_it_to_one_workload(stack, namespace, own_nodes):
    """100 races: two workloads (bare pods from two maps) want the same GPU at the same instant;
    each pod's event goes to all three instances at once, and each instance's own watch tries it
    too. The records make it one workload per GPU, every time; the other pod waits, Unschedulable."""
    nodes = own_nodes(25)
    races = [(node, str(device)) for node in nodes for device in range(4)]
    others = [ready_instance(stack), ready_instance(stack)]
    urls = [stack.bind_url] + [server.url for server in others]
    stack.source.paused = True
    try:
        def race(i: int):
            node, device = races[i]
            pods = [pod_manifest(namespace, f"a{i}-0", f"0={node}:{device}\n"),
                    pod_manifest(namespace, f"b{i}-0", f"0={node}:{device}\n# another workload\n")]
            with ThreadPoolExecutor(2) as pool:
                created = list(pool.map(lambda body: stack.api.create_namespaced_pod(
                    namespace, body, _preload_content=False), pods))
            events = [json.loads(response.data) for response in created]
            barrier = threading.Barrier(len(urls) * len(events))

            def deliver(url, pod):
                barrier.wait()
                return post_event(url, pod, stack.cp.server)
            with ThreadPoolExecutor(len(urls) * len(events)) as pool:
                return list(pool.map(lambda args: deliver(*args), [(u, p) for u in urls for p in events]))
        with ThreadPoolExecutor(4) as pool:
            answers = [a for result in pool.map(race, range(len(races))) for a in result]
        assert {status for status, _ in answers} == {200}
        settle = time.monotonic() + 20
        while time.monotonic() < settle and len(bound(stack, namespace)) < len(races):
            time.sleep(0.5)
        time.sleep(2)  # any late second binding would show now
        placed = bound(stack, namespace)
    finally:
        stack.source.paused = False
        for server in others:
            server.stop()
    per_race = Counter(name.split("-")[0][1:] for name in placed)
    assert sorted(per_race) == sorted(str(i) for i in range(len(races)))  # every race placed one pod
    assert set(per_race.values()) == {1}, [race for race, n in per_race.items() if n > 1]  # never two
    for i, (node, device) in enumerate(races):
        winner = next(name for name in placed if name.split("-")[0][1:] == str(i))
        record = record_of(stack, node, device)
        assert record["metadata"]["annotations"]["gpu-scheduler/last-pod"] == f"{namespace}/{winner}"


def test_pods_are_placed_with_the_event_source_gone(stack, namespace):
    """The adapter can go silent for minutes (after an API server restart, or stopped): bind's own
    watch of pending pods places every replica, with no event and no ping."""
    stack.source.paused = True  # every event from here on is lost
    try:
        stack.apply(sts(namespace, 12))
        pods = stack.wait_bound(namespace, 12, timeout=30)
    finally:
        stack.source.paused = False
    assert sorted({p["spec"]["nodeName"] for p in pods}) == ["node1", "node2", "node3", "node4"]


def test_bind_killed_between_its_record_and_its_binding(stack, namespace, own_nodes):
    """An instance writes a pod's device record and dies before the Binding (its worker exits; the
    stack's own bind is stopped meanwhile, so only the dying instance sees the pod). Another instance finds
    the pod pending, the record its own workload's, and binds it; a record whose pod is deleted
    instead frees its GPU for another workload at once."""
    [node] = own_nodes(1)
    group = stack.cp.processes["bind"].pid
    os.killpg(group, signal.SIGSTOP)  # the stack's own bind: only the dying instance sees the pod
    try:
        dying = ready_instance(stack, GPU_SCHEDULER_TEST_EXIT_AFTER_RECORD="1")
        stack.apply(pod_manifest(namespace, "first-0", f"0={node}:1\n"))
        # Its worker dies after each record (gunicorn starts another, which dies the same way).
        stack.wait_for(lambda: record_of(stack, node, "1"), 30, "the record written")
        time.sleep(1)
        dying.stop()
        assert "exited with code 17" in dying.output()
        first = stack.pods(namespace)[0]
        record = record_of(stack, node, "1")
        assert record["metadata"]["annotations"]["gpu-scheduler/last-pod-uid"] == first["metadata"]["uid"]
        assert not first["spec"].get("nodeName")
        # Again, and this time the pod is deleted before anyone binds it.
        dying = ready_instance(stack, GPU_SCHEDULER_TEST_EXIT_AFTER_RECORD="1")
        stack.apply(pod_manifest(namespace, "doomed-0", f"0={node}:2\n"))
        stack.wait_for(lambda: record_of(stack, node, "2"), 30, "the record written")
        dying.stop()
        stack.cp.kubectl("delete", "pod", "-n", namespace, "doomed-0", "--grace-period=0", "--force")
    finally:
        os.killpg(group, signal.SIGCONT)
    started = time.monotonic()
    pods = stack.wait_bound(namespace, 1, "", timeout=15)
    assert [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods] == [("first-0", node)]
    # The doomed pod's GPU goes to another workload without waiting out the record's grace.
    stack.apply(pod_manifest(namespace, "next-0", f"0={node}:2\n# another workload\n"))
    stack.wait_for(lambda: "next-0" in bound(stack, namespace), 10, "next-0 bound on the freed GPU")
    print(f"bound {time.monotonic() - started:.1f}s after the stack's bind resumed")


@pytest.mark.parametrize("way", ["label added", "label removed"])
def test_a_node_label_changed_just_before_a_pod_arrives(stack, namespace, own_nodes, way):
    """The node is read as watched, not from a cache of seconds: a selector on a label changed
    0.3 s before the pod arrives is judged on the new label, both ways."""
    [node] = own_nodes(1, zone="a" if way == "label added" else "b")
    stack.apply(pod_manifest(namespace, "warm-0", f"0={node}:0\n"))  # bind has just looked at the node
    stack.wait_for(lambda: "warm-0" in bound(stack, namespace), 15, "the first pod bound")
    stack.cp.request("PATCH", f"/api/v1/nodes/{node}",
                     {"metadata": {"labels": {"zone": "b" if way == "label added" else "a"}}},
                     "application/strategic-merge-patch+json")
    time.sleep(0.3)
    pod = pod_manifest(namespace, "picky-0", f"0={node}:1\n")
    pod["spec"]["nodeSelector"] = {"zone": "b"}
    stack.apply(pod)
    if way == "label added":
        stack.wait_for(lambda: "picky-0" in bound(stack, namespace), 15, "picky-0 bound")
    else:
        def refused():
            conditions = next(p for p in stack.pods(namespace) if p["metadata"]["name"] == "picky-0")["status"].get(
                "conditions") or []
            return any(c.get("reason") == "Unschedulable" and "zone" in (c.get("message") or "") for c in conditions)
        stack.wait_for(refused, 15, "picky-0 refused for its selector")
        time.sleep(1)
        assert "picky-0" not in bound(stack, namespace)
