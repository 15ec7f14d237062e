"""Preemption (gpu_scheduler/plugins/defaultpreemption.py): the victims chosen on a snapshot, as
kube-scheduler's DefaultPreemption chooses them, and bind's I/O order around them (the claim on
the records first, the Eviction API, then the victim's condition). Unit tests: the fake API here
shows the calls' order and error paths only; tests/test_preemption_cluster.py shows it working on
the real control plane."""
from __future__ import annotations

import copy
import json
import time

from gpu_scheduler.fit import NodeInfo, PodInfo, workload
from gpu_scheduler.framework.interface import CycleState, unresolvable, unschedulable
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.placement import Resolved
from gpu_scheduler.plugins.defaultpreemption import NoPreemption, Preemption, Waiting, select_victims
from gpu_scheduler.plugins.gpusheld import Held, Write, record_step
from gpu_scheduler.plugins.mapentry import RESOLVED
from gpu_scheduler.records import NOMINATED_KEY, Record, lease_for, nominated_lease, workload_key
from gpu_scheduler.schedmap import Placement

from decide import FRAMEWORK
from test_placer import MINE, NODE, POD, api_error, lease, placer_with

HELD = unschedulable("GPUsHeld", "GPU 1 on node1 is held by team-a/train-0")


def with_priority(pod: dict, priority: int, **spec) -> dict:
    pod = copy.deepcopy(pod)
    pod["spec"]["priority"] = priority
    pod["spec"].update(spec)
    return pod


def holder(name: str, devices: str, priority: int, uid: str = "", owner: str = "", gang: bool = False,
           labels: dict | None = None, terminating: bool = False) -> dict:
    meta = {"name": name, "namespace": "team-a", "uid": uid or f"u-{name}", "labels": labels or {},
            "annotations": {"gpu-scheduler/devices": devices, **({"gpu-scheduler/gang": "true"} if gang else {})}}
    if owner:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": owner, "controller": True}]
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "node1", "containers": [], "priority": priority},
            "status": {"phase": "Running"}}


def decide(pod, pods, pdbs=(), members_of=lambda key: (), refusal=HELD, records=None):
    state = CycleState()
    placement = Placement("node1", ("0", "1"))
    state.write(RESOLVED, Resolved(0, placement, {0: placement}))
    snapshot = NodeSnapshot("node1", NODE, NodeInfo.of(pods), records=records or {}, now=time.time())
    return select_victims(pod, snapshot, refusal, state, FRAMEWORK.run_filters, pdbs, members_of)


def names(chosen) -> list[str]:
    assert isinstance(chosen, Preemption), chosen
    return sorted(v.info.name for v in chosen.victims)


# -- the choice --------------------------------------------------------------------------------
def test_the_lower_priority_holder_is_the_victim_and_a_pod_not_in_the_way_is_spared():
    pods = [holder("train-0", "1", 10), holder("other-0", "3", 0)]
    assert names(decide(with_priority(POD, 100), pods)) == ["team-a/train-0"]


def test_equal_or_higher_priority_is_never_preempted_and_the_reason_says_so():
    chosen = decide(with_priority(POD, 100), [holder("train-0", "1", 100)])
    assert (isinstance(chosen, NoPreemption) and "lower than this pod's 100" in chosen.reason
            and "team-a/train-0: 100" in chosen.reason)


def test_preemption_policy_never_preempts_nobody():
    chosen = decide(with_priority(POD, 100, preemptionPolicy="Never"), [holder("train-0", "1", 0)])
    assert isinstance(chosen, NoPreemption) and "preemptionPolicy is Never" in chosen.reason


def test_a_refusal_that_eviction_cannot_undo_preempts_nobody():
    chosen = decide(with_priority(POD, 100), [holder("train-0", "1", 0)],
                    refusal=unresolvable("NodeExists", "no node"))
    assert isinstance(chosen, NoPreemption) and "NodeExists" in chosen.reason


