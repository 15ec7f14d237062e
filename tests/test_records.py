"""The device records' rules (gpu_scheduler/records.py) and the queue's (gpu_scheduler/queueing.py):
pure functions, every case."""
from __future__ import annotations

import json

import pytest

from gpu_scheduler.fit import PodInfo
from gpu_scheduler.plugins.gpusheld import NAME as GPUS_HELD
from gpu_scheduler.plugins.mapentry import NAME as MAP
from gpu_scheduler.plugins.nodeaffinity import NAME as NODE_AFFINITY
from gpu_scheduler.plugins.nodeexists import NAME as NODE_EXISTS
from gpu_scheduler.plugins.nodeports import NAME as NODE_PORTS
from gpu_scheduler.plugins.noderesourcesfit import NAME as NODE_RESOURCES_FIT
from gpu_scheduler.plugins.nodeready import NAME as NODE_READY
from gpu_scheduler.queueing import (
    EVENTS_TO_REGISTER, MAX_BACKOFF_SECONDS, NODE_ADD, NODE_UPDATE, POD_LEAVES, RECORD_FREED, Refused,
    backoff_seconds, requeues,
)
from gpu_scheduler.plugins.gpusheld import Create, Held, Keep, Write, record_step
from gpu_scheduler.records import (
    GRACE_SECONDS, MAX_HOLDERS, RENEW_AFTER_SECONDS, Record, is_free, lease_for, record_name, workload_key,
)

NOW = 1_800_000_000.0
A, B = "StatefulSet team-a/train", "StatefulSet team-b/serve"


def record(holders=(A,), age=0.0, shares=False, device="0", last_uid="u-a0") -> Record:
    lease = lease_for("node1", device, holders, shares, "team-a/train-0", last_uid, NOW - age)
    lease["metadata"]["resourceVersion"] = "7"
    return Record.of(lease)


def pod(workload_name=("owner", "team-a", "StatefulSet", "train"), devices=("0",), uid="u-a0") -> PodInfo:
    return PodInfo(uid, "team-a/train-0", {}, (), devices, workload_name, False)


def test_a_lease_round_trips_into_a_record():
    r = record(holders=(A, B), shares=True, device="3")
    assert ((r.name, r.node, r.device, r.holders, r.shares, r.resource_version) ==
            ("node1.gpu-3", "node1", "3", (A, B), True, "7"))
    assert r.written == pytest.approx(NOW, abs=1e-3) and r.last_uid == "u-a0"


@pytest.mark.parametrize("node, device, name", [
    ("node1", "0", "node1.gpu-0"),
    ("node1", "1023", "node1.gpu-1023"),
    ("node1", "GPU-8f6a2c1e-0000-4000-8000-000000000000", None),
    ("node1", "MIG-GPU-8f6a2c1e-0000-4000-8000-000000000000/1/0", None),
    ("n" * 250, "0", None),
])
def test_record_names_are_readable_where_valid_and_digests_elsewhere(node, device, name):
    got = record_name(node, device)
    if name:
        assert got == name
    else:
        assert got.startswith("gpu-") and len(got) == 44 and got == record_name(node, device)
    assert record_name(node, device) != record_name(node + "x", device)


@pytest.mark.parametrize("lease", [
    {"metadata": {"annotations": {}}},
    {"metadata": {"annotations": {"gpu-scheduler/node": "n", "gpu-scheduler/device": "0",
                                  "gpu-scheduler/holders": "not json"}}},
    {"metadata": {"annotations": {"gpu-scheduler/node": "n", "gpu-scheduler/device": "0",
                                  "gpu-scheduler/holders": json.dumps([1])}}},
    {"metadata": "x"},
])
def test_a_damaged_lease_is_no_record(lease):
    assert Record.of(lease) is None


def test_workload_keys_name_the_controller_or_the_map():
    assert workload_key(("owner", "team-a", "StatefulSet", "train")) == A
    key = workload_key(("map", "team-a", "0=node1:0\n"))
    assert key.startswith("pods of map ") and key.endswith(" in team-a")
    assert key != workload_key(("map", "team-a", "0=node1:1\n"))


@pytest.mark.parametrize("case, existing, mine, shares, pods, gone, expected", [
    ("no record", None, A, False, (), (), Create),
    ("ours, fresh", record(), A, False, (), (), Keep),
    ("ours, old: renewed", record(age=RENEW_AFTER_SECONDS), A, False, (), (), Write),
    ("another's, running pod", record(age=3600), B, False, (pod(),), (), Held),
    ("another's, fresh, pod not yet seen", record(), B, False, (), (), Held),
    ("another's, fresh, its pod seen deleted", record(), B, False, (), ("u-a0",), Write),
    ("another's, old, no pod", record(age=GRACE_SECONDS), B, False, (), (), Write),
    ("another's pod holds another device", record(age=3600), B, False, (pod(devices=("1",)),), (), Write),
    ("another's, both share", record(shares=True), B, True, (pod(),), (), Write),
    ("another's shares, we do not", record(shares=True, age=3600), B, False, (pod(),), (), Held),
    ("we share, it does not", record(age=3600), B, True, (pod(),), (), Held),
])
def test_record_steps(case, existing, mine, shares, pods, gone, expected):
    step = record_step(existing, mine, shares, pods, NOW, frozenset(gone))
    assert isinstance(step, expected), case


