"""Pools (issue 44): the pods of a Deployment, which have no index, each take a free entry of the
gpu-scheduling-map, on the real control plane with the real kube-controller-manager's
Deployment and ReplicaSet controllers, mutate as the webhook and bind as the scheduler. Node
objects without kubelets: pods are bound and stay Pending (tests/test_pool_nodes.py runs them).

Without kubelets, a pod's deletion: the templates here set terminationGracePeriodSeconds 0, so the
ReplicaSet controller's deletions (DeleteOptions without a grace period: the pod's own applies)
remove a bound pod at once, as a kubelet would once its containers stopped. With a grace period a
deleted pod stays Terminating for good (nothing finishes it); test_a_terminating_pod_keeps_its_entry
uses that. A rolling update advances only on available pods, which no kubelet reports here:
`Kubelets` stands in for them, marking each bound pod Running and Ready.

Each case fails on the code before pools: there a Deployment's pods stay Pending, each with an
UnknownIndex FailedScheduling Event (a ReplicaSet's pod names no index)."""
from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
from collections import Counter, defaultdict

import pytest
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from localcp.cluster import free_port, now
from tests.test_pending_reasons_cluster import failed_scheduling

pytestmark = pytest.mark.controlplane

# The contract's names (docs: notes/pool-contract.md), spelled out: what a user and kubectl see.
ENTRY = "gpu-scheduler/entry"
DEVICES = "gpu-scheduler/devices"
DEVICES_FIELD = "metadata.annotations['gpu-scheduler/devices']"
POOL_WORKLOAD = "gpu-scheduler/pool-workload"
LAST_POD_UID = "gpu-scheduler/last-pod-uid"
RECORDS = "/apis/coordination.k8s.io/v1/namespaces/gpu-scheduler/leases"
NO_FREE_ENTRY = "no entry of the pool is free ("
# The contract (notes/pool-contract.md) wrote it "add entries ..."; bind ends its message with
# it as a sentence of its own.
FIX = ("Add entries to gpu-scheduling-map, or set maxSurge: 0 on the Deployment so that an old pod"
       " leaves before a new one is created")
IMAGE = "pause"  # never run: the nodes have no kubelets

Entries = dict[int, tuple[str, str]]  # map index -> (node, devices)

ENTRIES_4: Entries = {0: ("node1", "0,1"), 1: ("node2", "2"), 2: ("node3", "0,1,2"), 3: ("node4", "3")}
ENTRIES_5: Entries = {**ENTRIES_4, 4: ("node1", "3")}
# Two entries on each node, in map order node by node: racing instances both want entry 0 first.
ENTRIES_8: Entries = {2 * n + d: (f"node{n + 1}", str(d)) for n in range(4) for d in range(2)}


def map_text(entries: Entries) -> str:
    return "".join(f"{i}={node}:{devices}\n" for i, (node, devices) in sorted(entries.items()))


def deployment(namespace: str, name: str, entries: Entries, replicas: int, strategy: dict | None = None,
               containers: tuple[str, ...] = ("c",), grace: int = 0, image: str = IMAGE) -> dict:
    labels = {"app": name}
    spec = {"replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels, "annotations": {"gpu-scheduling-map": map_text(entries)}},
                         "spec": {"schedulerName": "gpu-scheduler", "terminationGracePeriodSeconds": grace,
                                  "containers": [{"name": c, "image": image} for c in containers]}}}
    if strategy is not None:
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": strategy}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def apps(stack) -> client.AppsV1Api:
    return client.AppsV1Api(stack.api_client)


def scale(stack, namespace: str, name: str, replicas: int) -> None:
    apps(stack).patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


