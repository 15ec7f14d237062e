"""Preemption on the real control plane (gpu_scheduler/plugins/defaultpreemption.py): a pod
whose mapped GPU a pod of lower priority holds takes it back.

- a low-priority workload holds a node's GPU 1 and a high-priority pod maps it: the victim is
  evicted through the Eviction API with DisruptionTarget (PreemptionByScheduler) and a `Preempted`
  Event naming the preemptor, the preemptor's status.nominatedNodeName is set, and once the victim
  is gone the preemptor is bound;
- equal priority, preemptionPolicy Never, and a PodDisruptionBudget with minAvailable equal to the
  replicas: nothing is evicted, and the preemptor's Event says why;
- three bind instances and two high-priority pods racing for one victim's GPU: one eviction, one
  bound pod, the other waiting and saying for whom the GPU is being freed;
- DRA mode: the victim's claim's device is freed and then allocated in the preemptor's claim, a
  pool pod's claim (named at its admission, not from its name) included;
- a gang of high priority one of whose members only a pod of equal priority is in the way of:
  nothing evicted; that pod gone, the low-priority pod in another member's way is evicted, and the
  gang is bound whole.

The test nodes have no kubelet: a pod evicted stays Terminating for its grace period, as on a real
node while its containers stop, and no kubelet ever finishes it. Each test plays the kubelet once it
has checked the eviction: it deletes the victim with no grace period.
"""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.parse
from contextlib import contextmanager

import pytest
from kubernetes import client

from gpu_scheduler.fit import workload as fit_workload
from gpu_scheduler.plugins.config import DEFAULT_NAMESPACE  # where the stack's bind keeps its device records
from gpu_scheduler.records import MANAGED_BY, Record, nominated_lease, record_name, workload_key

from test_dra_cluster import RESOURCE, admin, dra_pod, gpus_on_node3  # noqa: F401 (fixtures)
from test_end_to_end import pod_manifest, statefulset
from test_plugin_cluster import reader, run  # noqa: F401 (reader: a fixture)
from test_placer import synced_placer
from test_records_cluster import own_nodes, ready_instance  # noqa: F401 (own_nodes: a fixture)

LOW, HIGH, HIGH_NEVER = "gs-test-low", "gs-test-high", "gs-test-high-never"
PRIORITIES = {LOW: 10, HIGH: 1000, HIGH_NEVER: 1000}
GRACE = 30  # the victims' terminationGracePeriodSeconds: long enough to see them Terminating


def create_priority_classes(stack, values: dict[str, int], never: str) -> None:
    """PriorityClasses of these names and values (cluster-wide: one already there is kept); `never`'s
    preemptionPolicy is Never."""
    for name, value in values.items():
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "preemptionPolicy": "Never" if name == never else "PreemptLowerPriority"}
        try:
            stack.cp.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
        except urllib.error.HTTPError as error:
            if error.code != 409:
                raise


@pytest.fixture(scope="module", autouse=True)
def priority_classes(stack):
    create_priority_classes(stack, PRIORITIES, HIGH_NEVER)


def with_class(manifest: dict, priority_class: str) -> dict:
    spec = manifest["spec"]["template"]["spec"] if manifest["kind"] in ("StatefulSet", "Deployment") else manifest["spec"]
    spec["priorityClassName"] = priority_class
    spec["terminationGracePeriodSeconds"] = GRACE
    return manifest


def workload(namespace: str, name: str, entry: str, priority_class: str) -> dict:
    """A StatefulSet of one replica whose map gives it `entry` (node:devices)."""
    return with_class(statefulset(namespace, f"0={entry}\n", replicas=1, name=name), priority_class)


def pod(stack, namespace: str, name: str) -> dict | None:
    try:
        return json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def events(stack, namespace: str, uid: str, reason: str) -> list[dict]:
    query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.uid={uid}"})
    items = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/events?{query}"))["items"]
    return [e for e in items if e.get("reason") == reason]


