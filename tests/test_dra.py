"""DRA mode's pure core: gpu_scheduler.plugins.dynamicresources.allocator. Rules, matching a map's devices to ResourceSlice
devices (zero, one, two; pool generations), devices held by other claims, and the claim's steps
(create, finalizer, allocation and reservation; idempotent; conflicts)."""
from __future__ import annotations

import copy
import json

import pytest

from gpu_scheduler.plugins.dynamicresources import allocator as dra
from gpu_scheduler.plugins.dynamicresources.allocator import (
    FINALIZER, Blocked, Create, Device, Ready, RuleError, Update, UpdateStatus, allocated, allocation_for, claim_for,
    claim_step, device_class, node_devices, parse_rules, rule_for, uses_dra, wanted_devices,
)
from gpu_scheduler.schedmap import Placement

NVIDIA, TEST = "gpu.nvidia.com", "test-driver.cdi.k8s.io"
RULES = parse_rules(None)


def device(name, **attributes):
    body = {"name": name}
    if attributes:
        body["attributes"] = {k: ({"int": v} if isinstance(v, int) else {"string": v}) for k, v in attributes.items()}
    return body


def slice_(devices, node="node1", driver=NVIDIA, pool="node1", generation=1, count=1, name=None):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{driver}-{pool}-{generation}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                     "devices": devices}}


GPUS = slice_([device(f"gpu-{i}", index=i, uuid=f"GPU-{i:04d}") for i in range(4)])
POD = {"metadata": {"name": "train-1", "namespace": "team-a", "uid": "u-1",
                    "annotations": {"gpu-scheduling-map": "1=node1:0,2"}},
       "spec": {"resourceClaims": [{"name": "gpu-scheduler", "resourceClaimName": "train-1-gpus"}]}}


def wanted(devices=("0", "2"), slices=(GPUS,), rules=RULES, held=None, cls=NVIDIA, node="node1"):
    return wanted_devices("team-a", "train-1-gpus", 1, Placement(node, tuple(devices)), cls, rules, list(slices), held or {})


# -- rules -----------------------------------------------------------------------------------------
def test_default_rules():
    assert RULES[NVIDIA].device_name("3") == "gpu-3"
    assert RULES[TEST].device_name("3") == "device-03" and RULES[TEST].device_name("12") == "device-12"
    assert RULES[NVIDIA].device_name("GPU-abc") is None


def test_a_rule_by_attribute_and_by_table():
    rules = parse_rules(json.dumps({"a.example.com": {"attribute": "index"},
                                    "b.example.com": {"attribute": "uuid", "table": {"node1": {"0": "GPU-1", "01": "GPU-2"}}}}))
    assert rules["a.example.com"].attribute == "index"
    assert rules["b.example.com"].table == {"node1": {"0": "GPU-1", "1": "GPU-2"}}


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"),
    ("[]", "non-empty object"),
    ("{}", "non-empty object"),
    ('{"Not A Name": {"name": "gpu-{index}"}}', "not a driver or DeviceClass name"),
    ('{"d.io": "gpu-{index}"}', "expected an object"),
    ('{"d.io": {"name": "gpu"}}', "exactly one {index}"),
    ('{"d.io": {"name": "gpu-{index}-{index}"}}', "exactly one {index}"),
    ('{"d.io": {"name": "gpu-{index.__class__}"}}', "exactly one {index}"),
    ('{"d.io": {"name": "GPU_{index}"}}', "cannot give a device name"),
    ('{"d.io": {"name": "gpu-{index}", "attribute": "index"}}', "exactly one of name"),
    ('{"d.io": {}}', "exactly one of name"),
    ('{"d.io": {"attribute": "bad name!"}}', "not an attribute name"),
    ('{"d.io": {"name": "gpu-{index}", "table": {}}}', "a table goes with an attribute"),
    ('{"d.io": {"attribute": "uuid", "table": {"node1": {"x": "GPU-1"}}}}', "expected a device index"),
    ('{"d.io": {"attribute": "uuid", "table": {"node1": {"0": 5}}}}', "expected a device index"),
    ('{"d.io": {"attribute": "uuid", "table": []}}', "expected an object {node"),
    ('{"d.io": {"attribute": "index", "colour": "red"}}', "unknown key 'colour'"),
    ('{"d.io": {"attribute": "index", "driver": "Not A Driver"}}', "expected a driver name"),
    ("[" * 50000 + "]" * 50000, "not JSON"),  # nested too deeply: refused, not a crash
    ('{"d.io": {"attribute": "index"}, "x": "' + "y" * 300000 + '"}', "larger than"),
])
def test_bad_rules_are_refused_with_the_key(text, says):
    with pytest.raises(RuleError) as error:
        parse_rules(text)
    assert says in str(error.value) and "GPU_SCHEDULER_DRA_DEVICE_RULES" in str(error.value)