def remove_deployments(stack, namespace: str) -> None:
    """Every Deployment and ReplicaSet of the namespace gone (orphaning), then their pods at once,
    until none is left: release_namespace leaves Deployments alone, and a ReplicaSet left behind
    would make its pods again, which would hold the next test's GPUs."""
    orphan = client.V1DeleteOptions(propagation_policy="Orphan")
    apps(stack).delete_collection_namespaced_deployment(namespace, body=orphan)
    apps(stack).delete_collection_namespaced_replica_set(namespace, body=orphan)

    def gone() -> bool:
        stack.api.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        return not stack.pods(namespace)
    stack.wait_for(gone, 60, f"every pod of {namespace} gone", interval=0.5)


@pytest.fixture
def ns(stack, namespace):
    yield namespace
    remove_deployments(stack, namespace)


# -- reading pods ---------------------------------------------------------------------------
def name_of(pod: dict) -> str:
    return pod["metadata"]["name"]


def annotations(pod: dict) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def holds(pod: dict) -> bool:
    """Bound and live: not Succeeded or Failed. A Terminating pod (deletionTimestamp) holds too:
    its containers may still run on the entry's GPUs."""
    return bool(pod["spec"].get("nodeName")) and pod["status"].get("phase") not in ("Succeeded", "Failed")


def on_entries(pods: list[dict], entries: Entries) -> dict[int, str]:
    """entry -> the pod on it, for bound pods: each names an entry of the map whose node and
    devices are the pod's, and no entry is named twice."""
    held: dict[int, str] = {}
    for pod in pods:
        name, node, marks = name_of(pod), pod["spec"].get("nodeName"), annotations(pod)
        assert ENTRY in marks, f"{name} bound to {node} without {ENTRY}: {marks}"
        entry = int(marks[ENTRY])
        assert entry in entries, f"{name} on entry {entry}, not in the map {entries}"
        assert (node, marks.get(DEVICES)) == entries[entry], f"{name} on entry {entry}: {node}, {DEVICES}={marks.get(DEVICES)}"
        assert entry not in held, f"entry {entry} given to both {held[entry]} and {name}"
        held[entry] = name
    return held


def describe(stack, namespace: str, pods: list[dict]) -> str:
    lines = []
    for pod in pods:
        marks = annotations(pod)
        messages = [e["message"] for e in failed_scheduling(stack, namespace, pod["metadata"]["uid"])]
        lines.append(f"  {name_of(pod)}: node={pod['spec'].get('nodeName')} {ENTRY}={marks.get(ENTRY)}"
                     f" {DEVICES}={marks.get(DEVICES)} deleting={bool(pod['metadata'].get('deletionTimestamp'))}"
                     f" FailedScheduling={messages[-2:]}")
    return "\n".join(lines)


def wait_pods(stack, namespace: str, selector: str, condition, timeout: float, what: str):
    """condition(pods) for the selector's pods until it gives something; on the deadline, an
    AssertionError with what each pod shows (its node, entry, bind's last Events)."""
    seen: list[dict] = []

    def check():
        seen[:] = stack.pods(namespace, selector)
        return condition(seen)
    try:
        return stack.wait_for(check, timeout, what)
    except TimeoutError as error:
        raise AssertionError(f"{error}; the pods:\n{describe(stack, namespace, seen)}") from None


def all_bound(count: int):
    def condition(pods: list[dict]):
        return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None
    return condition


def events_saying(stack, namespace: str, pod: dict, *parts: str) -> list[str]:
    """bind's FailedScheduling messages on `pod` that start with NO_FREE_ENTRY and hold every part."""
    return [e["message"] for e in failed_scheduling(stack, namespace, pod["metadata"]["uid"])
            if e["message"].startswith(NO_FREE_ENTRY) and all(part in e["message"] for part in parts)]