def disruption(pod_body: dict) -> dict | None:
    return next((c for c in pod_body["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"), None)


def bound_victim(stack, namespace: str, name: str) -> dict:
    """The one pod of StatefulSet `name`, once bound."""
    [victim] = stack.wait_bound(namespace, 1, f"app={name}", timeout=60)
    return victim


def log_of(stack) -> str:
    return "\n".join(line[:300] for line in stack.cp.log_tail("bind", 20).splitlines())


def waiting_saying(stack, namespace: str, name: str, words: str | tuple[str, ...], timeout: float = 30) -> dict:
    """Pod `name` pending with a FailedScheduling Event whose message holds `words` (or one of
    them): that Event."""
    said = (words,) if isinstance(words, str) else words

    def check():
        body = pod(stack, namespace, name)
        if body is None:
            return None  # not created yet
        assert not body["spec"].get("nodeName"), f"{name} bound: {body['spec']}"
        found = [e for e in events(stack, namespace, body["metadata"]["uid"], "FailedScheduling")
                 if any(w in e["message"] for w in said)]
        return found[0] if found else None
    try:
        return stack.wait_for(check, timeout, f"{name} waiting, saying {words!r}", interval=0.3)
    except TimeoutError as error:
        body = pod(stack, namespace, name) or {"metadata": {"uid": ""}}
        said = [e["message"] for e in events(stack, namespace, body["metadata"]["uid"], "FailedScheduling")]
        raise AssertionError(f"{error}; its Events: {said}\nbind's log:\n{log_of(stack)}") from None


def evicted(stack, namespace: str, victim: dict, timeout: float = 30) -> dict:
    """The victim, once evicted (Terminating) and its `Preempted` Event written. bind writes that
    Event only after its DisruptionTarget condition, which it writes only after the eviction has
    returned: the Eviction API writes its own DisruptionTarget (EvictionByEvictionAPI) before it
    deletes, so for one round trip the pod carries that reason; once the Event exists, the
    condition read is the final one."""
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]

    def check():
        body = pod(stack, namespace, name)
        if body is None or body["metadata"]["uid"] != uid:
            raise AssertionError(f"{name} gone before the test played its kubelet")
        if not (body["metadata"].get("deletionTimestamp") and events(stack, namespace, uid, "Preempted")):
            return None
        return pod(stack, namespace, name)  # read after the Event was seen
    try:
        return stack.wait_for(check, timeout, f"{name} evicted", interval=0.2)
    except TimeoutError as error:
        raise AssertionError(f"{error}\nbind's log:\n{log_of(stack)}") from None


def play_kubelet(stack, namespace: str, name: str) -> None:
    """What the kubelet does once the evicted pod's containers have stopped: the pod is gone."""
    stack.api.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


@contextmanager
def stack_bind_stopped(stack):
    """The stack's own bind stopped (SIGSTOP, its process group) for the block: only the other
    instances (or the test) decide meanwhile."""
    group = stack.cp.processes["bind"].pid
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)


def never_evicted(stack, namespace: str, victim: dict) -> None:
    body = pod(stack, namespace, victim["metadata"]["name"])
    assert body is not None and body["metadata"]["uid"] == victim["metadata"]["uid"]
    assert not body["metadata"].get("deletionTimestamp") and disruption(body) is None, body["status"]
    assert events(stack, namespace, victim["metadata"]["uid"], "Preempted") == []


# -- 1. evicted with the condition and the Event; the preemptor bound ----------------------------
def test_a_lower_priority_pod_is_evicted_and_the_preemptor_bound(stack, namespace, own_nodes):
    [node] = own_nodes(1)
    stack.apply(workload(namespace, "batch", f"{node}:1", LOW))
    victim = bound_victim(stack, namespace, "batch")
    stack.apply(with_class(pod_manifest(namespace, "urgent-0", f"0={node}:1\n"), HIGH))

    gone = evicted(stack, namespace, victim)
    condition = disruption(gone)
    assert (condition["status"], condition["reason"]) == ("True", "PreemptionByScheduler"), condition
    [event] = events(stack, namespace, victim["metadata"]["uid"], "Preempted")
    assert f"{namespace}/urgent-0" in event["message"] and event.get("count", 1) == 1, event
    preemptor = pod(stack, namespace, "urgent-0")
    assert preemptor["status"].get("nominatedNodeName") == node and not preemptor["spec"].get("nodeName")

    play_kubelet(stack, namespace, victim["metadata"]["name"])
    stack.wait_for(lambda: (pod(stack, namespace, "urgent-0") or {}).get("spec", {}).get("nodeName") == node, 30,
                   "the preemptor bound")
    # the StatefulSet's replacement of the victim, of lower priority, waits: the GPU is the preemptor's
    # (kept for it, given to it, or held by it, depending on when it was last tried)
    waiting_saying(stack, namespace, "batch-0", (f"held by {namespace}/urgent-0", "given to", "being freed for"))


