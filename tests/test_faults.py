"""No pod lost or bound twice under duplicated, reordered, dropped and delayed events, an API
server restart, deletions mid-flight and concurrent bind instances. Real control plane."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from collections import Counter

import pytest

from conftest import FunctionServer
from localcp.cloudevents import Sender, cloudevent_headers
from localcp.stack import LocalStack
from test_end_to_end import pod_manifest, statefulset


def map_for(replicas: int) -> str:
    return "".join(f"{i}=node{i % 4 + 1}:{i % 4}\n" for i in range(replicas))


def sts(namespace: str, replicas: int) -> dict:
    return statefulset(namespace, map_for(replicas), replicas=replicas)


def bound_once(results, names) -> None:
    """No event's answer says a pod was bound twice: at most one Bound each (the others
    AlreadyBound, or ignored; bind's own watch may have bound the pod before any event came)."""
    bound = Counter(name for name, status, result in results if result == "Bound")
    assert all(bound[name] <= 1 for name in names), bound
    assert {result for _, _, result in results} <= {"Bound", "AlreadyBound", "ignored"}


def scheduled_once(stack, namespace: str, names) -> None:
    """Each pod got exactly one successful Binding: one Scheduled Event, counted once (a second
    Binding would count it up)."""
    from test_scheduler_contract import events_for

    def counts():
        found = {name: [e.count for e in events_for(stack, namespace, name, "Scheduled")] for name in names}
        return found if all(found.values()) else None
    found = stack.wait_for(counts, 30, "a Scheduled Event for every pod")
    time.sleep(1)  # a second binding's Event would be written by now
    assert found == {name: [1] for name in names}


def names_of(pods) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def post_event(url: str, pod: dict, source: str):
    response = Sender(url, delays=()).http.request("POST", url, body=json.dumps(pod).encode(),
                                                   headers=cloudevent_headers("add", pod, source))
    return response.status, json.loads(response.data)


@pytest.fixture
def faulty(stack):
    """The shared event source, with faults switched on for one test and off afterwards."""
    source = stack.source
    yield source
    source.duplicate, source.drop_rate, source.shuffle = 1, 0.0, False
    source.release()


def test_every_event_three_times_out_of_order(stack, namespace, faulty):
    faulty.duplicate, faulty.shuffle = 3, True
    faulty.hold()  # let the copies pile up, then shuffle and send them all at once
    stack.apply(sts(namespace, 30))
    stack.wait_for(lambda: len(stack.pods(namespace)) == 30, 60, "30 pods created")
    stack.wait_for(lambda: faulty.queued() >= 90, 30, "90 queued events")
    start = len(faulty.sender.results)
    faulty.release()
    pods = stack.wait_bound(namespace, 30, timeout=90)
    stack.wait_for(faulty.idle, 60, "all copies delivered")
    results = [r for r in faulty.sender.results[start:] if r[0] in names_of(pods)]
    assert {status for _, status, _ in results} == {200}
    bound_once(results, names_of(pods))
    scheduled_once(stack, namespace, names_of(pods))


def test_thirty_percent_dropped_places_every_pod_without_a_ping(stack, namespace, faulty):
    """bind's own watch finds the pods whose events were lost; a ping afterwards finds nothing
    left to place."""
    faulty.drop_rate = 0.3
    dropped_before = len(faulty.dropped)
    stack.apply(sts(namespace, 40))
    pods = stack.wait_bound(namespace, 40, timeout=30)
    stack.wait_for(faulty.idle, 60, "the surviving events delivered")
    faulty.drop_rate = 0.0
    assert len(pods) == 40 and len(faulty.dropped) > dropped_before, "30% of the events should have been lost"
    answer = stack.ping()
    assert answer["status"] == 200 and answer["result"] == "resynced"
    assert answer["outcomes"].get("Bound", 0) == 0


def test_a_pod_deleted_between_event_and_bind(stack, namespace, faulty):
    faulty.hold()
    stack.apply(pod_manifest(namespace, "gone-0", "0=node1:0\n"))
    stack.wait_for(lambda: faulty.queued() >= 1, 20, "the add event queued")
    start = len(faulty.sender.results)
    stack.cp.kubectl("delete", "pod", "-n", namespace, "gone-0", "--grace-period=0", "--force")
    faulty.release()
    stack.wait_for(faulty.idle, 20, "the stale event delivered")
    results = [r for r in faulty.sender.results[start:] if r[0] == "gone-0"]
    assert results and all(status == 200 for _, status, _ in results)
    # The add event meets a pod that no longer exists; the update (deletion timestamp) and
    # delete events are not ours to act on.
    outcomes = Counter(result for _, _, result in results)
    assert outcomes["PodGone"] == 1 and set(outcomes) == {"PodGone", "ignored"}