# -- watching a rollout -----------------------------------------------------------------------
class PodWatch:
    """The selector's pods, every state of them in the API server's order (a list, then watches
    from its resourceVersion on): after each change, which pod holds which entry. `overlaps`: each
    moment an entry was held by two pods at once (holds(): Terminating pods too); `unmarked`: a pod
    seen bound without an entry; `most`: the most entries held at once; `errors`: a watch that
    failed or lost history (then the check is incomplete, and says so)."""

    def __init__(self, stack, namespace: str, selector: str):
        self.stack, self.namespace, self.selector = stack, namespace, selector
        self.pods: dict[str, dict] = {}
        self.overlaps: list[tuple[str, int, list[str]]] = []
        self.unmarked: set[str] = set()
        self.most = 0
        self.changes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        listing = json.loads(stack.api.list_namespaced_pod(namespace, label_selector=selector,
                                                           _preload_content=False).data)
        self.version = listing["metadata"]["resourceVersion"]
        for pod in listing["items"]:
            self.pods[pod["metadata"]["uid"]] = pod
        self._judge()
        self._thread = threading.Thread(target=self._run, name="pool-pod-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and not self.errors:
            try:
                response = self.stack.api.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, watch=True, resource_version=self.version,
                    allow_watch_bookmarks=True, timeout_seconds=3, _preload_content=False)
                try:
                    for line in iter_resp_lines(response):
                        if line:
                            self._apply(json.loads(line))
                        if self._stop.is_set() or self.errors:
                            break
                finally:
                    response.close()
                    response.release_conn()
            except Exception as error:  # noqa: BLE001: kept for the test to fail with
                if not self._stop.is_set():
                    self.errors.append(f"watch failed: {error!r}")

    def _apply(self, event: dict) -> None:
        kind, pod = event["type"], event["object"]
        if kind == "ERROR":  # e.g. 410 Gone: the states in between are lost
            self.errors.append(f"watch error: {pod.get('message')}")
            return
        self.version = pod["metadata"]["resourceVersion"]
        if kind == "BOOKMARK":
            return
        if kind == "DELETED":
            self.pods.pop(pod["metadata"]["uid"], None)
        else:
            self.pods[pod["metadata"]["uid"]] = pod
        self.changes += 1
        self._judge()

    def _judge(self) -> None:
        holders: dict[int, list[str]] = defaultdict(list)
        for pod in self.pods.values():
            if not holds(pod):
                continue
            entry = annotations(pod).get(ENTRY)
            if entry is None:
                self.unmarked.add(name_of(pod))
                continue
            holders[int(entry)].append(name_of(pod))
        for entry, names in holders.items():
            if len(names) > 1:
                self.overlaps.append((self.version, entry, sorted(names)))
        self.most = max(self.most, len(holders))

    def stop(self) -> None:
        """Once the watch has seen what a list shows now (every pod at its resourceVersion)."""
        def caught_up() -> bool:
            listing = self.stack.pods(self.namespace, self.selector)
            return self.errors or {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in listing} == {
                uid: p["metadata"]["resourceVersion"] for uid, p in self.pods.items()}
        try:
            self.stack.wait_for(caught_up, 30, "the watch caught up with the pods")
        finally:
            self._stop.set()
            self._thread.join(timeout=10)

    def assert_never_shared(self) -> None:
        assert not self.errors, f"the watch missed states: {self.errors}"
        assert not self.overlaps, f"entries held by two pods at once (resourceVersion, entry, pods): {self.overlaps[:10]}"
        assert not self.unmarked, f"pods bound without {ENTRY}: {sorted(self.unmarked)}"


