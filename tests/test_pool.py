"""Pools (issue 44): a pod without an index (a Deployment's) takes a free entry of its map. The
core on snapshots: which pods are pool pods, their workload, the entries the framework tries and
the one refusal naming each, the entry records, the Binding's annotations, mutate's env."""
from __future__ import annotations

import base64
import json

import pytest

from gpu_scheduler.admission import admission_response
from gpu_scheduler.binding import Bind, Pooled, bind_decision, binding_for
from gpu_scheduler.fit import NodeInfo, PodInfo, workload
from gpu_scheduler.framework.interface import Code
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.placement import ENTRY_ANNOTATION, POOL_UNASSIGNED, NotPlaceable, pool_of, resolve
from gpu_scheduler.plugins.registry import new_framework
from gpu_scheduler.podindex import IndexUnknown, is_pool, pod_index
from gpu_scheduler.queueing import Refused, requeues
from gpu_scheduler.framework.events import POD_LEAVES
from gpu_scheduler.records import EntryRecord, entry_is_free, entry_lease_for, entry_record_name, workload_key
from gpu_scheduler.plan import ReadView

MAP = "0=node1:0,1\n1=node2:0,1\n2=node3:0\n3=node4:3\n"
FRAMEWORK = new_framework()


def rs_pod(name="web-7d9f8-12345", uid=None, node="", entry=None, devices=None, labels=None, annotations=None,
           deployment="web", digest="7d9f8", phase="Pending", deleting=False):
    meta = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
            "labels": {"app": "web", "pod-template-hash": digest, **(labels or {})},
            "annotations": {"gpu-scheduling-map": MAP, **(annotations or {})},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deployment}-{digest}",
                                 "uid": "rs", "controller": True}]}
    if entry is not None:
        meta["annotations"][ENTRY_ANNOTATION] = str(entry)
    if devices is not None:
        meta["annotations"]["gpu-scheduler/devices"] = devices
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    pod = {"metadata": meta, "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c"}]},
           "status": {"phase": phase}}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def ready_node(name):
    return {"metadata": {"name": name, "labels": {}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "4"},
                       "capacity": {"nvidia.com/gpu": "4"}}}


def view(pods=(), entries=None, now=1000.0, gone=frozenset()):
    """A ReadView of four Ready nodes with `pods` bound on them, and entry records by node."""
    def snapshot_of(name, deciding):
        on = [p for p in pods if p["spec"].get("nodeName") == name]
        return NodeSnapshot(name, ready_node(name), NodeInfo.of(on), now=now, gone=gone,
                            entries=(entries or {}).get(name, {}))
    return ReadView(snapshot_of, pods)


# -- who is a pool pod ------------------------------------------------------------------------------
def test_a_replicasets_pod_is_a_pool_pod_and_never_reads_its_name():
    pod = rs_pod(name="web-7d9f8-12345")  # an all-digit random suffix
    assert is_pool(pod["metadata"])
    with pytest.raises(IndexUnknown, match="pool"):
        pod_index(pod["metadata"])
    with pytest.raises(NotPlaceable) as why:
        resolve(pod)
    assert why.value.reason == POOL_UNASSIGNED
    assert pool_of(pod).entries.keys() == {0, 1, 2, 3}


def test_the_pool_annotation_makes_any_pod_a_pool_pod_and_index_sources_still_win():
    bare = {"metadata": {"generateName": "w-", "namespace": "ns", "annotations": {"gpu-scheduler/pool": "true"}}}
    assert is_pool(bare["metadata"])
    statefulset = {"metadata": {"name": "s-1", "labels": {"apps.kubernetes.io/pod-index": "1"},
                                "annotations": {"gpu-scheduler/pool": "true"}}}
    assert not is_pool(statefulset["metadata"])
    assert not is_pool({"metadata": {"name": "bare-3"}}["metadata"])


def test_the_workload_of_a_replicasets_pod_is_its_deployment_so_a_rollout_shares_one_pool():
    old, new = rs_pod(digest="aaaa1"), rs_pod(name="web-bbbb2-x", digest="bbbb2")
    assert workload(old) == workload(new) == ("owner", "ns", "Deployment", "web")
    knative = rs_pod(labels={"serving.knative.dev/service": "svc"})
    assert workload(knative) == ("owner", "ns", "Service", "svc")
    argo = rs_pod(labels={"rollouts-pod-template-hash": "cccc3"}, digest="cccc3")
    argo["metadata"]["labels"].pop("pod-template-hash")
    assert workload(argo) == ("owner", "ns", "Rollout", "web")