def test_too_many_rules_or_table_entries():
    with pytest.raises(RuleError, match="at most 64"):
        parse_rules(json.dumps({f"d{i}.io": {"attribute": "index"} for i in range(65)}))
    table = {f"node{n}": {str(i): "GPU-" + "0" * 32 for i in range(8)} for n in range(400)}
    with pytest.raises(RuleError, match="larger than 131072 bytes"):
        parse_rules(json.dumps({"d.io": {"attribute": "uuid", "table": table}}))


# -- the pod -----------------------------------------------------------------------------------------
def test_the_pod():
    assert uses_dra(POD) and not uses_dra({"spec": {"resourceClaims": [{"name": "other"}]}}) and not uses_dra({})
    assert device_class(POD) == NVIDIA and device_class(POD, "x") == "x"
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"]["gpu-scheduler/device-class"] = "gpu.example.com"
    assert device_class(pod) == "gpu.example.com"


# -- slices --------------------------------------------------------------------------------------
def test_only_the_nodes_own_slices_of_the_driver_count():
    others = [slice_([device("gpu-0")], node="node2", pool="node2"), slice_([device("device-00")], driver=TEST)]
    assert [str(d) for d, _ in node_devices([GPUS, *others], "node1", NVIDIA)] == [f"{NVIDIA}/node1/gpu-{i}" for i in range(4)]


def test_only_the_newest_generation_of_a_pool_counts():
    old = slice_([device("gpu-0"), device("gpu-1")], generation=1, name="old")
    new = slice_([device("gpu-0")], generation=2, name="new")
    for order in ([old, new], [new, old]):
        assert [d.name for d, _ in node_devices(order, "node1", NVIDIA)] == ["gpu-0"]
    assert "matches no device" in wanted(("1",), slices=[old, new])


def test_a_pool_in_several_slices_of_one_generation():
    a = slice_([device("gpu-0")], count=2, name="a")
    b = slice_([device("gpu-1")], count=2, name="b")
    assert [d for _, d in wanted(("0", "1"), slices=[a, b]).requests] == [Device(NVIDIA, "node1", "gpu-0"),
                                                                          Device(NVIDIA, "node1", "gpu-1")]


# -- matching --------------------------------------------------------------------------------------
def test_the_map_devices_by_name():
    result = wanted()
    assert result.claim == "train-1-gpus" and result.node == "node1" and result.device_class == NVIDIA
    assert result.requests == (("gpu-0", Device(NVIDIA, "node1", "gpu-0")), ("gpu-2", Device(NVIDIA, "node1", "gpu-2")))
    assert result.selectors == {}


def test_the_map_devices_by_attribute_with_a_selector():
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": "index"}}))
    result = wanted(rules=rules)
    assert [d.name for _, d in result.requests] == ["gpu-0", "gpu-2"]
    assert result.selectors == {"gpu-0": f'device.attributes["{NVIDIA}"].index == 0',
                                "gpu-2": f'device.attributes["{NVIDIA}"].index == 2'}


