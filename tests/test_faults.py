"""No pod lost or bound twice under duplicated, reordered, dropped and delayed events, an API
server restart, deletions mid-flight and concurrent bind instances. Real control plane."""
from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from conftest import FunctionServer
from localcp.eventsource import Sender, cloudevent_headers
from localcp.stack import LocalStack
from test_end_to_end import pod_manifest, statefulset


def map_for(replicas: int) -> str:
    return "".join(f"{i}=node{i % 4 + 1}:{i % 4}\n" for i in range(replicas))


def sts(namespace: str, replicas: int) -> dict:
    return statefulset(namespace, map_for(replicas), replicas=replicas)


def bound_once(results, names) -> None:
    """Each pod got exactly one successful Binding (others: AlreadyBound or ignored)."""
    bound = Counter(name for name, status, result in results if result == "Bound")
    assert {name: bound[name] for name in names} == {name: 1 for name in names}


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
    stack.wait_for(lambda: faulty._queue.unfinished_tasks >= 90, 30, "90 queued events")
    start = len(faulty.sender.results)
    faulty.release()
    pods = stack.wait_bound(namespace, 30, timeout=90)
    stack.wait_for(faulty.idle, 60, "all copies delivered")
    results = [r for r in faulty.sender.results[start:] if r[0] in names_of(pods)]
    assert {status for _, status, _ in results} == {200}
    bound_once(results, names_of(pods))


def test_thirty_percent_dropped_then_one_resync(stack, namespace, faulty):
    faulty.drop_rate = 0.3
    stack.apply(sts(namespace, 40))
    stack.wait_for(lambda: len(stack.pods(namespace)) == 40, 60, "40 pods created")
    stack.wait_for(faulty.idle, 60, "the surviving events delivered")
    faulty.drop_rate = 0.0
    unbound = [p for p in stack.pods(namespace) if not p["spec"].get("nodeName")]
    assert unbound, "with 30% of events dropped, some pod should have been missed"
    answer = stack.ping()
    assert answer["status"] == 200
    pods = stack.wait_bound(namespace, 40, timeout=10)
    assert len(pods) == 40


def test_a_pod_deleted_between_event_and_bind(stack, namespace, faulty):
    faulty.hold()
    stack.apply(pod_manifest(namespace, "gone-0", "0=node1:0\n"))
    stack.wait_for(lambda: faulty._queue.unfinished_tasks >= 1, 20, "the add event queued")
    start = len(faulty.sender.results)
    stack.cp.kubectl("delete", "pod", "-n", namespace, "gone-0")
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
        assert (results[(name, "Bound")], results[(name, "AlreadyBound")]) == (1, 1), name
        assert pod["spec"]["nodeName"]


def test_an_api_server_outage_mid_rollout_heals_without_a_ping():
    """Its own stack: kube-apiserver killed for 4 s while 40 replicas are being placed. The
    adapter drops each event after 3.1 s of 503s; bind, having seen the API fail, resyncs by
    itself once the API answers again: every replica is bound with no PingSource tick."""
    with LocalStack() as own:
        namespace = own.create_namespace("outage")
        own.source.hold()  # a backlog, as when creation outpaces placement
        own.apply(sts(namespace, 40))
        own.wait_for(lambda: len(own.pods(namespace)) == 40, 120, "40 pods created", interval=0.5)
        own.source.release()
        own.wait_for(lambda: sum(1 for p in own.pods(namespace) if p["spec"].get("nodeName")) >= 10, 60,
                     "the first pods bound", interval=0.05)
        own.cp.stop_apiserver()
        own.wait_for(lambda: 503 in own.source.sender.statuses, 30, "bind answering 503 during the outage")
        time.sleep(4)
        own.cp.start_apiserver()
        returned = time.monotonic()
        try:  # no ping is ever sent; 60 s: a loaded 2-core CI machine restarts kube-apiserver slowly
            pods = own.wait_bound(namespace, 40, timeout=60)
        except TimeoutError as timeout:  # what bind did, so that a failure says why
            bound = sum(1 for p in own.pods(namespace) if p["spec"].get("nodeName"))
            raise AssertionError(f"{timeout}: {bound} of 40 bound; bind's log:\n{own.cp.log_tail('bind', 60)}") from None
        print(f"all 40 bound {time.monotonic() - returned:.1f}s after the API server returned;"
              f" events the adapter gave up on: {len(own.source.sender.dropped)}")
        assert own.source.sender.dropped, "the outage should make the adapter drop events"
        assert {p["spec"]["nodeName"] for p in pods} <= {"node1", "node2", "node3", "node4"}
        assert '"decision": "Recovered"' in own.cp.log_tail("bind", 400)