# -- the cycle: the first free entry that fits, or one refusal naming each ---------------------------
def test_a_pool_pod_takes_the_first_entry_no_live_pod_of_its_workload_holds():
    holder = rs_pod(name="web-7d9f8-aaaaa", node="node1", entry=0, devices="0,1")
    pod = rs_pod()
    verdict = FRAMEWORK.evaluate(pod, view([holder, pod]))
    assert verdict.placeable
    decision = verdict.of(pod).decision
    assert decision.node_name == "node2" and decision.devices == ("0", "1")


def test_a_terminating_holder_still_holds_its_entry_and_a_finished_one_does_not():
    terminating = rs_pod(name="web-7d9f8-aaaaa", node="node1", entry=0, devices="0,1", deleting=True)
    pod = rs_pod()
    assert FRAMEWORK.evaluate(pod, view([terminating, pod])).of(pod).decision.node_name == "node2"
    finished = rs_pod(name="web-7d9f8-aaaaa", node="node1", entry=0, devices="0,1", phase="Succeeded")
    assert FRAMEWORK.evaluate(pod, view([finished, pod])).of(pod).decision.node_name == "node1"


def test_every_entry_held_one_refusal_names_each_and_the_fix_and_preemption_cannot_help():
    holders = [rs_pod(name=f"web-7d9f8-h{i}", node=f"node{i + 1}", entry=i, devices="0") for i in range(4)]
    pod = rs_pod()
    verdict = FRAMEWORK.evaluate(pod, view([*holders, pod]))
    assert not verdict.placeable
    status = verdict.status
    assert status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE and status.plugin == "PoolEntry"
    assert status.message.startswith("no entry of the pool is free (4 refused): entry 0 (node1:0,1): held by ns/web-7d9f8-h0")
    assert "entry 3 (node4:3): held by ns/web-7d9f8-h3" in status.message
    assert "maxSurge: 0" in status.message
    diagnosis = verdict.of(pod).decision.diagnosis
    assert [(r.node, r.status.plugin) for r in diagnosis] == [(f"node{i}", "PoolEntry") for i in range(1, 5)]


def test_an_entry_another_workload_holds_is_refused_by_gpusheld_and_named():
    other = {"metadata": {"name": "other-0", "namespace": "ns", "uid": "o",
                          "annotations": {"gpu-scheduler/devices": "0,1"},
                          "ownerReferences": [{"kind": "StatefulSet", "name": "other", "controller": True}]},
             "spec": {"schedulerName": "gpu-scheduler", "nodeName": "node1", "containers": [{"name": "c"}]},
             "status": {"phase": "Running"}}
    pod = rs_pod()
    verdict = FRAMEWORK.evaluate(pod, view([other, pod]))
    assert verdict.of(pod).decision.node_name == "node2"


def test_a_pool_gang_takes_distinct_entries_in_one_cycle():
    pods = [rs_pod(name=f"web-7d9f8-g{i}", annotations={"gpu-scheduler/gang": "4"}) for i in range(4)]
    verdict = FRAMEWORK.evaluate(pods[0], view(pods))
    assert verdict.placeable, verdict.status.message
    assert sorted(m.decision.node_name for m in verdict.members) == ["node1", "node2", "node3", "node4"]


def test_a_pool_gang_larger_than_its_free_entries_places_none():
    holder = rs_pod(name="web-7d9f8-old", node="node1", entry=0, devices="0,1", digest="7d9f8")
    pods = [rs_pod(name=f"web-7d9f8-g{i}", annotations={"gpu-scheduler/gang": "4"}) for i in range(4)]
    verdict = FRAMEWORK.evaluate(pods[0], view([holder, *pods]))
    # the bound holder is the gang's fourth member: three pending ones take entries 1, 2 and 3
    assert verdict.placeable
    assert sorted(m.decision.node_name for m in verdict.members if m.decision.status.ok) == ["node2", "node3", "node4"]


# -- entry records: another instance's decision holds the entry until its Binding shows ----------
def record(entry, pod="ns/web-7d9f8-other", uid="uid-other", written=995.0, node="node1"):
    pool = workload_key(("owner", "ns", "Deployment", "web"))
    lease = entry_lease_for(node, pool, entry, pod, uid, written)
    lease["metadata"]["resourceVersion"] = "7"
    return EntryRecord.of(lease)