def test_a_victim_its_pod_disruption_budget_protects_now_means_no_preemption():
    pdb = {"metadata": {"name": "train", "namespace": "team-a"},
           "spec": {"selector": {"matchLabels": {"app": "train"}}}, "status": {"disruptionsAllowed": 0}}
    chosen = decide(with_priority(POD, 100), [holder("train-0", "1", 0, labels={"app": "train"})], [pdb])
    assert isinstance(chosen, NoPreemption) and "PodDisruptionBudget team-a/train allows 0" in chosen.reason
    pdb["status"]["disruptionsAllowed"] = 1
    assert (names(decide(with_priority(POD, 100), [holder("train-0", "1", 0, labels={"app": "train"})], [pdb]))
            == ["team-a/train-0"])


def test_the_fewest_victims_the_more_important_pod_reprieved():
    # both GPUs 0 and 1 are wanted: two holders must go; a third of lower priority on GPU 2 stays
    pods = [holder("a-0", "0", 5), holder("b-0", "1", 1), holder("c-0", "2", 0)]
    assert names(decide(with_priority(POD, 100), pods)) == ["team-a/a-0", "team-a/b-0"]


def test_of_equal_priority_the_longest_running_is_reprieved_first_as_kube_scheduler_does():
    """kube-scheduler's util.MoreImportantPod: equal priority, the earlier status.startTime is the
    more important. The newest pod of priority 10 (a-0, whose name comes first) goes, not b-0;
    by name alone, a-0 would be reprieved and b-0 evicted (the disagreement
    test_preemption_versus_kube_scheduler.py found)."""
    def on_node(name: str, priority: int, cpu: str, started: str) -> dict:
        pod = holder(name, "", priority)
        pod["metadata"]["annotations"] = {}
        pod["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]
        pod["status"]["startTime"] = started
        return pod
    node = {"metadata": {"name": "node1"}, "spec": {},
            "status": {"allocatable": {"cpu": "4", "pods": "4", "nvidia.com/gpu": "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    pods = [on_node("a-0", 10, "1", "2026-01-01T00:03:00Z"), on_node("b-0", 10, "250m", "2026-01-01T00:01:00Z"),
            on_node("c-0", 30, "250m", "2026-01-01T00:00:00Z"), on_node("d-0", 20, "250m", "2026-01-01T00:02:00Z")]
    preemptor = with_priority(POD, 1000)
    preemptor["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": "2500m"}}}]
    state = CycleState()
    placement = Placement("node1", ("0", "1"))
    state.write(RESOLVED, Resolved(0, placement, {0: placement}))
    snapshot = NodeSnapshot("node1", node, NodeInfo.of(pods), records={}, now=time.time())
    refusal = unschedulable("NodeResourcesFit", "Insufficient cpu")
    assert names(select_victims(preemptor, snapshot, refusal, state, FRAMEWORK.run_filters)) == ["team-a/a-0"]
    pods[0]["status"].pop("startTime")  # not started: as if started now, the least important still
    snapshot = NodeSnapshot("node1", node, NodeInfo.of(pods), records={}, now=time.time())
    assert names(select_victims(preemptor, snapshot, refusal, state, FRAMEWORK.run_filters)) == ["team-a/a-0"]


def test_a_gang_member_goes_only_with_its_whole_gang():
    member = holder("g-0", "1", 0, owner="g", gang=True)
    elsewhere = PodInfo.of({**holder("g-1", "0", 0, owner="g", gang=True), "spec": {"nodeName": "node2",
                                                                                    "containers": [], "priority": 0}})
    chosen = decide(with_priority(POD, 100), [member],
                    members_of=lambda key: ((("node1", PodInfo.of(member)), ("node2", elsewhere))))
    assert names(chosen) == ["team-a/g-0", "team-a/g-1"]
    assert {v.node for v in chosen.victims} == {"node1", "node2"}