def test_a_take_over_leaves_only_the_new_holder_and_sharing_adds_one():
    assert record_step(record(age=GRACE_SECONDS), B, False, (), NOW).holders == (B,)
    assert record_step(record(shares=True), B, True, (), NOW).holders == (A, B)
    assert record_step(record(age=RENEW_AFTER_SECONDS), A, False, (), NOW).holders == (A,)


def test_the_refusal_names_the_holder_and_the_way_to_share():
    held = record_step(record(age=3600), B, False, (pod(),), NOW)
    assert held.message == ('GPU 0 on node1 is held by team-a/train-0 (StatefulSet team-a/train; '
                            'both workloads may set gpu-scheduler/share-gpus: "true" to share)')
    fresh = record_step(record(age=5), B, False, (), NOW)
    assert "was given to team-a/train-0 (StatefulSet team-a/train) at " in fresh.message
    # The same words on every attempt while the record stays as it is: one Event, counted up.
    assert record_step(record(age=5), B, False, (), NOW + 7).message == fresh.message


def test_sharing_is_bounded():
    holders = tuple(f"StatefulSet x/w{i}" for i in range(MAX_HOLDERS))
    step = record_step(record(holders=holders, shares=True), B, True, (), NOW)
    assert isinstance(step, Held) and f"at most {MAX_HOLDERS}" in step.message


def test_a_record_is_free_once_no_holder_pod_is_left_and_its_grace_is_over():
    assert not is_free(record(), (), NOW)
    assert is_free(record(), (), NOW, frozenset({"u-a0"}))
    assert is_free(record(age=GRACE_SECONDS), (), NOW)
    assert not is_free(record(age=GRACE_SECONDS), (pod(),), NOW)


def test_a_lease_body_is_a_create_or_an_update_at_the_version_read():
    created = lease_for("node1", "0", (A,), False, "team-a/train-0", "u", NOW)
    assert "resourceVersion" not in created["metadata"]
    assert created["spec"]["leaseDurationSeconds"] == GRACE_SECONDS and created["spec"]["holderIdentity"] == A
    updated = lease_for("node1", "0", (B,), False, "team-b/serve-0", "u", NOW, record())
    assert updated["metadata"]["resourceVersion"] == "7"


# -- the queue's rules ------------------------------------------------------------------------------
@pytest.mark.parametrize("filter_name, event, expected", [
    (GPUS_HELD, POD_LEAVES, True), (GPUS_HELD, RECORD_FREED, True), (GPUS_HELD, NODE_UPDATE, False),
    (NODE_AFFINITY, NODE_UPDATE, True), (NODE_AFFINITY, NODE_ADD, True), (NODE_AFFINITY, POD_LEAVES, False),
    (NODE_RESOURCES_FIT, POD_LEAVES, True), (NODE_RESOURCES_FIT, NODE_UPDATE, True),
    (NODE_PORTS, POD_LEAVES, True), (NODE_PORTS, NODE_UPDATE, False),
    (NODE_READY, NODE_UPDATE, True), (NODE_EXISTS, NODE_ADD, True), (NODE_EXISTS, NODE_UPDATE, False),
    (MAP, NODE_UPDATE, False), (MAP, POD_LEAVES, False),
])
def test_a_refusal_is_undone_only_by_the_events_its_filter_registered(filter_name, event, expected):
    assert requeues(Refused(filter_name, "node1"), event, "node1") is expected
    assert requeues(Refused(filter_name, "node1"), event, "node2") is False  # a pinned pod has one node


def test_every_plugin_of_the_profile_is_named_and_registers_its_events():
    from gpu_scheduler.plugins.config import SchedulerConfig
    from gpu_scheduler.plugins.registry import new_framework
    profile = new_framework(SchedulerConfig()).profile
    plugins = {p for phase in vars(profile).values() for p in phase}
    assert all(p.name for p in plugins) and {p.name for p in plugins} <= set(EVENTS_TO_REGISTER)
    # every refusing plugin but the map's registers at least one event; the map's only the pod can
    # undo, and a gang waits on its members' plugins' events, or for a new member (an attempt itself)
    # preemption refuses nothing itself: the refusal it follows keeps its plugin, and its events
    assert all(p.events for p in plugins if p.name not in (MAP, "DefaultBinder", "Gang", "DefaultPreemption"))


def test_backoff_doubles_to_its_bound():
    waits = [backoff_seconds(n) for n in range(1, 8)]
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0] and max(waits) == MAX_BACKOFF_SECONDS