def test_an_entry_record_in_grace_holds_the_entry_and_one_past_it_or_of_a_gone_pod_does_not():
    pod = rs_pod()
    held = record(0)
    verdict = FRAMEWORK.evaluate(pod, view([pod], {"node1": {(held.pool, 0): held}}))
    assert verdict.of(pod).decision.node_name == "node2"
    old = record(0, written=900.0)
    assert FRAMEWORK.evaluate(pod, view([pod], {"node1": {(old.pool, 0): old}})).of(pod).decision.node_name == "node1"
    gone = FRAMEWORK.evaluate(pod, view([pod], {"node1": {(held.pool, 0): held}}, gone=frozenset({"uid-other"})))
    assert gone.of(pod).decision.node_name == "node1"


def test_entry_records_round_trip_and_are_free_once_no_pod_holds_them():
    held = record(2, node="node3")
    assert held.entry == 2 and held.node == "node3" and held.name == entry_record_name(held.pool, 2)
    assert held.name.startswith("entry-") and len(held.name) <= 63
    holder = PodInfo.of(rs_pod(name="web-7d9f8-h", node="node3", entry=2, devices="0", phase="Running"))
    assert not entry_is_free(held, (holder,), now=2000.0)
    assert entry_is_free(held, (), now=2000.0)
    assert not entry_is_free(held, (), now=996.0)


# -- the Binding, bind's decision, the queue ------------------------------------------------------------
def test_the_binding_writes_the_entry_its_devices_and_their_ordinals():
    body = binding_for(Bind("ns", "p", "u", "node3", ("0", "2"), entry=2))
    assert body["metadata"]["annotations"] == {"gpu-scheduler/devices": "0,2", "gpu-scheduler/entry": "2",
                                               "gpu-scheduler/device-ordinals": "0,1"}
    assert "gpu-scheduler/entry" not in binding_for(Bind("ns", "p", "u", "node3", ("0",)))["metadata"]["annotations"]


def test_bind_takes_a_pool_pod_as_its_own_and_a_bound_one_holds_its_entry():
    assert isinstance(bind_decision(rs_pod()), Pooled)
    bound = rs_pod(node="node3", entry=2, devices="0")
    assert resolve(bound).placement.node == "node3" and resolve(bound).pooled
    assert PodInfo.of(bound).entry == 2


def test_a_pool_pod_waits_for_a_pod_leaving_any_of_its_entries_nodes():
    refused = Refused("PoolEntry", "node1", (("PoolEntry", "node1"), ("NodeReady", "node3")))
    assert requeues(refused, POD_LEAVES, "node1")
    assert not requeues(refused, POD_LEAVES, "node3")  # NodeReady waits for the node, not a pod
    assert requeues(refused, ("Node", "Update"), "node3")


# -- mutate ------------------------------------------------------------------------------------------------
def review(pod):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r", "operation": "CREATE", "namespace": "ns",
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "object": pod}}


def patch_of(pod, mode="cuda", quota=False):
    response, decision = admission_response(review(pod), mode, quota=quota)
    assert decision.allowed, decision.message
    return json.loads(base64.b64decode(response["response"]["patch"]))


def test_mutate_gives_a_pool_pods_containers_their_devices_through_the_downward_api():
    pod = rs_pod()
    pod["metadata"].pop("name")
    pod["metadata"]["generateName"] = "web-7d9f8-"
    env = next(op["value"] for op in patch_of(pod) if op["path"] == "/spec/containers/0/env")
    assert {"name": "CUDA_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpu-scheduler/devices']"}}} in env
    assert {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"} in env
    nvidia = next(op["value"] for op in patch_of(pod, "nvidia") if op["path"] == "/spec/containers/0/env")
    assert {"name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpu-scheduler/devices']"}}} in nvidia
    assert {"name": "CUDA_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpu-scheduler/device-ordinals']"}}} in nvidia


def test_mutate_counts_a_pool_pod_for_its_largest_entry():
    ops = patch_of(rs_pod(), quota=True)
    requests = [op for op in ops if "resources" in op["path"]]
    assert any("nvidia.com~1gpu" in op["path"] or op.get("value", {}) for op in requests)
    text = json.dumps(ops)
    assert '"gpu-scheduler.io/gpu"' in text or "gpu-scheduler.io~1gpu" in text


def test_mutate_gives_a_pool_pod_in_dra_mode_a_claim_named_from_its_request_and_the_ordinals():
    pod = rs_pod()
    pod["metadata"].pop("name")
    pod["metadata"]["generateName"] = "web-7d9f8-"
    response, decision = admission_response(review(pod), "dra", quota=False)
    assert decision.allowed, decision.message
    ops = json.loads(base64.b64decode(response["response"]["patch"]))
    claims = next(op["value"] for op in ops if op["path"] == "/spec/resourceClaims")
    assert claims == [{"name": "gpu-scheduler", "resourceClaimName": "web-7d9f8-r-gpus"}]  # the request's UID is "r"
    env = next(op["value"] for op in ops if op["path"] == "/spec/containers/0/env")
    assert {"name": "CUDA_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpu-scheduler/device-ordinals']"}}} in env