def test_a_gang_with_a_member_of_equal_priority_is_not_preempted():
    member = holder("g-0", "1", 0, owner="g", gang=True)
    high = PodInfo.of(holder("g-1", "3", 100, owner="g", gang=True))
    chosen = decide(with_priority(POD, 100), [member],
                    members_of=lambda key: (("node1", PodInfo.of(member)), ("node2", high)))
    assert isinstance(chosen, NoPreemption)


def test_victims_already_terminating_are_waited_for_not_evicted_again():
    chosen = decide(with_priority(POD, 100), [holder("train-0", "1", 0, terminating=True)])
    assert isinstance(chosen, Waiting) and "team-a/train-0" in chosen.message


# -- the claim -----------------------------------------------------------------------------------
def _record(**nomination) -> Record:
    body = lease_for("node1", "1", ("StatefulSet team-a/train",), False, "team-a/train-0", "u-train-0",
                     time.time() - 3600)
    body["metadata"]["resourceVersion"] = "7"
    record = Record.of(body)
    return Record.of(nominated_lease(record, "node1", "1", "default/high", "u-high", 100, time.time() + 60,
                                     "StatefulSet d/high")) if nomination else record


def test_a_device_being_freed_goes_to_its_nominee_or_a_pod_of_higher_priority_alone():
    record = _record(nominated=True)
    assert isinstance(record_step(record, "StatefulSet x/other", False, (), time.time(), uid="u-other",
                                  priority=100), Held)
    assert isinstance(record_step(record, "StatefulSet team-a/train", False, (), time.time(), uid="u-train-1",
                                  priority=0), Held)  # not even its former holder
    assert isinstance(record_step(record, "StatefulSet d/high", False, (), time.time(), uid="u-high",
                                  priority=100), Write)
    assert isinstance(record_step(record, "StatefulSet d/high", False, (), time.time(), uid="u-high-sibling",
                                  priority=100), Write)  # the nominee's sibling shares its devices
    assert isinstance(record_step(record, "StatefulSet x/top", False, (), time.time(), uid="u-top",
                                  priority=1000), Write)
    # the nominee seen gone: the nomination ends with it
    assert isinstance(record_step(record, "StatefulSet x/other", False, (), time.time(), frozenset({"u-high"}),
                                  uid="u-other", priority=0), Write)


# -- bind's calls, in order (fake API: order and error paths only) --------------------------------
HIGH = with_priority(POD, 100)


def victim_pod() -> dict:
    return holder("train-0", "1", 0, uid="u-holder", owner="train")


def test_bind_claims_the_record_then_nominates_then_evicts_then_marks_the_victim():
    victim_lease = lease("StatefulSet team-a/train", age=3600, device="1")
    written = copy.deepcopy(victim_lease)
    placer, api = placer_with(pods=[victim_pod()], leases=[victim_lease], update_lease=[written], evict=[{}],
                              patch_pod_status=[{}])
    attempt = placer.place(copy.deepcopy(HIGH))
    placer.recorder.flush()
    assert attempt.outcome["result"] == "Unschedulable"
    assert "preemption: preempted team-a/train-0 (priority 0) on node1" in attempt.outcome["message"]
    order = [m for m, _, _ in api.calls if m in ("update_lease", "create_lease", "evict", "patch_pod_status")]
    # the claim (GPU 1's record updated, GPU 0's created), the nomination, the eviction, the condition
    assert (order[:5] == ["create_lease", "update_lease", "patch_pod_status", "evict", "patch_pod_status"] or
            order[:5] == ["update_lease", "create_lease", "patch_pod_status", "evict", "patch_pod_status"]), order
    claims = [args[-1] for m, args, _ in api.calls if m in ("update_lease", "create_lease")][:2]
    assert all(c["metadata"]["annotations"][NOMINATED_KEY] == "default/gpu-scheduler-check-0" for c in claims)
    (nominated, _), (condition, _) = api.called("patch_pod_status")[:2]
    assert nominated[2] == {"status": {"nominatedNodeName": "node1"}}
    assert condition[:2] == ("team-a", "train-0")
    assert condition[2]["status"]["conditions"][0]["reason"] == "PreemptionByScheduler"
    assert api.called("evict")[0][0] == ("team-a", "train-0", "u-holder")
    preempted = [body for (_, body), _ in api.called("create_event") if body["reason"] == "Preempted"]
    assert preempted and "default/gpu-scheduler-check-0" in preempted[0]["message"]
    assert api.called("bind") == []