class Kubelets:
    """Stands in for the kubelets these nodes lack: marks each bound pod (not being deleted)
    Running and Ready, so that the Deployment controller counts it available and a rolling update
    goes on."""

    def __init__(self, stack, namespace: str, selector: str):
        self.stack, self.namespace, self.selector = stack, namespace, selector
        self.marked: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-kubelets", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                pods = self.stack.pods(self.namespace, self.selector)
            except Exception:  # noqa: BLE001: the next round lists again
                continue
            for pod in pods:
                uid = pod["metadata"]["uid"]
                if uid in self.marked or not pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                    continue
                stamp = now()
                status = {"phase": "Running", "startTime": stamp, "conditions": [
                    {"type": kind, "status": "True", "lastTransitionTime": stamp}
                    for kind in ("Initialized", "ContainersReady", "Ready")]}
                try:
                    self.stack.cp.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{name_of(pod)}/status",
                                          {"status": status}, "application/strategic-merge-patch+json")
                    self.marked.add(uid)
                except (OSError, urllib.error.HTTPError):
                    pass  # deleted meanwhile, or tried again next round

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def wait_rolled_out(stack, namespace: str, name: str, timeout: float, what: str):
    """rolled_out() within `timeout`; on the deadline, an AssertionError with what each pod shows."""
    try:
        return stack.wait_for(lambda: rolled_out(stack, namespace, name), timeout, what, interval=0.5)
    except TimeoutError as error:
        raise AssertionError(f"{error}; the pods:\n{describe(stack, namespace, stack.pods(namespace))}") from None


def rolled_out(stack, namespace: str, name: str):
    """The Deployment's rollout done (its controller says every replica is updated and available,
    and nothing else is left); then its current ReplicaSet."""
    deployment = apps(stack).read_namespaced_deployment(name, namespace)
    status, want = deployment.status, deployment.spec.replicas
    if not ((status.observed_generation or 0) >= deployment.metadata.generation
            and status.updated_replicas == want and status.replicas == want and status.available_replicas == want):
        return None
    revision = deployment.metadata.annotations["deployment.kubernetes.io/revision"]
    sets = apps(stack).list_namespaced_replica_set(namespace, label_selector=f"app={name}").items
    return next(rs for rs in sets if (rs.metadata.annotations or {}).get("deployment.kubernetes.io/revision") == revision)


# -- the cases ---------------------------------------------------------------------------------
def test_each_pod_of_a_deployment_takes_its_own_entry_of_the_pool(stack, ns):
    stack.apply(deployment(ns, "serve", ENTRIES_4, 4, containers=("c", "sidecar")))
    pods = wait_pods(stack, ns, "app=serve", all_bound(4), 60, "4 pods bound")
    held = on_entries(pods, ENTRIES_4)
    assert sorted(held) == [0, 1, 2, 3]
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        assert pod["status"]["phase"] == "Pending"  # bound, not run: no kubelet
        for container in pod["spec"]["containers"]:
            env = {v["name"]: v for v in container.get("env") or []}
            devices = env.get("CUDA_VISIBLE_DEVICES")
            assert devices and "value" not in devices, f"{name_of(pod)}/{container['name']}: {container.get('env')}"
            assert devices["valueFrom"]["fieldRef"]["fieldPath"] == DEVICES_FIELD
            assert env["CUDA_DEVICE_ORDER"].get("value") == "PCI_BUS_ID"
    # Each entry's record in bind's namespace names the pool's workload and the pod on it.
    uids = {int(annotations(p)[ENTRY]): p["metadata"]["uid"] for p in pods}
    records = [r for r in json.loads(stack.cp.get(RECORDS))["items"]
               if ns in (r["metadata"].get("annotations") or {}).get(POOL_WORKLOAD, "")]
    recorded = {int(r["metadata"]["annotations"][ENTRY]): r for r in records}
    assert sorted(recorded) == [0, 1, 2, 3], [r["metadata"] for r in records]
    for entry, record in recorded.items():
        marks = record["metadata"]["annotations"]
        assert record["metadata"]["name"].startswith("entry-") and len(record["metadata"]["name"]) == len("entry-") + 40
        assert "serve" in marks[POOL_WORKLOAD]
        assert marks["gpu-scheduler/node"] == ENTRIES_4[entry][0]
        assert marks[LAST_POD_UID] == uids[entry]