def test_after_a_map_change_an_old_pods_devices_hold_the_new_maps_entries_that_share_them():
    old = rs_pod(name="web-aaaa1-x", node="node1", entry=3, devices="0,1", digest="aaaa1")
    old["metadata"]["annotations"]["gpu-scheduling-map"] = "3=node1:0,1\n"
    pod = rs_pod(digest="bbbb2", name="web-bbbb2-y")  # MAP: entry 0 is node1:0,1
    assert FRAMEWORK.evaluate(pod, view([old, pod])).of(pod).decision.node_name == "node2"
    moved = rs_pod(name="web-aaaa1-x", node="node1", entry=0, devices="2,3", digest="aaaa1")
    moved["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:2,3\n"
    assert FRAMEWORK.evaluate(pod, view([moved, pod])).of(pod).decision.node_name == "node1"


def test_a_high_priority_pool_pod_preempts_for_one_entry_held_by_another_workloads_lower_priority_pod():
    victims = [{"metadata": {"name": f"low-{i}", "namespace": "ns", "uid": f"low-{i}",
                             "annotations": {"gpu-scheduler/devices": "0,1"},
                             "ownerReferences": [{"kind": "StatefulSet", "name": "low", "controller": True}]},
                "spec": {"schedulerName": "gpu-scheduler", "nodeName": f"node{i}", "priority": 0,
                         "containers": [{"name": "c"}]},
                "status": {"phase": "Running"}} for i in (1, 2)]
    pod = rs_pod()
    pod["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node1:0,1\n1=node2:0,1\n"
    pod["spec"]["priority"] = 1000
    verdict = FRAMEWORK.evaluate(pod, view([*victims, pod]))
    assert verdict.status.code is Code.UNSCHEDULABLE
    assert "entry 0 (node1:0,1): GPU 0 on node1 is held by ns/low-1" in verdict.status.message
    assert verdict.post_filter.outcome == "Preempted"
    assert verdict.post_filter.explained == "would preempt ns/low-1 (priority 0) on node1"  # the first entry's holder only


def test_a_pool_pod_another_instance_bound_to_another_entry_of_the_node_is_bound_elsewhere():
    from gpu_scheduler.binding import ALREADY_BOUND, BOUND_ELSEWHERE, conflict_outcome
    mine = Bind("ns", "p", "uid-p", "node1", ("0",), entry=0)
    bound_to = lambda entry: {"metadata": {"uid": "uid-p", "annotations": {ENTRY_ANNOTATION: str(entry)}},  # noqa: E731
                              "spec": {"nodeName": "node1"}}
    assert conflict_outcome(mine, bound_to(0)) == ALREADY_BOUND
    assert conflict_outcome(mine, bound_to(2)) == BOUND_ELSEWHERE  # its records go: the entry is free at once


# -- what a pool's cycle builds once per map (issue 53) ---------------------------------------------
def test_a_pools_candidates_are_built_once_per_map_and_its_prefilter_result_with_them():
    from gpu_scheduler.placement import pool_of
    from gpu_scheduler.plugins.mapentry import _pool_result
    first, second = pool_of(rs_pod()).candidates(), pool_of(rs_pod(name="web-7d9f8-67890")).candidates()
    assert first is second and [c.index for c in first] == [0, 1, 2, 3]
    assert _pool_result(first) is _pool_result(second)
    other = pool_of(rs_pod(annotations={"gpu-scheduling-map": MAP + "4=node1:2\n"})).candidates()
    assert other is not first and len(other) == 5
    assert _pool_result(other).candidates.options[4].label == "entry 4 (node1:2)"


def test_what_is_kept_per_map_is_bounded_by_entries_oldest_first():
    from gpu_scheduler.placement import Bounded
    kept = Bounded(limit=10)
    kept.put("a", ("a",) * 4, 4)
    kept.put("b", ("b",) * 4, 4)
    kept.put("c", ("c",) * 4, 4)  # 12 > 10: a goes
    assert kept.get("a") is None and kept.get("b") and kept.get("c")
    kept.put("huge", ("h",) * 11, 11)  # larger than the limit: never kept, nothing dropped for it
    assert kept.get("huge") is None and kept.get("b") and kept.get("c")