def test_a_qualified_attribute_is_the_same_attribute():
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": f"{NVIDIA}/index"}}))
    qualified = slice_([{"name": "g", "attributes": {f"{NVIDIA}/index": {"int": 0}}}])
    assert [d.name for _, d in wanted(("0",), slices=[qualified], rules=rules).requests] == ["g"]
    assert wanted(("0",), rules=rules).requests[0][1].name == "gpu-0"


def test_the_map_devices_by_table():
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": "uuid", "table": {"node1": {"0": "GPU-0003", "2": "GPU-0001"}}}}))
    result = wanted(rules=rules)
    assert [d.name for _, d in result.requests] == ["gpu-3", "gpu-1"]
    assert result.selectors["gpu-0"] == f'device.attributes["{NVIDIA}"].uuid == "GPU-0003"'
    missing = wanted(("1",), rules=rules)
    assert "matches no device" in missing and "an entry for node node1 and index '1'" in missing


def test_a_string_attribute_matches_a_uuid_in_the_map():
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": "uuid"}}))
    result = wanted(("GPU-0002",), rules=rules)
    assert result.requests == (("gpu-0", Device(NVIDIA, "node1", "gpu-2")),)
    assert result.selectors["gpu-0"] == f'device.attributes["{NVIDIA}"].uuid == "GPU-0002"'


def test_no_device_is_unschedulable_naming_the_entry_and_what_was_looked_for():
    message = wanted(("0", "7"))
    assert message == (f"map entry 1=node1:0,7: device 7 matches no device of driver {NVIDIA} on node node1"
                       f" (looked for a device named 'gpu-7' among 4 devices of pool(s) node1)")


def test_two_devices_are_unschedulable():
    twin = slice_([device("gpu-0", index=0)], pool="other")
    message = wanted(("0",), slices=[GPUS, twin])
    assert message.startswith("map entry 1=node1:0,2".replace(",2", "") + ": device 0 matches 2 devices")
    assert f"{NVIDIA}/node1/gpu-0, {NVIDIA}/other/gpu-0" in message
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": "index"}}))
    assert "matches 2 devices" in wanted(("0",), slices=[GPUS, twin], rules=rules)


def test_wrong_attribute_types_do_not_match():
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": "index"}}))
    odd = slice_([{"name": "a", "attributes": {"index": {"bool": True}}}, {"name": "b", "attributes": {"index": {"string": "1"}}},
                  {"name": "c", "attributes": {"index": {"int": 2}}}])
    assert wanted(("1",), slices=[odd], rules=rules).requests[0][1].name == "b"  # "1" == "1" as strings
    assert "matches no device" in wanted(("GPU-x",), slices=[odd], rules=rules)


def test_no_slices_on_the_node():
    message = wanted(slices=[])
    assert "matches no device" in message and "among 0 devices" in message


# -- which driver ------------------------------------------------------------------------------------
def test_a_class_named_after_its_driver_and_a_class_with_a_rule():
    assert rule_for(NVIDIA, RULES, [], "node1") == (NVIDIA, RULES[NVIDIA])
    rules = parse_rules(json.dumps({"gpus": {"name": "device-{index:02d}", "driver": TEST}}))
    assert rule_for("gpus", rules, [], "node1")[0] == TEST


def test_another_class_takes_the_one_driver_with_a_rule_on_the_node():
    test = slice_([device(f"device-{i:02d}") for i in range(4)], driver=TEST)
    result = wanted(("3",), slices=[test], cls="gpu.example.com")
    assert result.requests == (("gpu-3", Device(TEST, "node1", "device-03")),) and result.device_class == "gpu.example.com"
    assert "no ResourceSlice on node node1 is of a driver with a device rule" in wanted(slices=[], cls="gpu.example.com")
    both = wanted(slices=[GPUS, test], cls="gpu.example.com")
    assert "several drivers" in both and "give DeviceClass 'gpu.example.com' a rule" in both