def test_a_replica_beyond_the_pool_waits_with_the_fix_and_takes_the_entry_a_deleted_pod_frees(stack, ns):
    stack.apply(deployment(ns, "serve", ENTRIES_4, 4))
    first = on_entries(wait_pods(stack, ns, "app=serve", all_bound(4), 60, "4 pods bound"), ENTRIES_4)
    scale(stack, ns, "serve", 5)

    def told(pods: list[dict]):
        bound = [p for p in pods if p["spec"].get("nodeName")]
        assert len(bound) <= 4, f"5 pods bound on 4 entries: {[name_of(p) for p in bound]}"
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        if len(pods) != 5 or len(pending) != 1:
            return None
        messages = events_saying(stack, ns, pending[0])
        return (pending[0], messages[-1]) if messages else None
    waiting, message = wait_pods(stack, ns, "app=serve", told, 75, "the fifth pod Pending, told no entry is free")
    for entry, (node, devices) in ENTRIES_4.items():
        assert f"entry {entry} ({node}:{devices}): held by {ns}/{first[entry]}" in message, message
    assert message.startswith(f"{NO_FREE_ENTRY}4 refused): ") and message.endswith(f". {FIX}"), message
    assert "maxSurge: 0" in message

    victim = first[1]
    stack.api.delete_namespaced_pod(victim, ns, grace_period_seconds=0)

    def refilled(pods: list[dict]):
        if victim in {name_of(p) for p in pods}:
            return None
        bound = [p for p in pods if p["spec"].get("nodeName")]
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        if len(pods) != 5 or len(bound) != 4 or len(pending) != 1:
            return None
        held = on_entries(bound, ENTRIES_4)
        if sorted(held) != [0, 1, 2, 3]:
            return None
        # The one left waiting is told so, naming who holds the freed entry now.
        node, devices = ENTRIES_4[1]
        told = events_saying(stack, ns, pending[0], f"entry 1 ({node}:{devices}): held by {ns}/{held[1]}", FIX)
        return (held, pending[0]) if told else None
    held, pending = wait_pods(stack, ns, "app=serve", refilled, 75,
                              "4 pods on the 4 entries again, the fifth Pending with the Event")
    assert {held[e] for e in (0, 2, 3)} == {first[e] for e in (0, 2, 3)}  # the others kept theirs
    assert held[1] != victim and held[1] not in first.values()
    # The freed entry went to the pod that waited or to the ReplicaSet's replacement of the victim.
    print(f"entry 1 went to {'the waiting pod' if held[1] == name_of(waiting) else 'the replacement'}"
          f" {held[1]}; {name_of(pending)} waits")


def test_a_terminating_pod_keeps_its_entry_until_it_is_gone(stack, ns):
    """Deleted with a grace period, a pod stays Terminating (here for good: no kubelet ends it);
    its containers could still use the GPUs, so the ReplicaSet's replacement waits, told who holds
    the entry, and takes it once the pod is gone."""
    stack.apply(deployment(ns, "serve", ENTRIES_4, 4, grace=3600))
    first = on_entries(wait_pods(stack, ns, "app=serve", all_bound(4), 60, "4 pods bound"), ENTRIES_4)
    victim = first[2]
    stack.api.delete_namespaced_pod(victim, ns)  # the pod's own grace period: an hour

    def replacement_waits(pods: list[dict]):
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        bound = on_entries([p for p in pods if p["spec"].get("nodeName")], ENTRIES_4)
        assert bound.get(2) == victim, f"entry 2 given away while {victim} is Terminating: {bound}"
        pending = [p for p in live if not p["spec"].get("nodeName")]
        if len(pods) != 5 or len(pending) != 1:
            return None
        node, devices = ENTRIES_4[2]
        told = events_saying(stack, ns, pending[0], f"entry 2 ({node}:{devices}): held by {ns}/{victim} (terminating)")
        return pending[0] if told else None
    replacement = wait_pods(stack, ns, "app=serve", replacement_waits, 75,
                            f"the replacement Pending while {victim} is Terminating")
    stack.api.delete_namespaced_pod(victim, ns, grace_period_seconds=0)  # what the kubelet does once it stopped
    pods = wait_pods(stack, ns, "app=serve", all_bound(4), 60, "the replacement bound once the old pod is gone")
    held = on_entries(pods, ENTRIES_4)
    assert held[2] == name_of(replacement)