def test_a_claim_another_writer_made_first_evicts_nothing():
    victim_lease = lease("StatefulSet team-a/train", age=3600, device="1")
    now = copy.deepcopy(victim_lease)  # as the other writer left it: a holder's write, no nomination
    now["metadata"]["resourceVersion"] = "9"
    placer, api = placer_with(pods=[victim_pod()], leases=[victim_lease], update_lease=[api_error(409, "conflict")],
                              read_lease=[now])
    attempt = placer.place(copy.deepcopy(HIGH))
    assert "claimed by another preemptor or bind instance first" in attempt.outcome["message"]
    assert api.called("evict") == [] and api.called("bind") == []


def test_an_eviction_refused_by_a_budget_releases_the_claim_and_retries_later():
    victim_lease = lease("StatefulSet team-a/train", age=3600, device="1")
    written = copy.deepcopy(victim_lease)
    written["metadata"]["resourceVersion"] = "8"
    placer, api = placer_with(pods=[victim_pod()], leases=[victim_lease], update_lease=[written],
                              evict=[api_error(429, "Cannot evict pod as it would violate the pod's disruption budget.")],
                              patch_pod_status=[{}])
    attempt = placer.place(copy.deepcopy(HIGH))
    assert attempt.retry and "429" in attempt.outcome["message"]
    released = [args[-1] for args, _ in api.called("update_lease")][-1]
    assert NOMINATED_KEY not in released["metadata"]["annotations"]
    conditions = [args for args, _ in api.called("patch_pod_status") if "conditions" in json.dumps(args)]
    assert conditions == []  # no DisruptionTarget on a pod not evicted


def test_a_pod_of_default_priority_keeps_its_refusal_as_it_was():
    placer, api = placer_with(pods=[victim_pod()])
    attempt = placer.place(copy.deepcopy(POD))
    assert "preemption" not in attempt.outcome["message"] and api.called("evict") == []


# -- explain's line ------------------------------------------------------------------------------
def test_explain_names_who_would_be_preempted_or_why_nobody_can_be():
    from gpu_scheduler.plugins.registry import new_framework
    from gpu_scheduler.plugins.config import SchedulerConfig
    from gpu_scheduler.plan import ReadView, answer

    def scheduling(pod, pods):
        view = ReadView(lambda node, deciding: NodeSnapshot(node, NODE, NodeInfo.of(pods), now=time.time()))
        return answer(pod, framework, view).scheduling
    framework = new_framework(SchedulerConfig())
    decided = scheduling(HIGH, [victim_pod()])
    assert decided.action == "wait" and decided.preemption == "would preempt team-a/train-0 (priority 0) on node1"
    equal = scheduling(HIGH, [holder("train-0", "1", 100, uid="u-holder", owner="train")])
    assert equal.preemption.startswith("nobody can be preempted: no pod on node1 has a priority lower than this"
                                       " pod's 100")
    assert scheduling(POD, [victim_pod()]).preemption == ""  # priority 0: as bind's Event