# -- 2. nobody can be preempted: nothing evicted, the reason given -----------------------------
@pytest.mark.parametrize("case", ["equal-priority", "never", "pdb"])
def test_nothing_is_evicted_when_nobody_may_be_and_the_reason_is_given(stack, namespace, own_nodes, reader, case):
    [node] = own_nodes(1)
    stack.apply(workload(namespace, "batch", f"{node}:1", HIGH if case == "equal-priority" else LOW))
    victim = bound_victim(stack, namespace, "batch")
    if case == "pdb":
        stack.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                     "metadata": {"name": "batch", "namespace": namespace},
                     "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "batch"}}}})
        stack.wait_for(lambda: (json.loads(stack.cp.get(
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/batch")).get("status") or {})
            .get("currentHealthy") is not None, 30, "the budget's status")
    stack.apply(with_class(pod_manifest(namespace, "urgent-0", f"0={node}:1\n"),
                           HIGH_NEVER if case == "never" else HIGH))
    words = {"equal-priority": f"nobody preempted: no pod on {node} has a priority lower than this pod's 1000",
             "never": "nobody preempted: the pod's preemptionPolicy is Never",
             "pdb": f"nobody preempted: evicting {namespace}/batch-0 would violate its PodDisruptionBudget"
                    f" {namespace}/batch allows 0 disruptions now"}[case]
    event = waiting_saying(stack, namespace, "urgent-0", words)
    stack.ping()  # tried again, every pending pod at once
    waiting_saying(stack, namespace, "urgent-0", words)
    never_evicted(stack, namespace, victim)
    # explain, as a user granted exactly permissions.PLUGIN: bind's message, and why nobody can be preempted
    code, out, err = run("explain", "pod/urgent-0", "-n", namespace, "--kubeconfig", reader,
                         "--scheduler-namespace", "gpu-scheduler", "-o", "json")
    decided = json.loads(out)["scheduling"]
    assert (code, decided["message"]) == (1, event["message"]), (out, err)
    assert decided["preemption"].startswith(words.replace("nobody preempted:", "nobody can be preempted:")), decided
    assert not pod(stack, namespace, "urgent-0")["status"].get("nominatedNodeName")


# -- 3. two preemptors, three instances, one victim: one eviction, one bound -----------------------
def test_two_preemptors_racing_for_one_victims_gpu_evict_it_once_and_one_is_bound(stack, namespace, own_nodes):
    [node] = own_nodes(1)
    stack.apply(workload(namespace, "batch", f"{node}:1", LOW))
    victim = bound_victim(stack, namespace, "batch")
    instances = [ready_instance(stack), ready_instance(stack)]
    try:
        stack.apply({"apiVersion": "v1", "kind": "List", "items": [
            workload(namespace, "urgent-a", f"{node}:1", HIGH), workload(namespace, "urgent-b", f"{node}:1", HIGH)]})
        evicted(stack, namespace, victim)
        # each instance tries every pending pod of ours; a ping makes the stack's own try both again
        stack.ping()
        nominated = stack.wait_for(lambda: [n for n in ("urgent-a-0", "urgent-b-0")
                                            if pod(stack, namespace, n)["status"].get("nominatedNodeName")], 30,
                                   "a preemptor nominated")
        loser = "urgent-b-0" if nominated == ["urgent-a-0"] else "urgent-a-0"
        waiting_saying(stack, namespace, loser, "is being freed for")
        preempted = events(stack, namespace, victim["metadata"]["uid"], "Preempted")
        assert len(preempted) == 1 and preempted[0].get("count", 1) == 1, [e["message"] for e in preempted]
        nominated = [n for n in ("urgent-a-0", "urgent-b-0")
                     if pod(stack, namespace, n)["status"].get("nominatedNodeName") == node]
        assert len(nominated) == 1, nominated
        [winner] = nominated
        loser = "urgent-b-0" if winner == "urgent-a-0" else "urgent-a-0"

        play_kubelet(stack, namespace, victim["metadata"]["name"])
        stack.wait_for(lambda: (pod(stack, namespace, winner) or {}).get("spec", {}).get("nodeName") == node, 30,
                       f"{winner} bound")
        waiting_saying(stack, namespace, loser, (f"held by {namespace}/{winner}", f"given to {namespace}/{winner}"))
        assert not pod(stack, namespace, loser)["spec"].get("nodeName")
        replacement = pod(stack, namespace, "batch-0")
        assert replacement is None or not replacement["metadata"].get("deletionTimestamp")
    finally:
        for instance in instances:
            instance.stop()


def test_an_instance_overtaken_by_another_preempting_for_the_same_pod_keeps_its_claim(stack, namespace, own_nodes,
                                                                                     admin):
    """Two bind instances preempt for urgent-0 (GPUs 1 and 2; GPU 1's holder of lower priority) at
    once. The other instance (played here, with the API server's own calls) has written GPU 1's
    nomination and not yet created GPU 2's record when this instance (bind's Placer, in this
    process) reads: so it reads GPU 1 nominated for urgent-0, no record of GPU 2, and the victim not
    yet evicted. Its create of GPU 2's record then meets the other instance's (409 from the API
    server), which is a claim for urgent-0 too: it leaves the eviction to the other instance and
    keeps what it read; both GPUs stay nominated for urgent-0, and urgent-0 is bound there once the
    victim is gone.

    Before, it rewrote GPU 1's nomination, then took it back on GPU 2's conflict: GPU 1 was left to
    any pod while the victim terminated (test_gpus_cluster.py's two-instance run met it in CI)."""
    [node] = own_nodes(1)
    stack.apply(workload(namespace, "batch", f"{node}:1", LOW))
    victim = bound_victim(stack, namespace, "batch")
    with stack_bind_stopped(stack):  # the stack's own bind decides nothing meanwhile
        stack.apply(with_class(pod_manifest(namespace, "urgent-0", f"0={node}:1,2\n"), HIGH))
        urgent = stack.wait_for(lambda: pod(stack, namespace, "urgent-0"), 20, "urgent-0 created")
        who, uid, holder = f"{namespace}/urgent-0", urgent["metadata"]["uid"], workload_key(fit_workload(urgent))
        pods = admin.list_pods(f"spec.nodeName={node}") + [urgent]
        nodes = [n for page, _ in admin.list_nodes() for n in page]
        until = time.time() + GRACE + 60
        # the other instance's first write: GPU 1's record, at its version, nominated for urgent-0
        one = Record.of(admin.read_lease(DEFAULT_NAMESPACE, record_name(node, "1")))
        admin.update_lease(DEFAULT_NAMESPACE, one.name, nominated_lease(one, node, "1", who, uid, 1000, until, holder))
        # this instance's read: between the other's two writes
        leases = [lease for page, _ in admin.list_leases(DEFAULT_NAMESPACE, f"{MANAGED_BY}=gpu-scheduler")
                  for lease in page]
        # ... then its second, and its eviction
        admin.create_lease(DEFAULT_NAMESPACE, nominated_lease(None, node, "2", who, uid, 1000, until, holder))
        admin.evict(namespace, victim["metadata"]["name"], victim["metadata"]["uid"])

        placer = synced_placer(admin, pods, nodes, leases)
        outcome = placer.place(urgent).outcome
        placer.recorder.flush()
        for device in ("1", "2"):
            record = Record.of(admin.read_lease(DEFAULT_NAMESPACE, record_name(node, device)))
            assert (device, record.nominee, record.nominee_uid) == (device, who, uid), outcome
        assert (f"preemption: GPU 2 on {node} was claimed for this pod by another bind instance, which evicts;"
                " the pod is placed once its victims are gone") in outcome["message"], outcome
        assert pod(stack, namespace, "batch-0")["metadata"].get("deletionTimestamp")
        assert events(stack, namespace, victim["metadata"]["uid"], "Preempted") == []  # evicted once, by the other

    play_kubelet(stack, namespace, victim["metadata"]["name"])
    stack.ping()
    stack.wait_for(lambda: (pod(stack, namespace, "urgent-0") or {}).get("spec", {}).get("nodeName") == node, 45,
                   "urgent-0 bound")
    assert pod(stack, namespace, "urgent-0")["metadata"]["annotations"]["gpu-scheduler/devices"] == "1,2"


# -- 4. DRA mode: the victim's claim's device freed, then allocated to the preemptor ---------------
def test_dra_a_lower_priority_claims_device_is_freed_and_allocated_to_the_preemptor(stack, namespace, admin,
                                                                                     gpus_on_node3):
    stack.apply(with_class(dra_pod(namespace, "low-0", "0=node3:1"), LOW))
    [victim] = stack.wait_bound(namespace, 1)
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    assert [r["device"] for r in admin._call("GET", f"{claims}/low-0-gpus")["status"]["allocation"]["devices"]
            ["results"]] == ["gpu-1"]
    stack.apply(with_class(dra_pod(namespace, "high-1", "1=node3:1"), HIGH))

    gone = evicted(stack, namespace, victim)
    assert disruption(gone)["reason"] == "PreemptionByScheduler"
    play_kubelet(stack, namespace, "low-0")
    stack.wait_for(lambda: (pod(stack, namespace, "high-1") or {}).get("spec", {}).get("nodeName") == "node3", 60,
                   "the preemptor bound")
    results = admin._call("GET", f"{claims}/high-1-gpus")["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [("node3", "gpu-1")]


def test_dra_a_pool_victims_claim_is_freed_and_its_device_allocated_to_the_preemptor(stack, namespace, admin,
                                                                                      gpus_on_node3):
    """A pool pod (a Deployment's replica) holds its entry's device through the claim mutate named
    at admission from its generateName, not `<pod name>-gpus`: preemption must free that claim's
    device in its trial, or it finds no victim and the preemptor waits for ever."""
    # Here, not at the top: test_pool_cluster imports test_pending_reasons_cluster, which imports this module.
    from test_pool_cluster import deployment as pool_deployment, remove_deployments
    victim_deployment = pool_deployment(namespace, "serve-low", {0: ("node3", "1")}, 1)
    victim_deployment["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/device-env"] = "dra"
    stack.apply(with_class(victim_deployment, LOW))
    try:
        [victim] = stack.wait_bound(namespace, 1, "app=serve-low")
        [ref] = victim["spec"]["resourceClaims"]
        assert ref["resourceClaimName"] != f"{victim['metadata']['name']}-gpus", ref  # the case this test is for
        claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
        stack.wait_for(lambda: (admin._call("GET", f"{claims}/{ref['resourceClaimName']}")["status"]
                                .get("allocation")), 30, "the pool pod's claim allocated")
        stack.apply(with_class(dra_pod(namespace, "high-1", "1=node3:1"), HIGH))

        gone = evicted(stack, namespace, victim)
        assert disruption(gone)["reason"] == "PreemptionByScheduler"
        # The ReplicaSet makes a replacement at once (a Terminating pod is not counted): it waits,
        # and the preemptor's nomination keeps the freed device for the preemptor.
        play_kubelet(stack, namespace, victim["metadata"]["name"])
        stack.ping()
        stack.wait_for(lambda: (pod(stack, namespace, "high-1") or {}).get("spec", {}).get("nodeName") == "node3",
                       60, "the preemptor bound")
        results = admin._call("GET", f"{claims}/high-1-gpus")["status"]["allocation"]["devices"]["results"]
        assert [(r["pool"], r["device"]) for r in results] == [("node3", "gpu-1")]
    finally:
        remove_deployments(stack, namespace)





# -- 5. a gang preempts for its refused member, or not at all --------------------------------------
def gang_workload(namespace: str, name: str, entries: list[str], priority_class: str) -> dict:
    text = "".join(f"{i}={entry}\n" for i, entry in enumerate(entries))
    manifest = with_class(statefulset(namespace, text, replicas=len(entries), name=name), priority_class)
    manifest["spec"]["podManagementPolicy"] = "Parallel"
    manifest["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/gang"] = "true"
    return manifest


def test_a_gang_evicts_only_when_every_member_can_then_be_placed(stack, namespace, own_nodes):
    a, b = own_nodes(2)
    stack.apply(workload(namespace, "low", f"{b}:1", LOW))
    low = bound_victim(stack, namespace, "low")
    stack.apply(workload(namespace, "peer", f"{a}:2", HIGH))  # equal priority to the gang's: never preempted
    peer = bound_victim(stack, namespace, "peer")
    # member 1 needs the low pod's GPU, member 2 the peer's: the gang cannot be placed whole
    stack.apply(gang_workload(namespace, "big", [f"{a}:0", f"{b}:1", f"{a}:2"], HIGH))
    waiting_saying(stack, namespace, "big-2", "nobody preempted: member big-2")
    never_evicted(stack, namespace, low)
    never_evicted(stack, namespace, peer)

    # the peer gone, the gang can be placed whole once the low pod is: it is evicted, then all bound
    client.AppsV1Api(stack.api_client).delete_namespaced_stateful_set("peer", namespace)
    play_kubelet(stack, namespace, peer["metadata"]["name"])
    gone = evicted(stack, namespace, low)
    assert disruption(gone)["reason"] == "PreemptionByScheduler"
    assert not any(p["spec"].get("nodeName") for p in stack.pods(namespace, "app=big"))  # nothing bound meanwhile
    play_kubelet(stack, namespace, low["metadata"]["name"])
    bound = stack.wait_bound(namespace, 3, "app=big", timeout=30)
    assert sorted(p["spec"]["nodeName"] for p in bound) == sorted([a, b, a])
