"""bind's error paths against a fake Kubernetes API. This is the only place the API is faked:
each answer here (403, 500, 409 after a race, an expired Event) is hard to provoke on a real
API server on demand; the real behaviour is shown in test_end_to_end, test_faults,
test_records_cluster and test_scheduler_contract. The views are filled directly, as their watches
would fill them (no threads)."""
from __future__ import annotations

import copy
import json
import sys
import time

import pytest

from conftest import REPO, sample
from gpu_scheduler import permissions
from gpu_scheduler.records import GRACE_SECONDS, lease_for, record_name, workload_key
from gpu_scheduler.fit import workload
from kubeapi.client import CALLS
from kubeapi.errors import APIError
from kubeapi.projection import PODS

sys.path.insert(0, str(REPO / "functions" / "bind"))
from placer import Placer  # noqa: E402

POD = sample("apiserversource-add-gpu-scheduler-check-0.json")["body"]  # index 0 -> node1:0,1
NODE = {"metadata": {"name": "node1"}, "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}}
MINE = workload_key(workload(POD))


def api_error(status: int, message: str = "", kind: str = "") -> APIError:
    return APIError(status, message or f"status {status}", kind=kind)


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
        if CALLS.get(method) not in permissions.BIND | permissions.BIND_RECORDS:  # only what bind may call
            raise AttributeError(method)
        return lambda *args, **kwargs: self._answer(method, *args, **kwargs)

    def called(self, method):
        return [(args, kwargs) for m, args, kwargs in self.calls if m == method]


def synced_placer(api, pods=(), nodes=(NODE,), leases=()) -> Placer:
    """A Placer over `api` with no watches and no workers: its views filled as their listings
    would fill them."""
    placer = Placer(api)
    placer._started = True
    placer.views.handlers.replace_nodes([list(nodes)])
    placer.views.handlers.replace_pods([[copy.deepcopy(p) for p in pods]])
    placer.views.handlers.replace_records([list(leases)])
    for informer in placer.views.informers:
        informer.synced.set()
    return placer


def placer_with(pods=(), nodes=(NODE,), leases=(), **script) -> tuple[Placer, FakeApi]:
    script.setdefault("bind", [{}])
    script.setdefault("create_lease", [{}])
    script.setdefault("list_pods", [[]])
    api = FakeApi(**script)
    return synced_placer(api, pods, nodes, leases), api


def placed(placer: Placer, pod=POD) -> dict:
    result = placer.place(copy.deepcopy(pod)).outcome
    placer.recorder.flush()
    return result


def event_reasons(api) -> list[tuple[str, str]]:
    return [(body["reason"], body["type"]) for (namespace, body), _ in api.called("create_event")]


def lease(holder: str, age: float = 0.0, device: str = "0", version: str = "5", **extra) -> dict:
    body = lease_for("node1", device, (holder,), False, "team-a/train-0", "u-holder", time.time() - age)
    body["metadata"]["resourceVersion"] = version
    body["metadata"]["annotations"].update(extra)
    return body


def holder_pod(devices: str = "1", phase: str = "Running") -> dict:
    return {"metadata": {"name": "train-0", "namespace": "team-a", "uid": "u-holder",
                         "ownerReferences": [{"kind": "StatefulSet", "name": "train", "controller": True}],
                         "annotations": {"gpu-scheduler/devices": devices}},
            "spec": {"nodeName": "node1", "containers": []}, "status": {"phase": phase}}


def scoped_placer(nodes=(NODE,), leases=(), **script) -> tuple[Placer, FakeApi]:
    """A Placer starting cold (functions/bind/scope.py): every view listed but the pods', whose
    listing is not in yet; bind's pending pods listed (none). What a cycle reads of the pods,
    `list_pods` (a node's) and `list_namespaced_pods` (a namespace's) answer."""
    script.setdefault("bind", [{}])
    script.setdefault("create_lease", [{}])
    script.setdefault("list_pods", [[]])
    script.setdefault("list_namespaced_pods", [iter([([], "7")])])
    api = FakeApi(**script)
    placer = Placer(api)
    placer._started = True
    placer.views.handlers.replace_nodes([list(nodes)])
    placer.views.handlers.replace_records([list(leases)])
    for informer in placer.views.informers:
        if informer.name != "pods":
            informer.synced.set()
    placer.views.scope.pending_listed.set()
    placer._records_checked.set()
    return placer, api


def test_a_cold_bind_places_from_the_pods_of_the_pods_node_and_namespace():
    placer, api = scoped_placer()
    assert placer.readiness().ready and not placer.views.pods_listed()
    assert placed(placer)["result"] == "Bound"
    [((node_selector, _), _)] = api.called("list_pods")
    assert node_selector.startswith("spec.nodeName=node1,")
    [((namespace, *_), _)] = api.called("list_namespaced_pods")
    assert namespace == "default"
    assert event_reasons(api) == [("Scheduled", "Normal")]


def test_a_refusal_on_scoped_reads_is_not_said_and_is_decided_again_once_every_pod_is_listed():
    """A fresh record names a pod that is on no node read and not pending: read by name, it is
    bound on another node, so the GPU is held and the pod refused. From scoped reads bind says
    nothing and writes nothing; the whole listing queues the pod again, and its refusal is said."""
    elsewhere = {**holder_pod("0"), "spec": {"nodeName": "node2", "containers": []}}
    placer, api = scoped_placer(leases=[lease("StatefulSet team-a/train")], read_pod=[copy.deepcopy(elsewhere)])
    assert placed(placer) == {"result": "Deferred", "pod": "default/gpu-scheduler-check-0",
                              "message": "refused on the pods read for it; decided again once bind has listed every pod"}
    assert api.called("bind") == [] and api.called("create_lease") == [] and event_reasons(api) == []
    placer.views.informers[0].version = "9"
    placer.views.handlers.replace_pods([[copy.deepcopy(POD), elsewhere]])
    assert placer.queue.pop(timeout=0) == POD["metadata"]["uid"]
    outcome = placed(placer)
    assert outcome["result"] == "Unschedulable" and outcome["message"].startswith("GPU 0 on node1 was given to")
    assert event_reasons(api) == [("FailedScheduling", "Warning")]


def test_a_record_of_a_pod_read_gone_frees_its_gpu_on_scoped_reads():
    """The pod a fresh record names is not found by name (deleted while bind slept): its GPU is
    free, as the whole view would know it, and the pod is placed from scoped reads."""
    placer, api = scoped_placer(leases=[lease("StatefulSet team-a/train")], update_lease=[{}],
                                read_pod=[api_error(404, "pods \"train-0\" not found", kind="pods")])
    assert placed(placer)["result"] == "Bound"
    [((namespace, name), _)] = api.called("read_pod")
    assert (namespace, name) == ("team-a", "train-0")


def test_a_scoped_read_that_fails_is_retried_and_writes_nothing():
    placer, api = scoped_placer(list_namespaced_pods=[api_error(503, "etcd leader changed")])
    outcome = placed(placer)
    assert outcome["result"] == "Retry" and "reading the pods its decision needs" in outcome["message"]
    assert api.called("bind") == [] and api.called("create_lease") == []


def test_a_scoped_listing_after_the_whole_one_changes_nothing():
    placer, _ = synced_placer_with_nothing()
    elsewhere = {**copy.deepcopy(POD), "spec": {**POD["spec"], "nodeName": "node1"}}
    placer.views.handlers.merge_pods([[elsewhere]])
    assert placer.views.assigned_node(POD["metadata"]["uid"]) is None


def synced_placer_with_nothing() -> tuple[Placer, FakeApi]:
    api = FakeApi()
    return synced_placer(api), api


def test_a_bind_records_its_devices_then_binds():
    placer, api = placer_with()
    assert placed(placer) == {"result": "Bound", "pod": "default/gpu-scheduler-check-0", "node": "node1"}
    created = [args[1] for args, _ in api.called("create_lease")]
    assert [c["metadata"]["name"] for c in created] == ["node1.gpu-0", "node1.gpu-1"]
    assert all(json.loads(c["metadata"]["annotations"]["gpu-scheduler/holders"]) == [MINE] for c in created)
    assert [m for m, _, _ in api.calls if m in ("create_lease", "bind")] == ["create_lease", "create_lease", "bind"]
    ((namespace, name, body), _), = api.called("bind")
    assert body["metadata"]["uid"] == POD["metadata"]["uid"] and body["target"]["name"] == "node1"
    assert event_reasons(api) == [("Scheduled", "Normal")]


def test_a_sibling_of_the_holder_writes_nothing_while_the_record_is_fresh():
    placer, api = placer_with(leases=[lease(MINE, device="0"), lease(MINE, device="1", version="6")])
    assert placed(placer)["result"] == "Bound"
    assert api.called("create_lease") == [] and api.called("update_lease") == []


def test_an_old_record_of_the_same_workload_is_renewed_at_its_version():
    placer, api = placer_with(leases=[lease(MINE, age=GRACE_SECONDS, device="0"), lease(MINE, device="1")],
                              update_lease=[{}])
    assert placed(placer)["result"] == "Bound"
    ((namespace, name, body), _), = api.called("update_lease")
    assert name == "node1.gpu-0" and body["metadata"]["resourceVersion"] == "5"


def test_a_record_held_by_a_running_pod_of_another_workload_refuses():
    placer, api = placer_with(pods=[holder_pod("0")], leases=[lease("StatefulSet team-a/train", age=3600)])
    result = placed(placer)
    assert result["result"] == "Unschedulable" and result["message"].startswith("GPU 0 on node1 is held by team-a/train-0")
    assert api.called("bind") == [] and api.called("create_lease") == []


def test_a_fresh_record_of_another_workload_refuses_even_before_its_pod_shows():
    placer, api = placer_with(leases=[lease("StatefulSet team-a/train")])
    result = placed(placer)
    assert result["result"] == "Unschedulable" and "was given to team-a/train-0" in result["message"]


def test_a_fresh_record_whose_pod_was_seen_deleted_is_taken_over():
    placer, api = placer_with(pods=[holder_pod("0")], leases=[lease("StatefulSet team-a/train")], update_lease=[{}])
    assert placed(placer)["result"] == "Unschedulable"
    placer.views.handlers.apply_pod("DELETED", holder_pod("0"))
    assert placed(placer)["result"] == "Bound"


def test_a_fresh_record_whose_pod_a_newer_view_does_not_hold_is_taken_over():
    """A pod deleted before this instance started: its view, past the record's version, lacks it."""
    placer, api = placer_with(leases=[lease("StatefulSet team-a/train", version="5")], update_lease=[{}])
    placer.views.informers[0].version = "4"  # not yet past the record: the pod may be on its way
    assert placed(placer)["result"] == "Unschedulable"
    placer.views.informers[0].version = "6"
    assert placed(placer)["result"] == "Bound"


def test_a_record_whose_pods_are_gone_is_taken_over_at_its_version():
    placer, api = placer_with(leases=[lease("StatefulSet team-a/train", age=GRACE_SECONDS + 1)], update_lease=[{}])
    assert placed(placer)["result"] == "Bound"
    ((_, name, body), _), = api.called("update_lease")
    assert name == "node1.gpu-0" and body["metadata"]["resourceVersion"] == "5"
    assert json.loads(body["metadata"]["annotations"]["gpu-scheduler/holders"]) == [MINE]


def test_another_instance_writing_first_is_read_and_refuses():
    other = lease("StatefulSet team-a/train")
    placer, api = placer_with(create_lease=[api_error(409, "already exists")], read_lease=[other])
    result = placed(placer)
    assert result["result"] == "Unschedulable" and "team-a/train-0" in result["message"]
    assert api.called("bind") == []


def test_another_instance_of_the_same_workload_writing_first_is_fine():
    placer, api = placer_with(create_lease=[api_error(409, "already exists"), {}], read_lease=[lease(MINE)])
    assert placed(placer)["result"] == "Bound"


@pytest.mark.parametrize("error", [api_error(503), api_error(403, "forbidden: not yet ready to handle request"),
                                   api_error(429)])
def test_a_transient_failure_writing_the_record_is_retried_and_binds_nothing(error):
    placer, api = placer_with(create_lease=[error])
    attempt = placer.place(copy.deepcopy(POD))
    assert attempt.retry and attempt.outcome["result"] == "Retry" and api.called("bind") == []


def test_forbidden_is_a_scheduler_error_retried_after_backoff():
    placer, api = placer_with(bind=[api_error(403, "pods/binding is forbidden")])
    attempt = placer.place(copy.deepcopy(POD))
    placer.recorder.flush()
    assert attempt.outcome["result"] == "APIError" and attempt.retry and "forbidden" in attempt.outcome["message"]
    ((namespace, name, body), _), = api.called("patch_pod_status")
    condition = body["status"]["conditions"][0]
    assert (condition["reason"], condition["status"]) == ("SchedulerError", "False")


@pytest.mark.parametrize("status", [429, 500, 503, 504])
def test_transient_binding_errors_are_retried_by_the_queue_not_redelivered(status):
    placer, api = placer_with(bind=[api_error(status)])
    attempt = placer.place(copy.deepcopy(POD))
    assert attempt.retry and attempt.outcome["result"] == "Retry" and "retry" not in attempt.outcome
    placer.recorder.flush()
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


def test_a_missing_node_is_unschedulable_until_a_node_is_added():
    placer, api = placer_with(nodes=())
    attempt = placer.place(copy.deepcopy(POD))
    assert attempt.outcome["result"] == "Unschedulable" and "node node1 does not exist" in attempt.outcome["message"]
    assert attempt.refused.filter == "NodeExists" and api.called("bind") == []


def test_a_repeated_failure_counts_up_the_event_another_instance_created():
    placer, api = placer_with(nodes=(), create_event=[api_error(409)], read_event=[{"count": 4}])
    placed(placer)
    ((namespace, name, patch), _), = api.called("patch_event")
    assert patch["count"] == 5
    placed(placer)  # the next failure counts on from what this instance wrote
    assert api.called("patch_event")[-1][0][2]["count"] == 6
    assert len(api.called("create_event")) == 1


def test_an_expired_event_is_created_again():
    placer, api = placer_with(nodes=(), create_event=[{}], patch_event=[api_error(404)])
    placed(placer)
    placed(placer)
    assert len(api.called("create_event")) == 2


def test_the_condition_is_written_once_per_reason():
    placer, api = placer_with(nodes=())
    placed(placer)
    placed(placer)
    assert len(api.called("patch_pod_status")) == 1


def test_the_client_makes_exactly_the_calls_rbac_grants():
    from kubeapi.client import ALSO_NEEDS

    also = {need for needs in ALSO_NEEDS.values() for need in needs}
    assert set(CALLS.values()) | also == (permissions.BIND | permissions.BIND_RECORDS | permissions.PLUGIN | permissions.MUTATE
                                   | permissions.UNINSTALL | permissions.UNINSTALL_RECORDS)


def test_a_pod_that_does_not_fit_is_unschedulable_and_not_bound():
    placer, api = placer_with(pods=[holder_pod("1")])
    attempt = placer.place(copy.deepcopy(POD))
    assert attempt.outcome["result"] == "Unschedulable"
    assert attempt.outcome["message"].startswith("GPU 1 on node1 is held by team-a/train-0")
    assert attempt.refused.filter == "GPUsHeld" and api.called("bind") == []


def test_a_holder_that_finished_frees_its_gpus():
    placer, api = placer_with(pods=[holder_pod("1", phase="Succeeded")])
    assert placed(placer)["result"] == "Bound"


def test_a_pod_changed_since_its_version_was_read_is_placed_again_from_the_new_one():
    newer = copy.deepcopy(POD)
    newer["metadata"]["resourceVersion"] = "999"
    newer["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:3"
    placer, api = placer_with(bind=[api_error(409, "changed"), {}], read_pod=[copy.deepcopy(POD), newer])
    assert placed(placer)["result"] == "Bound"
    bodies = [args[2] for args, _ in api.called("bind")]
    assert [b["metadata"]["annotations"]["gpu-scheduler/devices"] for b in bodies] == ["0,1", "3"]


def test_a_pod_whose_status_alone_changed_is_bound_at_its_new_version_as_decided():
    """bind's own PodScheduled=False write lands after a later attempt decided (a gang's members):
    the Binding is made again at the new version, without deciding again."""
    newer = copy.deepcopy(POD)
    newer["metadata"]["resourceVersion"] = "999"
    newer["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    placer, api = placer_with(bind=[api_error(409, "changed"), {}], read_pod=[newer])
    assert placed(placer)["result"] == "Bound"
    versions = [args[2]["metadata"].get("resourceVersion") for args, _ in api.called("bind")]
    assert versions[1] == "999" and versions[0] != "999" and len(api.called("read_pod")) == 1


# -- an event is a trigger: the pod is the API server's ---------------------------------------------
def event_placed(placer: Placer, event_pod=POD) -> dict:
    result = placer.place_event(copy.deepcopy(event_pod))
    placer.recorder.flush()
    return result


def test_an_event_for_a_watched_pod_is_placed_from_the_watch_as_the_api_server_has_it():
    live = copy.deepcopy(POD)
    live["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:2"
    placer, api = placer_with(pods=[live])
    forged = copy.deepcopy(POD)
    forged["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:3"
    assert event_placed(placer, forged)["result"] == "Bound"
    assert api.called("read_pod") == []
    ((_, _, body), _), = api.called("bind")
    assert body["metadata"]["annotations"] == {"gpu-scheduler/devices": "2"}  # the live map's entry


def test_an_event_for_a_pod_the_watch_has_not_shown_is_read_from_the_cache_then_etcd():
    placer, api = placer_with(read_pod=[api_error(404), copy.deepcopy(POD)])
    assert event_placed(placer)["result"] == "Bound"
    assert [kwargs for _, kwargs in api.called("read_pod")] == [{"cached": True, "projection": PODS},
                                                                {"projection": PODS}]


@pytest.mark.parametrize("answers, outcome", [
    ([api_error(404), api_error(404)], "PodGone"),
    ([{"metadata": {"uid": "another"}, "spec": {"schedulerName": "gpu-scheduler"}}], "PodReplaced"),
    ([api_error(503)], "Retry"),
    ([api_error(403)], "APIError"),
])
def test_what_the_live_read_says_decides(answers, outcome):
    placer, api = placer_with(read_pod=answers)
    answer = event_placed(placer)
    assert answer["result"] == outcome and "retry" not in answer  # never a 503: redelivery cannot help
    assert api.called("bind") == []


def test_an_event_whose_pod_cannot_be_read_is_kept_and_placed_when_the_api_answers():
    placer, api = placer_with(read_pod=[api_error(503), copy.deepcopy(POD)])
    answer = event_placed(placer)
    assert answer["result"] == "Retry" and answer["queued"] is True
    uid = POD["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    assert placer._attempt_claimed(uid)["result"] == "Bound"


def test_an_event_for_a_pod_not_ours_reads_nothing():
    other = copy.deepcopy(POD)
    other["spec"]["schedulerName"] = "default-scheduler"
    placer, api = placer_with()
    assert event_placed(placer, other)["result"] == "ignored"
    assert api.calls == []


def test_no_api_configuration_asks_for_redelivery():
    placer = Placer(None, problem="no kubeconfig")
    assert placer.place_event(copy.deepcopy(POD))["retry"] is True
    assert placer.resync()["retry"] is True and not placer.ready()


# -- the queue --------------------------------------------------------------------------------------
def test_a_pending_pod_in_the_listing_is_queued_and_placed_without_an_event():
    placer, api = placer_with(pods=[copy.deepcopy(POD)])
    uid = POD["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    assert placer._attempt_claimed(uid)["result"] == "Bound"


def test_an_unschedulable_pod_is_tried_again_when_its_holder_leaves():
    holder = holder_pod("1")
    placer, api = placer_with(pods=[holder, copy.deepcopy(POD)])
    uid = POD["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    assert placer._attempt_claimed(uid)["result"] == "Unschedulable"
    assert placer.queue.pop(timeout=0.1) is None  # waits for an event, not a timer
    placer.views.handlers.apply_node("MODIFIED", {**NODE, "metadata": {"name": "node1", "labels": {"x": "y"}}})
    assert placer.queue.pop(timeout=0.1) is None  # a node change cannot free a GPU
    placer.views.handlers.apply_pod("DELETED", holder)
    assert placer.queue.pop(timeout=2) == uid  # after its backoff
    assert placer._attempt_claimed(uid)["result"] == "Bound"


def test_a_pod_refused_by_its_selector_is_tried_again_when_the_node_gains_the_label():
    pod = copy.deepcopy(POD)
    pod["spec"]["nodeSelector"] = {"zone": "b"}
    placer, api = placer_with(pods=[pod])
    uid = pod["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    assert placer._attempt_claimed(uid)["result"] == "Unschedulable"
    placer.views.handlers.apply_node("MODIFIED", {**NODE, "metadata": {"name": "node1", "labels": {"zone": "b"}}})
    assert placer.queue.pop(timeout=2) == uid
    assert placer._attempt_claimed(uid)["result"] == "Bound"


def test_a_status_update_of_a_pending_pod_does_not_requeue_it():
    placer, api = placer_with(nodes=(), pods=[copy.deepcopy(POD)])
    uid = POD["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    placer._attempt_claimed(uid)
    updated = copy.deepcopy(POD)
    updated["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    placer.views.handlers.apply_pod("MODIFIED", updated)
    assert placer.queue.pop(timeout=0.1) is None
    updated["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node2:0"
    placer.views.handlers.apply_pod("MODIFIED", updated)
    assert placer.queue.pop(timeout=0.1) == uid


def test_pings_that_come_while_a_resync_runs_coalesce_into_one_more():
    placer, api = placer_with(list_pods=[[]])
    placer._resyncing.acquire()  # a resync is running
    assert placer.resync()["result"] == "coalesced"
    assert placer.resync()["result"] == "coalesced"
    assert api.called("list_pods") == []
    placer._resyncing.release()
    assert placer.resync()["result"] == "resynced"
    assert len(api.called("list_pods")) == 1


def test_a_record_nobody_holds_is_swept_at_its_version():
    placer, api = placer_with(leases=[lease("StatefulSet team-a/train", age=GRACE_SECONDS + 1),
                                      lease("StatefulSet team-a/other", device="2")], delete_lease=[{}])
    assert placer.sweep_records() == 1
    ((namespace, name, version), _), = api.called("delete_lease")
    assert (name, version) == (record_name("node1", "0"), "5")


# -- DRA mode: the pod's ResourceClaim, allocated and reserved before the Binding ------------------------
from gpu_scheduler.plugins.dynamicresources.allocator import FINALIZER, Device, allocation_for  # noqa: E402

DRA_POD = copy.deepcopy(POD)
DRA_POD["spec"]["resourceClaims"] = [{"name": "gpu-scheduler", "resourceClaimName": "gpu-scheduler-check-0-gpus"}]
CLAIM = "gpu-scheduler-check-0-gpus"
NVIDIA = "gpu.nvidia.com"
SLICE = {"metadata": {"name": "node1-gpus"},
         "spec": {"driver": NVIDIA, "nodeName": "node1", "pool": {"name": "node1", "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": f"gpu-{i}"} for i in range(4)]}}
WANTED_RESULTS = [{"request": f"gpu-{i}", "driver": NVIDIA, "pool": "node1", "device": f"gpu-{i}"} for i in (0, 1)]
RESERVED = [{"resource": "pods", "name": "gpu-scheduler-check-0", "uid": POD["metadata"]["uid"]}]


def echo(version):
    """An API answer: the body written, at a new resourceVersion."""
    def answer(body):
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = version
        return body
    return answer


class ClaimApi(FakeApi):
    """FakeApi whose claim writes answer with what was written (unless scripted otherwise)."""

    def _answer(self, method, *args, **kwargs):
        answer = super()._answer(method, *args, **kwargs)
        if answer is None and method in ("create_resource_claim", "update_resource_claim", "update_resource_claim_status"):
            body = copy.deepcopy(args[-1])
            body["metadata"]["resourceVersion"] = str(len(self.calls))
            body["metadata"].setdefault("uid", "c-1")
            return body
        return answer


def dra_placer(slices=(SLICE,), claims=(), **script):
    script.setdefault("bind", [{}])
    script.setdefault("create_lease", [{}])
    api = ClaimApi(**script)
    placer = synced_placer(api)
    placer.views.handlers.replace_slices([list(slices)])
    placer.views.handlers.replace_claims([copy.deepcopy(list(claims))])
    return placer, api


def our_claim(**status):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": CLAIM, "namespace": "default", "uid": "c-1", "resourceVersion": "20",
                         "finalizers": [FINALIZER],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "gpu-scheduler-check-0",
                                              "uid": POD["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"devices": {"requests": [{"name": f"gpu-{i}", "exactly": {
                "deviceClassName": NVIDIA, "allocationMode": "ExactCount", "count": 1}} for i in (0, 1)]}},
            "status": dict(status)}
    return body


def allocated_to(results, node="node1"):
    return {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


def claim_writes(api):
    return [m for m, _, _ in api.calls if "resource_claim" in m or m in ("create_lease", "bind")]


def test_dra_a_pod_gets_its_claim_created_finalized_allocated_and_reserved_then_is_bound():
    placer, api = dra_placer()
    assert placed(placer, DRA_POD)["result"] == "Bound"
    assert claim_writes(api) == ["create_lease", "create_lease", "create_resource_claim", "update_resource_claim",
                                 "update_resource_claim_status", "bind"]
    ((namespace, created), _), = api.called("create_resource_claim")
    assert namespace == "default" and created["metadata"]["name"] == CLAIM
    assert created["metadata"]["ownerReferences"][0]["uid"] == POD["metadata"]["uid"]
    ((_, name, finalized), _), = api.called("update_resource_claim")
    assert name == CLAIM and finalized["metadata"]["finalizers"] == [FINALIZER]
    ((_, _, status), _), = api.called("update_resource_claim_status")
    # Each write at the version the one before answered with (ClaimApi: the number of calls made).
    assert (finalized["metadata"]["resourceVersion"], status["metadata"]["resourceVersion"]) == ("3", "4")
    assert status["status"] == {"allocation": allocated_to(WANTED_RESULTS), "reservedFor": RESERVED}


def test_dra_a_claim_already_allocated_and_reserved_as_wanted_is_kept():
    placer, api = dra_placer(claims=[our_claim(allocation=allocated_to(WANTED_RESULTS), reservedFor=RESERVED)])
    assert placed(placer, DRA_POD)["result"] == "Bound"
    assert [m for m in claim_writes(api) if "claim" in m] == []


def test_dra_a_409_on_create_reads_the_claim_and_goes_on_from_it():
    placer, api = dra_placer(create_resource_claim=[api_error(409, "already exists")], read_resource_claim=[our_claim()])
    assert placed(placer, DRA_POD)["result"] == "Bound"
    assert [m for m in claim_writes(api) if "claim" in m] == ["create_resource_claim", "read_resource_claim",
                                                              "update_resource_claim_status"]
    ((_, _, status), _), = api.called("update_resource_claim_status")
    assert status["metadata"]["resourceVersion"] == "20"


def test_dra_a_409_on_the_status_whose_winner_allocated_as_wanted_binds():
    done = our_claim(allocation=allocated_to(WANTED_RESULTS), reservedFor=RESERVED)
    placer, api = dra_placer(claims=[our_claim()], update_resource_claim_status=[api_error(409, "conflict")],
                             read_resource_claim=[done])
    assert placed(placer, DRA_POD)["result"] == "Bound"
    assert len(api.called("update_resource_claim_status")) == 1


def test_dra_a_409_on_the_status_whose_winner_allocated_elsewhere_is_reported_not_overwritten():
    other = [{"request": f"gpu-{i}", "driver": NVIDIA, "pool": "node1", "device": f"gpu-{i}"} for i in (2, 3)]
    placer, api = dra_placer(claims=[our_claim()], update_resource_claim_status=[api_error(409, "conflict")],
                             read_resource_claim=[our_claim(allocation=allocated_to(other))])
    attempt = placer.place(copy.deepcopy(DRA_POD))
    assert attempt.outcome["result"] == "Unschedulable" and "allocated to other devices" in attempt.outcome["message"]
    assert attempt.refused.filter == "DynamicResources" and api.called("bind") == []
    assert len(api.called("update_resource_claim_status")) == 1


def test_dra_a_device_allocated_in_another_claim_refuses_before_any_write():
    theirs = {"metadata": {"name": "inference", "namespace": "team-b", "resourceVersion": "3"},
              "status": {"allocation": allocated_to([{"request": "r", "driver": NVIDIA, "pool": "node1", "device": "gpu-1"}])}}
    placer, api = dra_placer(claims=[theirs])
    attempt = placer.place(copy.deepcopy(DRA_POD))
    assert attempt.outcome["result"] == "Unschedulable" and attempt.refused.filter == "DynamicResources"
    assert attempt.outcome["message"] == (f"map entry 0=node1:0,1: device 1 ({NVIDIA}/node1/gpu-1) is allocated in"
                                          " ResourceClaim team-b/inference")
    assert claim_writes(api) == []


def test_dra_a_pod_refused_for_want_of_devices_is_tried_again_when_its_node_publishes_them():
    placer, api = dra_placer(slices=())
    placer.views.handlers.apply_pod("ADDED", copy.deepcopy(DRA_POD))
    uid = POD["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    outcome = placer._attempt_claimed(uid)
    assert outcome["result"] == "Unschedulable" and "matches no device" in outcome["message"]
    placer.views.handlers.apply_slice("ADDED", {**SLICE, "spec": {**SLICE["spec"], "nodeName": "node2"}})
    assert placer.queue.pop(timeout=0.1) is None  # another node's devices
    placer.views.handlers.apply_slice("ADDED", SLICE)
    assert placer.queue.pop(timeout=2) == uid
    assert placer._attempt_claimed(uid)["result"] == "Bound"


def test_dra_a_pod_refused_for_a_held_device_is_tried_again_when_that_claim_goes():
    theirs = {"metadata": {"name": "inference", "namespace": "team-b", "resourceVersion": "3"},
              "status": {"allocation": allocated_to([{"request": "r", "driver": NVIDIA, "pool": "node1", "device": "gpu-0"}])}}
    placer, api = dra_placer(claims=[theirs])
    placer.views.handlers.apply_pod("ADDED", copy.deepcopy(DRA_POD))
    uid = POD["metadata"]["uid"]
    assert placer.queue.pop(timeout=0.1) == uid
    assert placer._attempt_claimed(uid)["result"] == "Unschedulable"
    placer.views.handlers.apply_claim("DELETED", theirs)
    assert placer.queue.pop(timeout=2) == uid
    assert placer._attempt_claimed(uid)["result"] == "Bound"


def test_dra_a_claim_of_a_former_pod_of_the_same_name_waits_for_its_deletion():
    old = our_claim(allocation=allocated_to(WANTED_RESULTS), reservedFor=[{"resource": "pods", "name": "x", "uid": "u-old"}])
    old["metadata"]["ownerReferences"][0]["uid"] = "u-old"
    placer, api = dra_placer(claims=[old])
    attempt = placer.place(copy.deepcopy(DRA_POD))
    # Its devices are held by that claim (another owner's), which the refusal names.
    assert attempt.outcome["result"] == "Unschedulable" and attempt.refused.filter == "DynamicResources"
    assert claim_writes(api) == []


@pytest.mark.parametrize("method", ["create_resource_claim", "update_resource_claim", "update_resource_claim_status"])
def test_dra_a_transient_failure_writing_the_claim_is_retried_and_binds_nothing(method):
    placer, api = dra_placer(**{method: [api_error(503)]})
    attempt = placer.place(copy.deepcopy(DRA_POD))
    assert attempt.retry and attempt.outcome["result"] == "Retry" and api.called("bind") == []
    assert f"ResourceClaim default/{CLAIM}" in attempt.outcome["message"]


def test_dra_a_claim_that_keeps_changing_is_retried():
    placer, api = dra_placer(claims=[our_claim()], update_resource_claim_status=[api_error(409)],
                             read_resource_claim=[our_claim()])
    attempt = placer.place(copy.deepcopy(DRA_POD))
    assert attempt.retry and "changed 5 times" in attempt.outcome["message"] and api.called("bind") == []


def test_dra_a_pod_naming_another_claim_is_refused():
    pod = copy.deepcopy(DRA_POD)
    pod["spec"]["resourceClaims"][0]["resourceClaimName"] = "someone-elses"
    placer, api = dra_placer()
    attempt = placer.place(pod)
    assert attempt.outcome["result"] == "Unschedulable" and "must name ResourceClaim" in attempt.outcome["message"]


def test_env_mode_pods_touch_no_claims():
    placer, api = dra_placer(slices=())
    assert placed(placer)["result"] == "Bound"
    assert [m for m in claim_writes(api) if "claim" in m] == []


def test_dra_a_claim_deallocated_frees_its_devices_and_two_claims_of_one_device_both_count():
    def theirs(name, device=None):
        body = {"metadata": {"name": name, "namespace": "team-b", "resourceVersion": "3"}, "status": {}}
        if device:
            body["status"]["allocation"] = allocated_to([{"request": "r", "driver": NVIDIA, "pool": "node1", "device": device}])
        return body

    placer, api = dra_placer(claims=[theirs("a", "gpu-0"), theirs("b", "gpu-0")])
    assert "ResourceClaim team-b/a" in placer.place(copy.deepcopy(DRA_POD)).outcome["message"]
    placer.views.handlers.apply_claim("MODIFIED", {**theirs("a"), "metadata": {**theirs("a")["metadata"], "resourceVersion": "4"}})
    assert "ResourceClaim team-b/b" in placer.place(copy.deepcopy(DRA_POD)).outcome["message"]
    placer.views.handlers.apply_claim("DELETED", theirs("b", "gpu-0"))
    assert placed(placer, DRA_POD)["result"] == "Bound"


def test_dra_a_pod_asking_for_dra_admitted_without_the_webhook_is_refused_until_it_changes():
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"]["gpu-scheduler/device-env"] = "dra"
    placer, api = dra_placer()
    attempt = placer.place(pod)
    assert attempt.outcome["result"] == "Unschedulable" and attempt.refused.filter == "DynamicResources"
    assert "admitted without gpu-scheduler's webhook" in attempt.outcome["message"] and claim_writes(api) == []


def test_dra_a_pod_on_an_api_server_without_dra_is_refused_saying_so():
    """Before Kubernetes 1.34 the DRA watches find no resource.k8s.io/v1 (404): bind, in any device
    env mode but dra, is ready with empty views, and a pod that asks for dra is refused with the
    reason, writing nothing."""
    placer, api = dra_placer()
    for informer in placer.views.informers:
        if informer.optional:
            informer.served = False
    attempt = placer.place(copy.deepcopy(DRA_POD))
    assert attempt.outcome["result"] == "Unschedulable" and attempt.refused.filter == "DynamicResources"
    assert "does not serve resource.k8s.io/v1" in attempt.outcome["message"]
    assert claim_writes(api) == []


# -- device env mode dra on an API server without resource.k8s.io/v1: not ready, saying why ---------
class VersionedApi(FakeApi):
    """FakeApi that also answers GET /version (scripted as `version`)."""

    def server_version(self):
        return self._answer("version")


def placer_on_a_server_without_dra(mode: str, version) -> tuple[Placer, VersionedApi]:
    """A Placer whose core watches have listed and whose DRA watches have just found
    resource.k8s.io/v1 missing (their 404), as on an API server before 1.34."""
    import informers
    from config import BindConfig

    api = VersionedApi(version=[version])
    placer = Placer(api, BindConfig(device_mode=mode))
    placer._started = True
    placer._records_checked.set()
    slept, informers.NOT_SERVED_RETRY_SECONDS = informers.NOT_SERVED_RETRY_SECONDS, 0
    try:
        for informer in placer.views.informers:
            if informer.optional:
                informer._not_served()
            else:
                informer.synced.set()
    finally:
        informers.NOT_SERVED_RETRY_SECONDS = slept
    return placer, api


def test_dra_mode_on_an_api_server_without_dra_is_not_ready_naming_the_version_it_needs(caplog):
    with caplog.at_level("INFO", logger="bind"):
        placer, api = placer_on_a_server_without_dra("dra", {"gitVersion": "v1.33.4", "major": "1", "minor": "33"})
    readiness = placer.readiness()
    assert not readiness.ready
    assert readiness.message == ("device env mode dra (DEVICE_ENV_MODE) needs resource.k8s.io/v1 (Kubernetes 1.34 or"
                                 " newer); this API server is v1.33.4 and does not serve it: set the chart's"
                                 " deviceEnvMode to cuda or nvidia (DEVICE_ENV_MODE of bind and mutate), or upgrade to"
                                 " 1.34 or newer")
    assert len(api.called("version")) == 1, "/version read once, for both DRA watches"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"not ready: {readiness.message}"], "one log line"
    # nothing is placed meanwhile (a cuda pod neither): bind is not started, as it is not ready
    assert placer.place(copy.deepcopy(POD)).outcome["result"] == "Retry" and api.called("bind") == []


@pytest.mark.parametrize("answer", [api_error(0, "cannot reach the Kubernetes API"), api_error(403), ValueError("not JSON")])
def test_dra_mode_whose_api_server_version_cannot_be_read_is_not_ready_all_the_same(answer):
    placer, _ = placer_on_a_server_without_dra("dra", answer)
    readiness = placer.readiness()
    assert not readiness.ready and "this API server (its version could not be read) and does not serve it" in readiness.message


@pytest.mark.parametrize("mode", ["cuda", "nvidia"])
def test_other_modes_on_an_api_server_without_dra_stay_ready_with_empty_dra_views(mode):
    placer, api = placer_on_a_server_without_dra(mode, {"gitVersion": "v1.33.4"})
    assert placer.readiness().ready and api.called("version") == []


# -- a pod naming an upstream PodGroup (spec.schedulingGroup, Kubernetes 1.36+) -----------------------
def upstream_pod() -> dict:
    pod = copy.deepcopy(POD)
    pod["spec"]["schedulingGroup"] = {"podGroupName": "train-group"}
    return pod


def notices(api) -> list[dict]:
    return [body for (namespace, body), _ in api.called("create_event") if body["reason"] == "UpstreamPodGroupIgnored"]


def test_a_pod_naming_an_upstream_podgroup_is_placed_as_always_with_one_warning_event():
    placer, api = placer_with()
    assert placed(placer, upstream_pod())["result"] == "Bound"
    [notice] = notices(api)
    assert notice["type"] == "Warning" and notice["involvedObject"]["uid"] == POD["metadata"]["uid"]
    assert notice["message"].startswith("the pod names PodGroup 'train-group' (spec.schedulingGroup.podGroupName),"
                                        " but gpu-scheduler does not run upstream gangs (PodGroups)")
    assert "gpu-scheduler/gang" in notice["message"]
    assert [reason for reason, _ in event_reasons(api)].count("Scheduled") == 1


def test_the_upstream_podgroup_notice_is_written_once_however_many_attempts():
    """Refused while its node is missing, attempt after attempt, then bound: the FailedScheduling
    Event counts up, the notice is written once."""
    placer, api = placer_with(nodes=())
    for _ in range(3):
        assert placed(placer, upstream_pod())["result"] == "Unschedulable"
    placer.views.handlers.replace_nodes([[NODE]])
    assert placed(placer, upstream_pod())["result"] == "Bound"
    [notice] = notices(api)
    assert notice["metadata"]["name"] not in [name for (namespace, name, patch), _ in api.called("patch_event")]


def test_a_gated_pod_naming_an_upstream_podgroup_gets_no_event_until_it_is_tried():
    """PreEnqueue holds a gated pod back silently (kube-scheduler's rule): no notice either."""
    placer, api = placer_with()
    gated = upstream_pod()
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    assert placed(placer, gated)["result"] == "SchedulingGated"
    assert api.called("create_event") == []


def test_a_pod_naming_no_podgroup_gets_no_notice():
    placer, api = placer_with()
    placed(placer)
    assert notices(api) == []


def test_bind_s_pod_watch_keeps_spec_scheduling_group():
    """bind reads pods through kubeapi.projection.PODS: the notice needs the field kept."""
    from gpu_scheduler.podinputs import PodInputs

    decoded = PODS.object(json.dumps(upstream_pod()).encode())
    assert PodInputs.of(decoded).notices


def test_the_pending_pods_of_the_scoped_listing_are_queued_once_bind_can_place_them():
    """The scoped listing of bind's pending pods queues them (its merge); a worker may take one
    at once. Seen at 1,000 nodes: half the cold starts tried the waiting pod while the listing did
    not count as in yet ("not listed yet"), and it waited out a 0.5 s backoff. Whatever the merge
    queues, bind can place when it does."""
    placer, api = scoped_placer(list_pods=[[]])
    placer.views.scope.pending_listed.clear()
    seen = []
    placer.views.scope._merge = lambda listings: seen.append(placer.views.can_place())
    placer.views.scope._list_pending()
    assert seen == [True]


def test_an_add_event_for_a_pod_the_watch_shows_bound_is_answered_without_reading_its_map(monkeypatch):
    """Most add events come after bind's own watch has placed the pod: the answer is the view's,
    and the map (an entry for every replica) is not parsed for it, nor logged at info."""
    from gpu_scheduler import binding, placement
    bound = copy.deepcopy(POD)
    bound["spec"]["nodeName"] = "node1"
    placer, api = placer_with(pods=[bound])
    parsed = []
    monkeypatch.setattr(placement, "resolve", lambda *a, **k: parsed.append(a) or pytest.fail("map parsed"))
    monkeypatch.setattr(binding, "entry", lambda *a, **k: parsed.append(a) or pytest.fail("map parsed"))
    answer = event_placed(placer)
    assert answer["result"] == "AlreadyBound" and answer["node"] == "node1"
    assert parsed == [] and api.called("bind") == [] and api.called("read_pod") == []