# -- gangs as preemptors -------------------------------------------------------------------------
def gang_member(index: int) -> dict:
    from gpu_scheduler import ANNOTATION, SCHEDULER_NAME
    return {"metadata": {"name": f"big-{index}", "namespace": "ns", "uid": f"u-big-{index}",
                         "labels": {"apps.kubernetes.io/pod-index": str(index)},
                         "ownerReferences": [{"controller": True, "kind": "StatefulSet", "name": "big", "uid": "s"}],
                         "annotations": {ANNOTATION: "0=node1:0\n1=node1:1\n", "gpu-scheduler/gang": "true"}},
            "spec": {"schedulerName": SCHEDULER_NAME, "containers": [], "priority": 100}}


def test_a_gang_preempts_for_every_refused_member_or_for_none():
    low = holder("train-0", "1", 0, uid="u-holder", owner="train")
    placer, api = placer_with(pods=[gang_member(0), gang_member(1), low], update_lease=[{}], create_lease=[{}],
                              evict=[{}], patch_pod_status=[{}])
    attempt = placer.place(copy.deepcopy(gang_member(0)))
    assert "preemption: preempted team-a/train-0 (priority 0) on node1" in attempt.outcome["message"], attempt.outcome
    assert [args for args, _ in api.called("evict")] == [("team-a", "train-0", "u-holder")]
    assert api.called("bind") == []

    # one member's GPU held by a pod of equal priority: the gang cannot be placed whole, nobody is evicted
    equal = holder("serve-0", "0", 100, uid="u-serve", owner="serve")
    placer, api = placer_with(pods=[gang_member(0), gang_member(1), low, equal], update_lease=[{}],
                              create_lease=[{}], evict=[{}], patch_pod_status=[{}])
    attempt = placer.place(copy.deepcopy(gang_member(0)))
    assert "nobody preempted: member big-0" in attempt.outcome["message"], attempt.outcome
    assert api.called("evict") == []


def test_a_sibling_of_the_preemptor_evicts_nothing_more():
    """Index 3 and 4 of one StatefulSet share GPU 1: once index 4 is nominated, index 3 waits for
    the same victim rather than evicting it again (this failed before the nomination named its workload)."""
    victim_lease = lease("StatefulSet team-a/train", age=3600, device="1")
    record = Record.of(victim_lease)
    nominated = nominated_lease(record, "node1", "1", "default/gpu-scheduler-check-4", "u-4", 100,
                                time.time() + 60, MINE)
    nominated["metadata"]["resourceVersion"] = "6"
    free = nominated_lease(None, "node1", "0", "default/gpu-scheduler-check-4", "u-4", 100, time.time() + 60, MINE)
    free["metadata"]["resourceVersion"] = "6"
    placer, api = placer_with(pods=[victim_pod()], leases=[nominated, free])
    attempt = placer.place(copy.deepcopy(HIGH))
    assert "preempted for this pod already" in attempt.outcome["message"], attempt.outcome
    assert api.called("evict") == [] and api.called("update_lease") == []


def _claimed(device: str, pod: dict, version: str) -> dict:
    """The record of GPU `device` on node1 (its holder the victim's workload) nominated for `pod`."""
    meta = pod["metadata"]
    body = copy.deepcopy(nominated_lease(Record.of(lease("StatefulSet team-a/train", age=3600, device=device)),
                                         "node1", device, f"{meta['namespace']}/{meta['name']}", meta["uid"],
                                         pod["spec"]["priority"], time.time() + 60, workload_key(workload(pod))))
    body["metadata"]["resourceVersion"] = version
    return body


def two_instances_claiming(winner_for: dict) -> tuple[object, object]:
    """This instance preempts for HIGH from a view another instance has half overtaken: GPU 0's
    record already nominated for HIGH (that instance's first write), GPU 1's as it was before its
    second. GPU 1's write conflicts; read again, it is nominated for `winner_for`."""
    placer, api = placer_with(pods=[victim_pod()], leases=[_claimed("0", HIGH, "6"),
                                                           lease("StatefulSet team-a/train", age=3600, device="1")],
                              read_lease=[_claimed("1", winner_for, "9")], evict=[{}], patch_pod_status=[{}])

    def update_lease(*args):  # the record read stale conflicts; any other update goes through
        api.calls.append(("update_lease", args, {}))
        if args[-1]["metadata"]["name"] == "node1.gpu-1" and args[-1]["metadata"]["resourceVersion"] == "5":
            raise api_error(409, "conflict")
        return copy.deepcopy(args[-1])
    api.update_lease = update_lease
    return placer.place(copy.deepcopy(HIGH)), api


