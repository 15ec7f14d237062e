"""bind's error paths against a fake Kubernetes API. This is the only place the API is faked:
each answer here (403, 500, 409 after a race, an expired Event) is hard to provoke on a real
API server on demand; the real behaviour is shown in test_end_to_end, test_faults and
test_scheduler_contract."""
from __future__ import annotations

import copy
import json
import queue
import sys
import time

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import REPO, sample
from gpu_scheduler import permissions
from gpu_scheduler.binding import PENDING_SELECTOR
from kubeapi.client import CALLS

sys.path.insert(0, str(REPO / "functions" / "bind"))
from placer import Placer  # noqa: E402

POD = sample("apiserversource-add-gpu-scheduler-check-0.json")["body"]  # index 0 -> node1:0,1
NODE = {"metadata": {"name": "node1"}, "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def api_error(status: int, message: str = "") -> ApiException:
    error = ApiException(status=status, reason="x")
    error.body = json.dumps({"message": message or f"status {status}"})
    return error


class FakeApi:
    """Stands in for kubeapi.client.Kube. Answers from a script: {method: [answer, ...]};
    an exception answer is raised; the last answer repeats."""

    def __init__(self, **script):
        self.script = {k: list(v) for k, v in script.items()}
        self.calls: list[tuple[str, tuple, dict]] = []

    def _answer(self, method, *args, **kwargs):
        self.calls.append((method, args, kwargs))
        answers = self.script.get(method) or [None]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def __getattr__(self, method):
        if CALLS.get(method) not in permissions.BIND:  # only what the real client offers bind
            raise AttributeError(method)
        return lambda *args, **kwargs: self._answer(method, *args, **kwargs)

    def list_pods_and_version(self, field_selector, limit=0):
        """As scripted for list_pods; the pending-pod watch's listing as scripted for
        list_pending (by default refused: event pods are read with GETs)."""
        if field_selector == PENDING_SELECTOR:
            return self._answer("list_pending", field_selector, limit), "1"
        return self._answer("list_pods", field_selector), "1"

    def watch_pods(self, field_selector, version, seconds):  # the same, for watch_pending
        return self._answer("watch_pending" if field_selector == PENDING_SELECTOR else "watch_pods",
                            field_selector, version, seconds)

    def called(self, method):
        return [(args, kwargs) for m, args, kwargs in self.calls if m == method]


def placer_with(**script) -> tuple[Placer, FakeApi]:
    script.setdefault("read_node", [NODE])
    script.setdefault("bind", [{}])
    script.setdefault("list_pods", [[]])
    script.setdefault("watch_pods", [api_error(403)])  # no watch: node pods listed (ttl 1 s) instead
    script.setdefault("list_pending", [api_error(403)])
    script.setdefault("watch_pending", [api_error(403)])
    api = FakeApi(**script)
    return Placer(api), api


def placed(placer: Placer, pod=POD) -> dict:
    result = placer.place(copy.deepcopy(pod))
    placer.recorder.flush()
    return result


def event_reasons(api) -> list[tuple[str, str]]:
    return [(body["reason"], body["type"]) for (namespace, body), _ in api.called("create_event")]


def test_a_bind_records_scheduled():
    placer, api = placer_with()
    assert placed(placer) == {"result": "Bound", "pod": "default/gpu-scheduler-check-0", "node": "node1"}
    ((namespace, name, body), _), = api.called("bind")
    assert (namespace, name) == ("default", "gpu-scheduler-check-0")
    assert body["metadata"]["uid"] == POD["metadata"]["uid"] and body["target"]["name"] == "node1"
    assert event_reasons(api) == [("Scheduled", "Normal")]


def test_forbidden_is_a_scheduler_error_not_retried():
    placer, api = placer_with(bind=[api_error(403, "pods/binding is forbidden")])
    result = placed(placer)
    assert result["result"] == "APIError" and "retry" not in result
    assert "forbidden" in result["message"]
    assert event_reasons(api) == [("FailedScheduling", "Warning")]
    ((namespace, name, body), _), = api.called("patch_pod_status")
    condition = body["status"]["conditions"][0]
    assert (condition["reason"], condition["status"]) == ("SchedulerError", "False")
    assert body["metadata"]["uid"] == POD["metadata"]["uid"]


@pytest.mark.parametrize("status", [429, 500, 503, 504])
def test_transient_api_errors_ask_for_redelivery(status):
    placer, api = placer_with(bind=[api_error(status)])
    result = placed(placer)
    assert result["result"] == "Retry" and result["retry"] is True
    assert api.called("patch_pod_status") == []  # no verdict on the pod for a blip


@pytest.mark.parametrize("current, outcome", [
    ({"spec": {"nodeName": "node1"}}, "AlreadyBound"),
    ({"spec": {"nodeName": "node2"}}, "BoundElsewhere"),
    ({"metadata": {"uid": "another"}, "spec": {"nodeName": "node1"}}, "PodReplaced"),
    (api_error(404), "PodGone"),
    (api_error(500), "Retry"),
])
def test_a_conflict_is_judged_by_the_pod_as_it_is_now(current, outcome):
    if isinstance(current, dict):
        pod = copy.deepcopy(POD)
        pod["metadata"].update(current.get("metadata", {}))
        pod["spec"].update(current["spec"])
        current = pod
    placer, api = placer_with(bind=[api_error(409, "already assigned")], read_pod=[current])
    assert placed(placer)["result"] == outcome


def test_a_missing_node_is_unschedulable_and_a_failing_node_read_is_retried():
    placer, api = placer_with(read_node=[api_error(404)])
    result = placed(placer)
    assert result["result"] == "Unschedulable" and "node node1 does not exist" in result["message"]
    assert api.called("bind") == []
    placer, api = placer_with(read_node=[api_error(503)])
    assert placed(placer)["retry"] is True


def test_a_repeated_failure_counts_up_the_event_another_instance_created():
    placer, api = placer_with(read_node=[api_error(404)], create_event=[api_error(409)],
                              read_event=[{"count": 4}])
    placed(placer)
    ((namespace, name, patch), _), = api.called("patch_event")
    assert patch["count"] == 5
    placed(placer)  # the next failure counts on from what this instance wrote
    assert api.called("patch_event")[-1][0][2]["count"] == 6
    assert len(api.called("create_event")) == 1


def test_an_expired_event_is_created_again():
    placer, api = placer_with(read_node=[api_error(404)], create_event=[{}], patch_event=[api_error(404)])
    placed(placer)
    placed(placer)
    assert len(api.called("create_event")) == 2


def test_the_condition_is_written_once_per_reason():
    placer, api = placer_with(read_node=[api_error(404)])
    placed(placer)
    placed(placer)
    assert len(api.called("patch_pod_status")) == 1


def test_resync_retries_when_the_listing_fails_and_places_what_it_lists():
    placer, api = placer_with(list_pods=[api_error(500)])
    assert placer.resync()["retry"] is True
    placer, api = placer_with(list_pods=[[copy.deepcopy(POD)]])
    answer = placer.resync()
    assert answer["outcomes"] == {"Bound": 1} and answer["bound"] == ["default/gpu-scheduler-check-0"]
    assert api.called("list_pods")[0][0] == ("spec.schedulerName=gpu-scheduler,spec.nodeName=",)


def test_the_client_makes_exactly_the_calls_rbac_grants():
    assert set(CALLS.values()) == permissions.BIND | permissions.PLUGIN


# -- an event is a trigger: the pod is read as the API server has it ---------------------------------
def event_placed(placer: Placer, event_pod=POD) -> dict:
    result = placer.place_event(copy.deepcopy(event_pod))
    placer.recorder.flush()
    return result


def test_an_event_is_placed_from_the_live_pod_read_from_the_watch_cache():
    live = copy.deepcopy(POD)
    live["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:2"
    placer, api = placer_with(read_pod=[live])
    assert event_placed(placer)["result"] == "Bound"
    (args, kwargs), = api.called("read_pod")
    assert args == ("default", "gpu-scheduler-check-0") and kwargs == {"cached": True}
    ((_, _, body), _), = api.called("bind")
    assert body["metadata"]["annotations"] == {"gpu-scheduler/devices": "2"}  # the live map's entry


def test_a_pod_not_yet_in_the_watch_cache_is_read_from_etcd():
    placer, api = placer_with(read_pod=[api_error(404), copy.deepcopy(POD)])
    assert event_placed(placer)["result"] == "Bound"
    assert [kwargs for _, kwargs in api.called("read_pod")] == [{"cached": True}, {}]


@pytest.mark.parametrize("answers, outcome", [
    ([api_error(404), api_error(404)], "PodGone"),
    ([{"metadata": {"uid": "another"}, "spec": {"schedulerName": "gpu-scheduler"}}], "PodReplaced"),
    ([api_error(503)], "Retry"),
    ([api_error(403)], "APIError"),
])
def test_what_the_live_read_says_decides(answers, outcome):
    placer, api = placer_with(read_pod=answers)
    assert event_placed(placer)["result"] == outcome
    assert api.called("bind") == []


def test_an_event_for_a_pod_not_ours_reads_nothing():
    other = copy.deepcopy(POD)
    other["spec"]["schedulerName"] = "default-scheduler"
    placer, api = placer_with()
    assert event_placed(placer, other)["result"] == "ignored"
    assert api.calls == []


def test_a_pod_that_does_not_fit_is_unschedulable_and_not_bound():
    holder = {"metadata": {"name": "train-0", "namespace": "team-a", "uid": "u-holder",
                           "annotations": {"gpu-scheduler/devices": "1"}},
              "spec": {"nodeName": "node1", "containers": []}, "status": {"phase": "Running"}}
    placer, api = placer_with(list_pods=[[holder]])
    result = placed(placer)
    assert result["result"] == "Unschedulable" and result["message"].startswith("GPU 1 on node1 is held by team-a/train-0")
    assert api.called("bind") == [] and api.called("list_pods")[0][0] == ("spec.nodeName=node1",)


def test_pings_that_come_while_a_resync_runs_coalesce_into_one_more():
    placer, api = placer_with(list_pods=[[]])
    placer._resyncing.acquire()  # a resync is running
    assert placer.resync()["result"] == "coalesced"
    assert placer.resync()["result"] == "coalesced"
    assert api.called("list_pods") == []
    placer._resyncing.release()
    assert placer.resync()["result"] == "resynced"
    assert len(api.called("list_pods")) == 1


def test_a_refusal_from_the_cached_listing_is_confirmed_with_a_fresh_one():
    holder = {"metadata": {"name": "train-0", "namespace": "team-a", "uid": "u-holder",
                           "annotations": {"gpu-scheduler/devices": "1"}},
              "spec": {"nodeName": "node1", "containers": []}, "status": {"phase": "Running"}}
    placer, api = placer_with(list_pods=[[holder], []])  # the holder is deleted after the first listing
    assert placed(placer)["result"] == "Unschedulable"
    assert len(api.called("list_pods")) == 1  # that listing was fresh: nothing to confirm
    assert placed(placer)["result"] == "Bound"  # the cached one refused; a fresh one showed it gone
    assert len(api.called("list_pods")) == 2


# -- a node's pods, kept current by a watch -------------------------------------------------------
class ScriptedWatch:
    """A watch stream that yields what the test puts in, until None."""

    def __init__(self):
        self.events: queue.Queue = queue.Queue()

    def __iter__(self):
        while (event := self.events.get()) is not None:
            yield (*event, 100)


def applied(placer: Placer, version: str, node: str = "node1") -> None:
    """Wait until the node's watch has taken the event of `version`."""
    deadline = time.monotonic() + 5
    while placer.node_pods._watched.get(node) != version:
        assert time.monotonic() < deadline, f"the watch of {node} never reached version {version}"
        time.sleep(0.005)


def holder_pod(version: str) -> dict:
    return {"metadata": {"name": "train-0", "namespace": "team-a", "uid": "u-holder", "resourceVersion": version,
                         "annotations": {"gpu-scheduler/devices": "1"}},
            "spec": {"nodeName": "node1", "containers": []}, "status": {"phase": "Running"}}


def test_a_watched_node_shows_pods_bound_and_deleted_by_others_without_listing_again():
    stream = ScriptedWatch()
    placer, api = placer_with(list_pods=[[]], watch_pods=[stream])
    first = copy.deepcopy(POD)
    first["metadata"]["uid"] = "u-first"  # an earlier replica of the same workload
    assert placed(placer, first)["result"] == "Bound"  # lists node1 once, then watches it
    ((selector, version, _), _), = api.called("watch_pods")
    assert (selector, version) == ("spec.nodeName=node1", "1")
    stream.events.put(("ADDED", holder_pod("5")))  # another workload's pod bound to node1: holds GPU 1
    applied(placer, "5")
    result = placed(placer)
    assert result["result"] == "Unschedulable" and "GPU 1 on node1 is held by team-a/train-0" in result["message"]
    stream.events.put(("DELETED", holder_pod("6")))
    applied(placer, "6")
    assert placed(placer)["result"] == "Bound"
    assert len(api.called("list_pods")) == 1  # the refusal needed no fresh listing: the watch is current
    stream.events.put(None)


def test_a_pod_finishing_frees_its_gpus_and_bookmarks_move_the_version_only():
    stream = ScriptedWatch()
    placer, api = placer_with(list_pods=[[holder_pod("3")]], watch_pods=[stream])
    assert placed(placer)["result"] == "Unschedulable"
    stream.events.put(("BOOKMARK", {"metadata": {"resourceVersion": "7"}}))
    applied(placer, "7")
    assert placed(placer)["result"] == "Unschedulable"
    finished = holder_pod("8")
    finished["status"]["phase"] = "Succeeded"
    stream.events.put(("MODIFIED", finished))
    applied(placer, "8")
    assert placed(placer)["result"] == "Bound" and len(api.called("list_pods")) == 1
    stream.events.put(None)


def test_a_gone_watch_falls_back_to_listing_the_node():
    stream = ScriptedWatch()
    placer, api = placer_with(list_pods=[[holder_pod("3")], []], watch_pods=[stream])
    assert placed(placer)["result"] == "Unschedulable"
    stream.events.put(("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"}))
    deadline = time.monotonic() + 5
    while "node1" in placer.node_pods._watched:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert placed(placer)["result"] == "Bound"  # the refusal from the kept view was confirmed by a listing
    assert len(api.called("list_pods")) == 2


def test_a_pod_changed_since_its_version_was_read_is_placed_again_from_the_new_one():
    changed = copy.deepcopy(POD)
    changed["metadata"]["resourceVersion"] = "999"
    changed["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:3\n"
    placer, api = placer_with(bind=[api_error(409, "the object has been modified"), {}], read_pod=[changed])
    result = placed(placer)
    assert result["result"] == "Bound"
    (first, _), (second, _) = api.called("bind")
    assert first[2]["metadata"]["resourceVersion"] == POD["metadata"]["resourceVersion"]
    assert second[2]["metadata"]["resourceVersion"] == "999"
    assert second[2]["metadata"]["annotations"]["gpu-scheduler/devices"] == "3"  # decided from the new map


def test_a_pod_changing_again_is_left_to_redelivery():
    placer, api = placer_with(bind=[api_error(409, "the object has been modified")], read_pod=[copy.deepcopy(POD)])
    result = placed(placer)
    assert result["result"] == "Retry" and result["retry"] is True and "changed" in result["message"]
    assert len(api.called("bind")) == 2


# -- an event's pod, read from the pending-pod watch -----------------------------------------------
def pending_watched(placer: Placer, uid: str, version: str) -> None:
    """Wait until the pending-pod watch holds `uid` at `version`."""
    deadline = time.monotonic() + 5
    while placer.pending.get(uid, version) is None:
        assert time.monotonic() < deadline, f"the pending-pod watch never held {uid} at {version}"
        time.sleep(0.005)


def test_an_event_for_a_watched_version_is_placed_from_the_watch_as_the_api_server_has_it():
    stream = ScriptedWatch()
    placer, api = placer_with(list_pending=[[]], watch_pending=[stream])
    uid, version = POD["metadata"]["uid"], POD["metadata"]["resourceVersion"]
    placer.pending.get(uid, version)  # the first lookup starts the watch, from a one-item listing
    watched = copy.deepcopy(POD)
    watched["metadata"]["managedFields"] = [{"manager": "kube-controller-manager", "fieldsV1": {}}]
    stream.events.put(("ADDED", watched))
    pending_watched(placer, uid, version)
    ((_, limit), _), = api.called("list_pending")
    assert limit == 1 and "managedFields" not in placer.pending.get(uid, version)["metadata"]
    forged = copy.deepcopy(POD)  # the real pod's UID and version, another map
    forged["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node9:0\n"
    assert event_placed(placer, forged)["node"] == "node1"  # where the API server's copy says
    assert api.called("read_pod") == []  # no GET
    ((_, _, body), _), = api.called("bind")
    assert body["metadata"]["resourceVersion"] == version and body["target"]["name"] == "node1"
    stream.events.put(None)


def test_an_event_for_another_version_than_the_watched_one_is_read_with_a_get():
    stream = ScriptedWatch()
    placer, api = placer_with(list_pending=[[]], watch_pending=[stream], read_pod=[copy.deepcopy(POD)])
    uid = POD["metadata"]["uid"]
    placer.pending.get(uid, "")
    stream.events.put(("ADDED", copy.deepcopy(POD)))
    pending_watched(placer, uid, POD["metadata"]["resourceVersion"])
    newer = copy.deepcopy(POD)
    newer["metadata"]["resourceVersion"] = "317"
    assert event_placed(placer, newer)["result"] == "Bound"
    assert len(api.called("read_pod")) == 1
    stream.events.put(("DELETED", copy.deepcopy(POD)))  # bound: it left the selector
    deadline = time.monotonic() + 5
    while uid in placer.pending._pods:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert placer.pending._bytes == 0
    stream.events.put(None)


def test_the_pending_pod_watch_keeps_at_most_its_byte_bound():
    stream = ScriptedWatch()
    placer, api = placer_with(list_pending=[[]], watch_pending=[stream])
    placer.pending.MAX_BYTES = 250
    placer.pending.get("x", "1")  # starts it
    for i in range(5):
        pod = copy.deepcopy(POD)
        pod["metadata"].update(uid=f"u-{i}", resourceVersion=str(i + 1))
        stream.events.put(("ADDED", pod))  # 100 bytes each, as the scripted watch says
    deadline = time.monotonic() + 5
    while "u-4" not in placer.pending._pods and len(placer.pending._pods) < 2 or not stream.events.empty():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.05)
    assert sorted(placer.pending._pods) == ["u-0", "u-1"] and placer.pending._bytes == 200
    stream.events.put(None)


def test_a_pod_deleted_while_it_was_placed_again_is_gone():
    placer, api = placer_with(bind=[api_error(409, "the object has been modified")],
                              read_pod=[copy.deepcopy(POD), api_error(404)])
    assert placed(placer)["result"] == "PodGone"
    assert len(api.called("bind")) == 1