# -- held devices --------------------------------------------------------------------------------
def claim(name, namespace="team-b", results=(), uid="u-x", **status):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7"},
            "spec": {"devices": {"requests": []}}, "status": dict(status)}
    if results:
        body["status"]["allocation"] = {"devices": {"results": [
            {"request": "r", "driver": d.driver, "pool": d.pool, "device": d.name} for d in results]}}
    return body


def test_a_device_allocated_in_another_claim_is_held_and_named():
    held = allocated([claim("other", results=[Device(NVIDIA, "node1", "gpu-2")]), claim("none")])
    assert held == {Device(NVIDIA, "node1", "gpu-2"): "team-b/other"}
    message = wanted(held=held)
    assert message == (f"map entry 1=node1:0,2: device 2 ({NVIDIA}/node1/gpu-2) is allocated in ResourceClaim"
                       " team-b/other")


def test_the_pods_own_claim_does_not_hold_its_devices():
    held = allocated([claim("train-1-gpus", namespace="team-a", results=[Device(NVIDIA, "node1", "gpu-0")])])
    assert not isinstance(wanted(held=held), str)


def test_a_sibling_given_the_same_device_by_the_map_is_refused_in_dra_mode():
    held = allocated([claim("train-0-gpus", namespace="team-a", results=[Device(NVIDIA, "node1", "gpu-0")])])
    assert "allocated in ResourceClaim team-a/train-0-gpus" in wanted(held=held)


# -- the claim ---------------------------------------------------------------------------------------
def test_the_claim_for_a_pod():
    body = claim_for(POD, wanted())
    assert body["metadata"]["name"] == "train-1-gpus" and body["metadata"]["namespace"] == "team-a"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "train-1", "uid": "u-1",
                                                    "controller": True, "blockOwnerDeletion": True}]
    assert body["spec"]["devices"]["requests"] == [
        {"name": f"gpu-{i}", "exactly": {"deviceClassName": NVIDIA, "allocationMode": "ExactCount", "count": 1}}
        for i in (0, 2)]
    rules = parse_rules(json.dumps({NVIDIA: {"attribute": "index"}}))
    [first, _] = claim_for(POD, wanted(rules=rules))["spec"]["devices"]["requests"]
    assert first["exactly"]["selectors"] == [{"cel": {"expression": f'device.attributes["{NVIDIA}"].index == 0'}}]