def test_two_bind_instances_bind_each_pod_exactly_once(stack, namespace):
    stack.source.paused = True
    try:
        stack.apply(sts(namespace, 12))
        stack.wait_for(lambda: len(stack.pods(namespace)) == 12, 60, "12 pods created")
    finally:
        stack.source.paused = False
    second = FunctionServer("bind", {"KUBECONFIG": str(stack.bind_kubeconfig)})
    try:
        answers = []
        for pod in stack.pods(namespace):
            barrier = threading.Barrier(2)

            def send(url, pod=pod):
                barrier.wait()
                answers.append((pod["metadata"]["name"], *post_event(url, pod, stack.cp.server)))
            threads = [threading.Thread(target=send, args=(url,)) for url in (stack.bind_url, second.url)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        second.stop()
    assert {status for _, status, _ in answers} == {200}
    results = Counter((name, body["result"]) for name, _, body in answers)
    for pod in stack.pods(namespace):
        name = pod["metadata"]["name"]
        # Bound once at most; AlreadyBound, or ignored when the copy sent was read after bind's own
        # watch had bound it.
        assert results[(name, "Bound")] <= 1, name
        assert sum(results[(name, r)] for r in ("Bound", "AlreadyBound", "ignored")) == 2, name
        assert pod["spec"]["nodeName"]
    scheduled_once(stack, namespace, names_of(stack.pods(namespace)))


@pytest.mark.controlplane  # its own stack, not the `stack` fixture
def test_the_api_server_killed_three_times_mid_rollout_every_replica_is_bound_within_10_s():
    """Its own stack: kube-apiserver killed for 3 s, three times, each time while a 40-replica
    StatefulSet is being placed. bind's watches list again when it returns (its answers right
    after a restart, 403 "not yet ready", are retried), and every pending pod they find is placed:
    each replica is bound within 10 s of /readyz, or of its creation when the StatefulSet
    controller (itself backing off after the outage) creates it later; no PingSource tick. The
    event source is held throughout: after a restart the real adapter can be silent for minutes."""
    with LocalStack() as own:
        own.source.paused = True
        # The namespaces first: their default ServiceAccounts come from kube-controller-manager,
        # whose own watches back off after each outage; what is tested here is bind's recovery.
        namespaces = [own.create_namespace(f"outage-{rollout}") for rollout in range(3)]
        for rollout, namespace in enumerate(namespaces):
            # Each rollout its own device on every node: three workloads side by side.
            own.apply(statefulset(namespace, "".join(f"{i}=node{i % 4 + 1}:{rollout}\n" for i in range(40)),
                                  replicas=40))
            own.wait_for(lambda: sum(1 for p in own.pods(namespace) if p["spec"].get("nodeName")) >= 3, 60,
                         "the first pods bound", interval=0.05)
            own.cp.stop_apiserver()
            time.sleep(3)
            own.cp.start_apiserver()  # returns once /readyz answers ok
            ready = datetime.now(timezone.utc).replace(microsecond=0)
            try:
                pods = own.wait_bound(namespace, 40, timeout=90)
            except TimeoutError as timeout:  # what bind did, so that a failure says why
                bound = sum(1 for p in own.pods(namespace) if p["spec"].get("nodeName"))
                since = [line for line in own.cp.log_tail("bind", 4000).splitlines()
                         if '"placement"' not in line or '"Bound"' not in line][-80:]
                raise AssertionError(f"restart {rollout + 1}: {timeout}: {bound} of 40 bound; bind's log:\n"
                                     + "\n".join(since)) from None
            waits = {p["metadata"]["name"]: (_scheduled_at(p) - max(ready, _stamp(p["metadata"]["creationTimestamp"])))
                     .total_seconds() for p in pods}
            late = {name: wait for name, wait in waits.items() if wait > 10}
            print(f"restart {rollout + 1}: the longest wait {max(waits.values()):.0f} s after /readyz or creation")
            assert not late, (rollout + 1, late)


def _stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _scheduled_at(pod: dict) -> datetime:
    """When the Binding was made: the API server sets PodScheduled=True as it binds."""
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert condition["status"] == "True", condition
    return _stamp(condition["lastTransitionTime"])