ROLLOUTS = {
    # An old pod leaves before a new one comes: 4 entries are enough.
    "maxSurge 0": (ENTRIES_4, {"maxSurge": 0, "maxUnavailable": 1}),
    # A new pod comes before an old one leaves: the pool needs a fifth entry.
    "maxSurge 1": (ENTRIES_5, {"maxSurge": 1, "maxUnavailable": 0}),
}


@pytest.mark.parametrize("rollout", list(ROLLOUTS))
def test_a_rolling_update_never_puts_two_pods_on_one_entry(stack, ns, rollout):
    entries, strategy = ROLLOUTS[rollout]
    watch = PodWatch(stack, ns, "app=serve")
    kubelets = Kubelets(stack, ns, "app=serve")
    try:
        stack.apply(deployment(ns, "serve", entries, 4, strategy))
        wait_pods(stack, ns, "app=serve", all_bound(4), 60, "4 pods bound")
        wait_rolled_out(stack, ns, "serve", 60, "the first revision available")
        old = {name_of(p) for p in stack.pods(ns, "app=serve")}
        started = time.monotonic()
        apps(stack).patch_namespaced_deployment("serve", ns, {"spec": {"template": {"metadata": {
            "annotations": {"example.com/revision": "2"}}}}})
        current = wait_rolled_out(stack, ns, "serve", 180, "the rollout done")
        took = time.monotonic() - started
    finally:
        kubelets.stop()
        watch.stop()
    watch.assert_never_shared()
    pods = stack.pods(ns, "app=serve")
    assert len(pods) == 4 and not old & {name_of(p) for p in pods}
    assert {p["metadata"]["ownerReferences"][0]["name"] for p in pods} == {current.metadata.name}
    assert all(annotations(p).get("example.com/revision") == "2" for p in pods)
    held = on_entries(pods, entries)
    assert len(held) == 4
    if rollout == "maxSurge 1":
        assert watch.most == 5  # the surge pod took the fifth entry
    print(f"{rollout}: rolled out in {took:.1f} s; {watch.changes} pod changes watched, at most"
          f" {watch.most} entries held at once; entries now {sorted(held)}")


@contextlib.contextmanager
def second_bind(stack, monkeypatch):
    """A second bind beside the stack's (its own process and watch, as Knative's second instance),
    whose Events say HOSTNAME bind-pool-race (their reportingInstance); stopped afterwards."""
    name = "bind-pool-race"
    monkeypatch.setenv("HOSTNAME", name)  # the second instance's identity; the stack's keeps its own
    stack.start_bind(name, free_port())
    monkeypatch.undo()
    try:
        yield name
    finally:
        stack.cp._terminate(name)
        stack.cp.processes.pop(name, None)


def entry_records(stack, namespace: str) -> dict[int, dict[str, str]]:
    """entry -> its record's annotations, for the records of the namespace's pools."""
    records = json.loads(stack.cp.get(RECORDS))["items"]
    return {int(r["metadata"]["annotations"][ENTRY]): r["metadata"]["annotations"] for r in records
            if namespace in (r["metadata"].get("annotations") or {}).get(POOL_WORKLOAD, "")}


def racing_rounds(stack, namespace: str, entries: Entries, rounds: int, timeout: float, check=None):
    """A Deployment on `entries`, scaled from 0 to one replica per entry `rounds` times (back to 0
    between rounds: the ReplicaSet deletes its pods at once) while both instances run: each round
    all bound on distinct entries, `check(pods)` at every look meanwhile. Yields (round, seconds
    to all bound, the pods)."""
    count = len(entries)
    stack.apply(deployment(namespace, "serve", entries, 0))
    for round_ in range(rounds):
        started = time.monotonic()
        scale(stack, namespace, "serve", count)

        def done(pods: list[dict]):
            if check:
                check(pods)
            return all_bound(count)(pods)
        pods = wait_pods(stack, namespace, "app=serve", done, timeout, f"round {round_}: {count} pods bound")
        took = time.monotonic() - started
        assert sorted(on_entries(pods, entries)) == sorted(entries)
        yield round_, took, pods
        scale(stack, namespace, "serve", 0)
        stack.wait_for(lambda: not stack.pods(namespace, "app=serve"), 30, f"round {round_}: the pods gone")