def test_the_allocation():
    assert allocation_for(wanted()) == {
        "devices": {"results": [{"request": "gpu-0", "driver": NVIDIA, "pool": "node1", "device": "gpu-0"},
                                {"request": "gpu-2", "driver": NVIDIA, "pool": "node1", "device": "gpu-2"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node1"]}]}]}}


def created(want=None):
    """The claim as the API server returns it after the create."""
    body = claim_for(POD, want or wanted())
    body["metadata"].update(uid="c-1", resourceVersion="10")
    return body


def test_the_steps_from_nothing_to_ready():
    want = wanted()
    assert claim_step(None, POD, want) == Create()
    step = claim_step(created(), POD, want)
    assert isinstance(step, Update) and step.body["metadata"]["finalizers"] == [FINALIZER]
    assert step.body["metadata"]["resourceVersion"] == "10"
    with_finalizer = step.body
    step = claim_step(with_finalizer, POD, want)
    assert isinstance(step, UpdateStatus) and step.body["metadata"]["resourceVersion"] == "10"
    assert step.body["status"] == {"allocation": allocation_for(want),
                                   "reservedFor": [{"resource": "pods", "name": "train-1", "uid": "u-1"}]}
    assert claim_step(step.body, POD, want) == Ready()  # idempotent: kept as it is


def test_an_allocated_claim_not_yet_reserved_is_reserved():
    body = created()
    body["metadata"]["finalizers"] = [FINALIZER]
    body["status"] = {"allocation": allocation_for(wanted())}
    step = claim_step(body, POD, wanted())
    assert isinstance(step, UpdateStatus) and step.body["status"]["reservedFor"][0]["uid"] == "u-1"
    assert step.body["status"]["allocation"] == allocation_for(wanted())


def test_a_claim_allocated_elsewhere_is_reported_not_overwritten():
    body = created()
    body["status"] = {"allocation": allocation_for(wanted(("1", "3")))}
    step = claim_step(body, POD, wanted())
    assert isinstance(step, Blocked) and not step.wait
    assert "allocated to other devices or another node" in step.message and "gpu-1" in step.message
    body["status"] = {"allocation": allocation_for(wanted(node="node1"))}
    body["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["node2"]
    assert isinstance(claim_step(body, POD, wanted()), Blocked)


def test_a_claim_of_another_pod_of_the_same_name_waits_for_its_deletion():
    body = created()
    body["metadata"]["ownerReferences"][0]["uid"] = "u-old"
    step = claim_step(body, POD, wanted())
    assert isinstance(step, Blocked) and step.wait and "belongs to Pod train-1 (uid u-old)" in step.message
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    step = claim_step(body, POD, wanted())
    assert isinstance(step, Blocked) and step.wait and "being deleted" in step.message


def test_a_claim_made_by_someone_else_is_not_taken():
    body = claim("train-1-gpus", namespace="team-a")
    step = claim_step(body, POD, wanted())
    assert isinstance(step, Blocked) and "belongs to no pod" in step.message


def test_a_claim_requesting_other_devices_is_reported():
    step = claim_step(created(wanted(("0",))), POD, wanted())
    assert isinstance(step, Blocked) and "its spec cannot change" in step.message


def test_a_claim_reserved_for_another_pod_is_reported():
    body = created()
    body["status"] = {"allocation": allocation_for(wanted()),
                      "reservedFor": [{"resource": "pods", "name": "x", "uid": "u-x"}]}
    step = claim_step(body, POD, wanted())
    assert isinstance(step, Blocked) and "reserved for pods x" in step.message


def test_the_finalizers_of_others_are_kept():
    body = created()
    body["metadata"]["finalizers"] = ["example.com/keep"]
    assert claim_step(body, POD, wanted()).body["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]


# -- what plan and explain show ----------------------------------------------------------------------
@pytest.mark.parametrize("change, state", [
    (None, "NotCreated"),
    ({}, "NotAllocated"),
    ({"allocated": True}, "Allocated"),
    ({"allocated": True, "reservedFor": [{"resource": "pods", "name": "train-1", "uid": "u-pod"}]}, "Reserved"),
    ({"allocated": True, "reservedFor": [{"resource": "pods", "name": "old", "uid": "u-old"}]}, "ReservedForAnother"),
    ({"allocated": True, "deletionTimestamp": "2026-11-24T00:00:00Z"}, "Deleting"),
])
def test_a_claims_state_as_plan_and_explain_show_it(change, state):
    pod = {"metadata": {"name": "train-1", "namespace": "team-a", "uid": "u-pod"}}
    body = None
    if change is not None:
        body = claim("train-1-gpus", namespace="team-a",
                     results=[Device(NVIDIA, "node1", "gpu-0")] if change.get("allocated") else (),
                     **({"reservedFor": change["reservedFor"]} if "reservedFor" in change else {}))
        if change.get("allocated"):
            body["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node1"]}]}]}
        if "deletionTimestamp" in change:
            body["metadata"]["deletionTimestamp"] = change["deletionTimestamp"]
    shown = dra.claim_state(body, pod)
    assert shown["state"] == state
    if change and change.get("allocated"):
        assert (shown["node"], shown["devices"]) == ("node1", [f"{NVIDIA}/node1/gpu-0"])
    if change and "reservedFor" in change:
        assert shown["reservedFor"] == [f"pods/{change['reservedFor'][0]['name']}"]