def test_another_instance_claiming_for_the_same_pod_is_left_to_evict_and_its_nomination_kept():
    """Two instances preempt for one pod at once (the two-instance run of test_gpus_cluster.py met
    it). The one whose write conflicts finds the device claimed for this same pod: the other
    instance evicts (once, as test_preemption_cluster.py's racing instances show), so this one
    evicts nothing, and keeps every nomination. Before, it rewrote GPU 0's, then took it back on
    GPU 1's conflict, leaving GPU 0 to anyone while the victim terminated."""
    attempt, api = two_instances_claiming(HIGH)
    assert "preemption: GPU 1 on node1 was claimed for this pod by another bind instance, which evicts" in (
        attempt.outcome["message"]), attempt.outcome
    assert api.called("evict") == [] and api.called("bind") == []
    assert [args[-1]["metadata"]["name"] for args, _ in api.called("update_lease")] == ["node1.gpu-1"], (
        "GPU 0's claim, the other instance's, rewritten")


def test_a_claim_lost_to_another_pod_takes_back_only_this_attempts_own():
    other = with_priority(HIGH, 500)
    other["metadata"] = {**other["metadata"], "name": "other-0", "uid": "u-other",
                         "ownerReferences": [{"kind": "StatefulSet", "name": "other", "controller": True}]}
    attempt, api = two_instances_claiming(other)
    assert "claimed by another preemptor or bind instance first" in attempt.outcome["message"], attempt.outcome
    assert api.called("evict") == [] and api.called("bind") == []
    stripped = [args[-1]["metadata"]["name"] for args, _ in api.called("update_lease")
                if NOMINATED_KEY not in args[-1]["metadata"]["annotations"]]
    assert stripped == [], "a nomination this attempt did not write taken off"


def test_dra_a_victims_trial_snapshot_frees_the_claim_it_references_a_pool_pods_included():
    """In DRA mode a victim's devices are those of the claims it references: a StatefulSet pod's
    `<name>-gpus`, and a pool pod's claim, which mutate named at admission from its generateName
    (its name does not give it). Both freed in the trial snapshot; another pod's claim kept."""
    from gpu_scheduler.fit import NodeInfo, PodInfo
    from gpu_scheduler.framework.snapshot import NodeSnapshot
    from gpu_scheduler.plugins.defaultpreemption import node_without

    def dra_pod(name: str, claim: str) -> dict:
        return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
                "spec": {"nodeName": "node3", "resourceClaims": [{"name": "gpu-scheduler", "resourceClaimName": claim}]}}
    pool = PodInfo.of(dra_pod("serve-7d4f9-x2x8q", "serve-7d4f9-0a1b2c3d4e-gpus"))
    replica = PodInfo.of(dra_pod("train-0", "train-0-gpus"))
    kept = PodInfo.of(dra_pod("other-0", "other-0-gpus"))
    assert pool.claims == ("team/serve-7d4f9-0a1b2c3d4e-gpus",)
    node = NodeSnapshot("node3", {"metadata": {"name": "node3"}}, NodeInfo.of([pool, replica, kept]),
                        held={"gpu-0": "team/serve-7d4f9-0a1b2c3d4e-gpus", "gpu-1": "team/train-0-gpus",
                              "gpu-2": "team/other-0-gpus"})
    assert dict(node_without(node, [pool, replica]).held) == {"gpu-2": "team/other-0-gpus"}