def test_two_bind_instances_racing_for_one_pool_never_give_an_entry_twice(stack, ns, monkeypatch):
    """Both instances see each new pod at once and race for the pool's first free entry (the
    records decide: the loser's Reserve conflicts, and it tries the pool again). A Deployment of 8
    on 8 entries, scaled from 0 to 8 five times: all bound, each entry once."""
    binders: Counter = Counter()
    with second_bind(stack, monkeypatch):
        for round_, took, pods in racing_rounds(stack, ns, ENTRIES_8, 5, 90):
            for pod in pods:  # the Scheduled Event follows the Binding, written in the background
                events = stack.wait_for(lambda: stack.api.list_namespaced_event(
                    ns, field_selector=f"involvedObject.uid={pod['metadata']['uid']},reason=Scheduled").items, 20,
                    f"{name_of(pod)}'s Scheduled Event")
                binders.update({e.reporting_instance for e in events})
            refusals = Counter(e["message"].split(":")[0] if e["message"].startswith("binding") else e["message"][:28]
                               for pod in pods for e in failed_scheduling(stack, ns, pod["metadata"]["uid"]))
            print(f"round {round_}: 8 bound in {took:.2f} s; refusals on the way: {dict(refusals)}")
    print(f"bound by: {dict(binders)}")


def test_a_pod_both_instances_decided_leaves_no_entry_held_for_nobody(stack, ns, monkeypatch):
    """Both instances may decide the same new pod at once; each writes the record of the entry it
    chose (a takeover, at its version, of the record a pod of the previous round left), one binds
    the pod, and the other's Binding fails. The loser's record must not keep holding its entry: in
    its grace (records.GRACE_SECONDS, 30 s) while the pod it names lives, it would keep the pool's
    last replica waiting for an entry no pod holds, and then for bind's next try. So each round of
    16 on 16 entries (every GPU of node1..node4), 0 to 16 eight times, is bound within 15 s (about
    1 s when nothing is held for nobody); a slow round's failure names the records seen naming a pod
    bound on another entry."""
    entries: Entries = {4 * n + d: (f"node{n + 1}", str(d)) for n in range(4) for d in range(4)}
    strays: dict[tuple[int, str], str] = {}

    def note_strays(pods: list[dict]) -> None:
        bound = {p["metadata"]["uid"]: p for p in pods if p["spec"].get("nodeName")}
        for entry, record in entry_records(stack, ns).items():
            pod = bound.get(record.get(LAST_POD_UID))
            if pod is not None and annotations(pod).get(ENTRY) != str(entry):
                strays[(entry, name_of(pod))] = (f"record of entry {entry} names {name_of(pod)},"
                                                 f" bound on entry {annotations(pod)[ENTRY]}")
    with second_bind(stack, monkeypatch):
        for round_, took, pods in racing_rounds(stack, ns, entries, 8, 120, note_strays):
            print(f"round {round_}: 16 bound in {took:.2f} s")
            if took >= 15:
                waited = [m for p in pods for e in failed_scheduling(stack, ns, p["metadata"]["uid"])
                          if (m := e["message"]).startswith(NO_FREE_ENTRY)]
                raise AssertionError(f"round {round_}: 16 pods on 16 entries took {took:.1f} s; records seen naming a pod"
                                     f" bound elsewhere: {sorted(strays.values())}; bind's refusals: {waited}")
            strays.clear()
