"""The plan core (gpu_scheduler/plan.py): workloads -> the pods they create -> rows; node
selector contradictions as far as they can be known; what the next resync does."""
from __future__ import annotations

import pytest

from gpu_scheduler.plugins.config import SchedulerConfig
from gpu_scheduler.plugins.registry import new_framework
from gpu_scheduler.framework.snapshot import NodeSnapshot
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from gpu_scheduler import ANNOTATION, SCHEDULER_NAME
from gpu_scheduler import plan as core
from gpu_scheduler.devices import MODE_ANNOTATION
from gpu_scheduler.placement import resolve
from gpu_scheduler.podindex import JOB_INDEX_KEY, STATEFULSET_INDEX_LABEL, pod_index

SEED = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3"


def template(text=SEED, scheduler=SCHEDULER_NAME, annotations=None, **pod_spec):
    return {"metadata": {"labels": {"app": "w"}, "annotations": {ANNOTATION: text, **(annotations or {})}},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "i"}], **pod_spec}}


def statefulset(replicas=5, start=None, name="w", namespace=None, **tmpl):
    spec = {"replicas": replicas, "template": template(**tmpl)}
    if start is not None:
        spec["ordinals"] = {"start": start}
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": spec}


def job(completions=3, mode="Indexed", **tmpl):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"completionMode": mode, "completions": completions, "template": template(**tmpl)}}


def rows(obj):
    return core.plan(core.workload(obj)).rows


def test_the_seed_statefulset_plans_as_bind_places_it():
    [obj] = yaml.safe_load_all((REPO / "check" / "statefulset.yaml").read_text())
    plan = core.plan(core.workload(obj))
    assert [(r.index, r.pod, r.node, ",".join(r.devices)) for r in plan.rows] == [
        (0, "gpu-scheduler-check-0", "node1", "0,1"), (1, "gpu-scheduler-check-1", "node2", "2"),
        (2, "gpu-scheduler-check-2", "node3", "0,1,2"), (3, "gpu-scheduler-check-3", "node4", "3"),
        (4, "gpu-scheduler-check-4", "node4", "3")]
    assert plan.placeable and plan.warnings == ()
    assert [[w.reason for w in r.warnings] for r in plan.rows] == [[], [], [], ["SharedDevices"], ["SharedDevices"]]
    assert plan.rows[3].nvidia_env == {"NVIDIA_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0",
                                       "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plan.rows[2].env == {"CUDA_VISIBLE_DEVICES": "0,1,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize("replicas,start,indexes", [
    (None, None, [0]), (0, None, []), (3, None, [0, 1, 2]), (3, 0, [0, 1, 2]), (2, 3, [3, 4]), (1, 7, [7])])
def test_statefulset_indexes_follow_replicas_and_ordinals_start(replicas, start, indexes):
    obj = statefulset(replicas, start)
    if replicas is None:
        del obj["spec"]["replicas"]
    work = core.workload(obj)
    assert list(work.indexes) == indexes
    for index in indexes:
        pod = core.pod_for(work, index)
        assert pod["metadata"]["name"] == f"w-{index}"
        assert pod["metadata"]["labels"][STATEFULSET_INDEX_LABEL] == str(index)
        assert pod["metadata"]["labels"]["app"] == "w", "the template's labels are kept"
        assert pod_index(pod["metadata"]) == index


def test_pod_for_does_not_change_the_template():
    work = core.workload(statefulset())
    before = yaml.safe_dump(dict(work.template))
    pod = core.pod_for(work, 2)
    pod["spec"]["containers"].append({"name": "x"})
    assert yaml.safe_dump(dict(work.template)) == before


def test_ordinals_start_shifts_which_entries_are_used_and_which_are_beyond():
    plan = core.plan(core.workload(statefulset(replicas=3, start=2)))
    assert [(r.index, r.node) for r in plan.rows] == [(2, "node3"), (3, "node4"), (4, "node4")]
    [warning] = plan.warnings
    assert warning.reason == "UnusedEntries" and "map entries 0, 1 are beyond" in warning.message
    assert "ordinals.start 2" in warning.message


def test_replicas_without_entry_are_not_placeable_and_named():
    plan = core.plan(core.workload(statefulset(replicas=7)))
    assert [r.placeable for r in plan.rows] == [True] * 5 + [False] * 2
    assert plan.rows[5].problems[0].reason == "NoMapEntry" and plan.rows[5].node == ""
    assert "pod index 5 has no entry" in plan.rows[5].problems[0].message
    assert [w.reason for w in plan.warnings] == ["ReplicasWithoutEntry"]
    assert "pod indexes 5, 6 have no map entry" in plan.warnings[0].message
    assert not plan.placeable


def test_indexed_job_pods_carry_the_completion_index():
    work = core.workload(job(3))
    assert list(work.indexes) == [0, 1, 2]
    pod = core.pod_for(work, 1)
    assert pod["metadata"]["annotations"][JOB_INDEX_KEY] == "1"
    assert pod["metadata"]["generateName"] == "j-1-" and "name" not in pod["metadata"]
    plan = core.plan(work)
    assert [(r.index, r.pod, r.node) for r in plan.rows] == [(0, "j-0-*", "node1"), (1, "j-1-*", "node2"),
                                                           (2, "j-2-*", "node3")]
    assert "map entries 3, 4 are beyond" in plan.warnings[0].message


def test_a_non_indexed_job_has_no_index():
    [row] = rows(job(mode="NonIndexed"))
    assert row.index is None and not row.placeable
    assert row.problems[0].reason == "UnknownIndex" and "generateName" in row.problems[0].message


def test_a_pod_plans_as_itself_in_the_given_namespace():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p-3", "annotations": {ANNOTATION: SEED}},
           "spec": {"schedulerName": SCHEDULER_NAME, "containers": []}}
    work = core.workload(pod, "team")
    assert work.namespace == "team" and core.plan(work).rows[0].node == "node4"
    assert core.plan(work).warnings == (), "a bare pod's map may name other pods: no UnusedEntries"


@pytest.mark.parametrize("obj", [
    {"kind": "Service", "metadata": {"name": "s"}, "spec": {}},
    {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"metadata": {}, "spec": {}}}},
    {"kind": "ConfigMap", "metadata": {"name": "c"}},
])
def test_objects_that_create_no_pods_of_ours_are_skipped(obj):
    assert core.workload(obj) is None


@pytest.mark.parametrize("obj,message", [
    (statefulset(replicas=-1), "spec.replicas: expected a non-negative integer, found -1"),
    (statefulset(replicas="3"), 'spec.replicas: expected a non-negative integer, found "3"'),
    (statefulset(replicas=True), "spec.replicas: expected a non-negative integer, found true"),
    (statefulset(replicas=[3]), "spec.replicas: expected a non-negative integer, found a list"),
    (statefulset(replicas=core.MAX_REPLICAS + 1), f"a plan lists at most {core.MAX_REPLICAS} pods"),
    (statefulset(start=-2), "spec.ordinals.start: expected a non-negative integer"),
    ({"kind": "StatefulSet", "metadata": {"name": "w"}, "spec": {"replicas": 1}}, "spec.template: expected an object"),
    ({"kind": "StatefulSet", "metadata": {"name": "w"}, "spec": {"template": {"spec": []}}}, "spec.template.spec: expected an object"),
    ({"kind": "StatefulSet", "metadata": {"name": "w"}}, "spec: expected an object, found nothing"),
    ({"kind": "StatefulSet", "metadata": {}, "spec": {}}, "metadata.name: a StatefulSet needs a name"),
    ({"kind": "Pod", "metadata": "x"}, 'metadata: expected an object, found "x"'),
    ({"kind": "Pod", "metadata": {"name": "p", "namespace": 7}}, "metadata.namespace: expected a string, found 7"),
    (job(completions=None), "spec.completions: expected a non-negative integer, found nothing"),
    (job(mode="Sideways"), 'spec.completionMode: expected Indexed or NonIndexed, found "Sideways"'),
])
def test_malformed_workloads_name_the_field(obj, message):
    with pytest.raises(core.ManifestError, match=None) as raised:
        core.plan(core.workload(obj))
    assert message in str(raised.value)


def test_a_malformed_map_is_the_workloads_error_naming_the_line():
    with pytest.raises(core.ManifestError) as raised:
        core.plan(core.workload(statefulset(text="0=node1:0\n1=node2:2,2")))
    assert str(raised.value) == ("invalid gpu-scheduling-map annotation: line 2 '1=node2:2,2':"
                                 " device 2 is listed more than once")


def test_a_bad_device_mode_is_the_workloads_error():
    with pytest.raises(core.ManifestError, match=MODE_ANNOTATION):
        core.plan(core.workload(statefulset(annotations={MODE_ANNOTATION: "amd"})))


def test_a_template_without_the_map_is_an_error_for_the_kinds_we_plan():
    obj = statefulset()
    del obj["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    with pytest.raises(core.ManifestError, match="spec.template.metadata.annotations has no gpu-scheduling-map"):
        core.plan(core.workload(obj))


def test_another_scheduler_is_not_placeable():
    [row, *_] = rows(statefulset(scheduler="default-scheduler"))
    assert row.problems[0].reason == core.NOT_OUR_SCHEDULER and row.node == "node1"
    assert row.problems[0].message.startswith('spec.schedulerName is "default-scheduler", not gpu-scheduler:')


def test_messages_say_values_as_yaml_does_never_as_python():
    obj = statefulset()
    del obj["spec"]["template"]["spec"]["schedulerName"]
    [row, *_] = rows(obj)
    assert row.problems[0].message.startswith("spec.schedulerName is not set (the default scheduler's), not"
                                              " gpu-scheduler: another scheduler places this pod")
    resync = decided(cluster_pod(scheduler=None))
    assert (resync.action, resync.reason) == ("nothing", "Ignored")
    assert resync.message.startswith("spec.schedulerName is not set")
    assert [core.found(v) for v in (None, True, False, -1, 2.5, "3", "x" * 70, [1], {"a": 1})] == [
        "nothing", "true", "false", "-1", "2.5", '"3"', '"' + "x" * 59 + "...", "a list", "an object"]


@pytest.mark.parametrize("obj,data,counted", [
    (statefulset(replicas=3, start=2), (3, 2, True), "replicas 3, ordinals.start 2"),
    (statefulset(replicas=4), (4, 0, True), "replicas 4"),
    (job(2), (2, None, True), "Indexed, completions 2"),
    (job(mode="NonIndexed"), (None, None, False), "a NonIndexed Job's pods are named with generateName"),
    ({"kind": "Pod", "metadata": {"name": "p-0", "annotations": {ANNOTATION: SEED}}, "spec": {}}, (1, None, False),
     "the pod itself"),
])
def test_a_workload_says_how_many_pods_as_data_and_for_people(obj, data, counted):
    work = core.workload(obj)
    assert (work.replicas, work.ordinals_start, work.indexed) == data
    assert work.counted == counted == core.counted(work.kind, work.indexed, work.replicas, work.ordinals_start)


def test_the_mode_annotation_is_shown():
    assert {r.mode for r in rows(statefulset(annotations={MODE_ANNOTATION: "nvidia"}))} == {"nvidia"}


def test_gpu_requests_are_warned_about_as_admission_does():
    [row, *_] = rows(statefulset(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]))
    assert [w.reason for w in row.warnings] == ["GPUResourceRequested"]


def test_objects_in_a_list_and_empty_documents():
    assert core.objects_in(None) == []
    assert core.objects_in({"kind": "List", "items": [statefulset()]}) == [statefulset()]
    with pytest.raises(core.ManifestError, match="expected a Kubernetes object, found a list"):
        core.objects_in([1])
    with pytest.raises(core.ManifestError, match=r"items\[0\]: expected an object"):
        core.objects_in({"kind": "List", "items": ["x"]})


# -- node selectors -------------------------------------------------------------------------------
def pod_with(**pod_spec):
    return {"metadata": {}, "spec": pod_spec}


def required(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def hostname(operator, *values):
    return {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": operator, "values": list(values)}]}


def name_field(operator, *values):
    return {"matchFields": [{"key": "metadata.name", "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize("pod_spec,contradicts", [
    ({}, False),
    ({"nodeSelector": {"kubernetes.io/hostname": "node1"}}, False),
    ({"nodeSelector": {"kubernetes.io/hostname": "node2"}}, True),
    ({"nodeSelector": {"gpu": "a100"}}, False),  # unknown without the node: never a contradiction
    ({"nodeSelector": {"gpu": "a100", "kubernetes.io/hostname": "node2"}}, True),
    ({"affinity": required(hostname("In", "node1", "node2"))}, False),
    ({"affinity": required(hostname("In", "node2"))}, True),
    ({"affinity": required(hostname("NotIn", "node1"))}, True),
    ({"affinity": required(hostname("NotIn", "node2"))}, False),
    ({"affinity": required(hostname("DoesNotExist"))}, True),
    ({"affinity": required(hostname("Exists"))}, False),
    ({"affinity": required(name_field("In", "node2"))}, True),
    ({"affinity": required(name_field("In", "node1"))}, False),
    ({"affinity": required(name_field("In", "node2"), hostname("In", "node1"))}, False),  # terms are ORed
    ({"affinity": required({**name_field("In", "node1"), **hostname("In", "node2")})}, True),  # ANDed inside
    ({"affinity": required({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                           name_field("In", "node2"))}, False),  # one term unknown
    ({"affinity": required({})}, True),  # an empty term matches nothing
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": hostname("In", "node2")}]}}}, False),  # preferences never exclude
    ({"nodeSelector": "junk", "affinity": ["junk"]}, False),
])
def test_contradictions_known_from_the_node_name(pod_spec, contradicts):
    found = core.node_affinity(pod_with(**pod_spec), "node1")
    assert (found is not None) == contradicts
    if found:
        assert found.startswith(core.AFFINITY_REASON)


@pytest.mark.parametrize("operator,values,labels,matches", [
    ("In", ["a"], {"zone": "a"}, True), ("In", ["a"], {}, False), ("NotIn", ["a"], {}, True),
    ("NotIn", ["a"], {"zone": "a"}, False), ("Exists", [], {"zone": "x"}, True), ("DoesNotExist", [], {"zone": "x"}, False),
    ("Gt", ["3"], {"zone": "4"}, True), ("Gt", ["3"], {"zone": "3"}, False), ("Lt", ["3"], {"zone": "2"}, True),
    ("Gt", ["3"], {"zone": "x"}, False), ("Gt", ["3"], {}, False), ("Bogus", ["a"], {"zone": "a"}, False),
])
def test_with_the_nodes_labels_every_operator_is_decided(operator, values, labels, matches):
    pod = pod_with(affinity=required({"matchExpressions": [{"key": "zone", "operator": operator, "values": values}]}))
    assert (core.node_affinity(pod, "n", labels) is None) == matches


KEYS = st.sampled_from(["kubernetes.io/hostname", "zone", "gpu"])
REQUIREMENTS = st.fixed_dictionaries({
    "key": KEYS, "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
    "values": st.lists(st.sampled_from(["node1", "node2", "a", "1", "5"]), max_size=2)})
TERMS = st.fixed_dictionaries({}, optional={
    "matchExpressions": st.lists(REQUIREMENTS, max_size=3),
    "matchFields": st.lists(st.fixed_dictionaries({"key": st.just("metadata.name"),
                                                   "operator": st.sampled_from(["In", "NotIn"]),
                                                   "values": st.lists(st.sampled_from(["node1", "node2"]), max_size=2)}),
                            max_size=1)})


@settings(max_examples=300, deadline=None)
@given(selector=st.dictionaries(KEYS, st.sampled_from(["node1", "node2", "a"]), max_size=2),
       terms=st.none() | st.lists(TERMS, max_size=3),
       zone=st.none() | st.sampled_from(["a", "1", "5"]), gpu=st.none() | st.sampled_from(["a", "5"]))
def test_what_the_name_tells_never_contradicts_the_whole_node(selector, terms, zone, gpu):
    """Sound: a contradiction found from the name alone is one on every node of that name
    (whose hostname label is its name), whatever its other labels."""
    pod = pod_with(nodeSelector=selector, **({"affinity": required(*terms)} if terms is not None else {}))
    labels = {"kubernetes.io/hostname": "node1", **({"zone": zone} if zone else {}), **({"gpu": gpu} if gpu else {})}
    if core.node_affinity(pod, "node1") is not None:
        assert core.node_affinity(pod, "node1", labels) is not None


def test_a_contradiction_makes_the_row_not_placeable():
    [row, *_] = rows(statefulset(nodeSelector={"kubernetes.io/hostname": "node9"}))
    assert row.problems[0].reason == core.NODE_AFFINITY
    assert "nodeSelector {kubernetes.io/hostname=node9} excludes node node1" in row.problems[0].message


# -- bind's checks, and explain ------------------------------------------------------------------
READY = {"type": "Ready", "status": "True"}


def node(name="node1", unschedulable=False, ready=True, gpus="4"):
    return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable},
            "status": {"capacity": {"nvidia.com/gpu": gpus}, "conditions": [{**READY, "status": str(ready)}]}}


def cluster_pod(name="w-0", node_name="", text=SEED, scheduler=SCHEDULER_NAME):
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u", "annotations": {ANNOTATION: text}},
            "spec": {"schedulerName": scheduler, "nodeName": node_name, "containers": [
                {"name": "c", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}, {"name": "X", "value": "y"}]}]}}


def decided(pod, node_object=None) -> core.Scheduling:
    """plan's and explain's answer for `pod`, its map node being `node_object`: bind's framework."""
    framework = new_framework(SchedulerConfig())
    return core.answer(pod, framework, core.ReadView(lambda name, deciding: NodeSnapshot(name, node_object))).scheduling


def test_the_answer_is_bind_s_framework_s():
    pod = cluster_pod()
    assert decided(pod, node()).action == "bind"
    assert (decided(pod).plugin, decided(pod).message) == ("NodeExists", "node node1 does not exist")
    assert decided(pod).retried_on == ("the node added",)
    assert "cordoned" in decided(pod, node(unschedulable=True)).message
    assert "not Ready" in decided(pod, node(ready=False)).message
    assert "beyond node node1's 1" in decided(pod, node(gpus="1")).message


@pytest.mark.parametrize("pod,node_object,action,reason", [
    (cluster_pod(), node(), "bind", "Bind"),
    (cluster_pod(), node(unschedulable=True), "wait", "Unschedulable"),
    (cluster_pod(), None, "wait", "Unschedulable"),
    (cluster_pod("w-9"), None, "wait", "NoMapEntry"),
    (cluster_pod(text="0=node1"), None, "wait", "MalformedMap"),
    (cluster_pod(node_name="node1"), None, "nothing", "Ignored"),
    (cluster_pod(scheduler="default-scheduler"), None, "nothing", "Ignored"),
])
def test_scheduling_is_bind_s_decision(pod, node_object, action, reason):
    answer = decided(pod, node_object)
    assert (answer.action, answer.reason) == (action, reason)
    assert answer.placeable == (action != "wait")


def test_device_env_events_and_condition_of_a_pod():
    pod = cluster_pod()
    assert core.device_env_of(pod) == {"c": {"CUDA_VISIBLE_DEVICES": "0,1"}}
    pod["status"] = {"conditions": [{"type": "Ready"}, {"type": "PodScheduled", "status": "False"}]}
    assert core.pod_scheduled(pod)["status"] == "False"
    events = [{"source": {"component": "gpu-scheduler"}, "reason": "B", "lastTimestamp": "2026-01-02T00:00:00Z"},
              {"source": {"component": "kubelet"}, "reason": "X"},
              {"reportingComponent": "gpu-scheduler", "reason": "A", "lastTimestamp": "2026-01-01T00:00:00Z"}]
    assert [e["reason"] for e in core.scheduler_events(events)] == ["A", "B"]


# -- gangs (docs/gangs.md) -------------------------------------------------------------------------
GANG = "gpu-scheduler/gang"


def gang_set(policy="Parallel", replicas=5, value="true", **tmpl):
    obj = statefulset(replicas, namespace="ns", annotations={GANG: value}, **tmpl)
    if policy is not None:
        obj["spec"]["podManagementPolicy"] = policy
    return obj


def test_a_gang_is_shown_with_its_size_and_members():
    plan = core.plan(core.workload(gang_set()))
    assert (plan.gang.name, plan.gang.size, plan.gang.missing, plan.gang.verdict) == ("ns/w", 5, 0, None)
    assert [(m.name, m.state, m.node) for m in plan.gang.members] == [
        ("ns/w-0", "expected", "node1"), ("ns/w-1", "expected", "node2"), ("ns/w-2", "expected", "node3"),
        ("ns/w-3", "expected", "node4"), ("ns/w-4", "expected", "node4")]
    assert plan.warnings == () and plan.placeable
    assert core.plan(core.workload(gang_set(value="3"))).gang.size == 3
    assert core.plan(core.workload(gang_set(value="false"))).gang is None
    assert core.plan(core.workload(statefulset())).gang is None


@pytest.mark.parametrize("policy", [None, "OrderedReady"])
def test_a_statefulset_that_creates_one_pod_at_a_time_is_warned_about(policy):
    plan = core.plan(core.workload(gang_set(policy)))
    assert [(w.reason, w.message) for w in plan.warnings] == [(
        "GangOrderedReady", "a StatefulSet with podManagementPolicy: OrderedReady creates one pod at a time and never"
                            " forms a gang; set podManagementPolicy: Parallel")]
    assert core.plan(core.workload(statefulset())).warnings == ()  # no gang: nothing to warn of


def test_fewer_replicas_than_the_gang_needs_is_warned_about():
    plan = core.plan(core.workload(gang_set(replicas=2, value="4")))
    assert [w.reason for w in plan.warnings] == ["GangNeverForms", "UnusedEntries"] and plan.gang.missing == 2
    assert "needs 4 members" in plan.warnings[0].message


def test_a_malformed_gang_is_the_workloads_error():
    with pytest.raises(core.ManifestError, match="'yes' is not a gang size: set gpu-scheduler/gang to"):
        core.plan(core.workload(gang_set(value="yes")))
    with pytest.raises(core.ManifestError, match="'6' must be from 1 to the map's 5 entries"):
        core.plan(core.workload(gang_set(value="6")))


def gang_member(index, node_name="", value="true", uid=None, phase=None, scheduler=SCHEDULER_NAME, owner="w"):
    pod = {"metadata": {"name": f"w-{index}", "namespace": "ns", "uid": uid or f"u{index}",
                        "labels": {STATEFULSET_INDEX_LABEL: str(index)},
                        "annotations": {ANNOTATION: SEED, GANG: value},
                        "ownerReferences": [{"kind": "StatefulSet", "name": owner, "controller": True}]},
           "spec": {"schedulerName": scheduler, "nodeName": node_name, "containers": [{"name": "c"}]}}
    if phase:
        pod["status"] = {"phase": phase}
    return pod


def holder_of_node4_gpu3():
    return {"metadata": {"name": "x-0", "namespace": "team-a", "uid": "hx",
                         "annotations": {"gpu-scheduler/devices": "3"}},
            "spec": {"schedulerName": SCHEDULER_NAME, "nodeName": "node4", "containers": [{"name": "c"}]}}


def view(pods=(), holders=()) -> core.ReadView:
    """What explain reads: the nodes (each with `holders` on it) and the namespace's `pods`."""
    from gpu_scheduler.fit import NodeInfo
    return core.ReadView(lambda name, deciding: NodeSnapshot(
        name, node(name), NodeInfo.of([h for h in holders if h["spec"]["nodeName"] == name])), pods)


def test_the_live_gang_is_the_workloads_pending_members_and_its_bound_pods():
    framework = new_framework(SchedulerConfig())
    me = gang_member(1)
    others = [gang_member(0, "node1"), me, gang_member(2), gang_member(3, phase="Failed"),
              gang_member(4, scheduler="default-scheduler"), gang_member(5, owner="other"),
              {**gang_member(6), "metadata": {**gang_member(6)["metadata"], "annotations": {ANNOTATION: SEED}}}]
    gang = core.answer(me, framework, view(others)).gang
    assert (gang.name, gang.size, gang.bound) == ("ns/w", 5, ("ns/w-0",))
    assert [(m.name, m.state, m.node) for m in gang.members if m.state == core.BOUND] == [("ns/w-0", "bound", "node1")]
    assert [m.name for m in gang.members if m.state != core.BOUND] == ["ns/w-1", "ns/w-2"]
    # A bound member's gang: the others pending, itself bound.
    bound_gang = core.answer(others[0], framework, view(others)).gang
    assert bound_gang is not None, "explain of a bound gang member shows no gang"
    assert [m.name for m in bound_gang.members if m.state != core.BOUND] == ["ns/w-1", "ns/w-2"]
    assert bound_gang.bound == ("ns/w-0",)
    assert core.answer(cluster_pod(), framework, view(others)).gang is None  # no gang
    # malformed: PreFilter refuses the pod
    assert core.answer(gang_member(1, value="many"), framework, view(others)).gang is None


def test_a_gang_blocked_by_a_holder_waits_with_binds_message():
    framework = new_framework(SchedulerConfig())
    pods = [gang_member(i) for i in range(5)]
    said = core.answer(pods[0], framework, view(pods, [holder_of_node4_gpu3()]))
    answer = said.gang
    decided = framework.evaluate(pods[0], view(pods, [holder_of_node4_gpu3()]))
    assert (answer.verdict.action, answer.verdict.plugin, answer.verdict.reason, answer.verdict.message) == (
        "wait", "Gang", "GangMemberRefused", decided.status.message)
    assert answer.verdict.message.startswith("gang ns/w: 3 of 5 members placeable; member w-3: GPU 3 on node4 is held by")
    assert answer.verdict.node == "node4" and not answer.verdict.placeable
    assert [(m.name, m.state, m.node, m.plugin) for m in answer.members] == [
        ("ns/w-0", "placeable", "node1", ""), ("ns/w-1", "placeable", "node2", ""),
        ("ns/w-2", "placeable", "node3", ""), ("ns/w-3", "refused", "node4", "GPUsHeld"),
        ("ns/w-4", "refused", "node4", "GPUsHeld")]
    assert answer.verdict.retried_on == tuple(core.retried_on("GPUsHeld"))
    assert said.scheduling.message == answer.verdict.message  # the member's own answer: its gang's refusal


def test_a_gang_with_members_missing_and_one_that_binds():
    framework = new_framework(SchedulerConfig())
    pods = [gang_member(0), gang_member(1), gang_member(2, "node3")]
    short = core.answer(pods[0], framework, view(pods)).gang
    assert short.verdict.reason == "GangMembersMissing" and short.verdict.message.startswith(
        "gang ns/w: 3 of 5 members exist")
    assert (short.missing, short.bound, [m.state for m in short.members]) == (2, ("ns/w-2",), ["bound", "placeable",
                                                                                                "placeable"])
    assert short.members[0].node == "node3" and "a member of the gang created" in short.verdict.retried_on
    pair = [gang_member(0, value="2"), gang_member(1, value="2")]
    whole = core.answer(pair[0], framework, view(pair)).gang
    assert (whole.verdict.action, whole.verdict.message, whole.verdict.placeable) == (
        "bind", "bind 2 members together", True)


# -- JobSet and LeaderWorkerSet ------------------------------------------------------------------
from gpu_scheduler.fit import gang_key, workload as workload_of  # noqa: E402
from gpu_scheduler.gangask import GANG_SIZE  # noqa: E402
from gpu_scheduler.podindex import JOB_COMPLETIONS, LWS_SIZE_ANNOTATION, index_source  # noqa: E402

WORKERS_MAP = "0=node1:0,1\n1=node1:2,3\n2=node2:0,1\n3=node2:2,3"
DRIVER_MAP = "0=node3:0"


def replicated_job(name, text, replicas=2, parallelism=2, completions=2, gang=None):
    job_spec = {"template": template(text, annotations={GANG: gang} if gang else None)}
    job_spec.update({k: v for k, v in (("parallelism", parallelism), ("completions", completions)) if v is not None})
    job = {"name": name, "template": {"spec": job_spec}}
    if replicas is not None:
        job["replicas"] = replicas
    return job


def jobset(gang=None, driver_gang=None):
    """A JobSet of two replicated jobs: workers (2 Jobs of 2 pods) and driver (1 Job of 1 pod)."""
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "train", "namespace": "team"},
            "spec": {"replicatedJobs": [replicated_job("workers", WORKERS_MAP, gang=gang),
                                        replicated_job("driver", DRIVER_MAP, None, 1, None, gang=driver_gang)]}}


def test_a_jobset_is_one_workload_per_replicated_job_with_the_map():
    workers, driver = core.workloads(jobset())
    assert (workers.title, workers.indexes, workers.groups, workers.group_size) == (
        "JobSet team/train, replicated job workers", (0, 1, 2, 3), 2, 2)
    assert (driver.title, driver.indexes, driver.replicas) == ("JobSet team/train, replicated job driver", (0,), 1)
    assert workers.indexed and workers.counted == "replicas 2 × completions 2 = 4 pods"
    assert core.workload(jobset()) == workers
    obj = jobset()
    del obj["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert [w.part for w in core.workloads(obj)] == ["workers"], "a replicated job without the map is not ours"


def test_a_jobset_plans_every_pod_with_its_own_entry():
    workers, driver = (core.plan(w) for w in core.workloads(jobset()))
    assert [(r.index, r.pod, r.node, ",".join(r.devices)) for r in workers.rows] == [
        (0, "train-workers-0-0-*", "node1", "0,1"), (1, "train-workers-0-1-*", "node1", "2,3"),
        (2, "train-workers-1-0-*", "node2", "0,1"), (3, "train-workers-1-1-*", "node2", "2,3")]
    assert [(r.index, r.pod, r.node, r.devices) for r in driver.rows] == [(0, "train-driver-0-0-*", "node3", ("0",))]
    assert workers.placeable and driver.placeable and workers.warnings == driver.warnings == ()
    assert workers.gang is None and workers.index_source == "JobSet"


def test_a_jobset_pod_is_what_the_jobset_and_job_controllers_and_mutate_make():
    workers, driver = core.workloads(jobset(gang="true"))
    pod = core.pod_for(workers, 3)
    meta = pod["metadata"]
    assert meta["generateName"] == "train-workers-1-1-" and "name" not in meta and meta["namespace"] == "team"
    jobset_keys = {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                   "jobset.sigs.k8s.io/replicatedjob-replicas": "2", "jobset.sigs.k8s.io/job-index": "1",
                   "jobset.sigs.k8s.io/job-global-index": "1", "jobset.sigs.k8s.io/global-replicas": "3"}
    assert meta["labels"] == {"app": "w", **jobset_keys, "batch.kubernetes.io/job-name": "train-workers-1",
                              "job-name": "train-workers-1", JOB_INDEX_KEY: "1"}
    assert meta["annotations"] == {ANNOTATION: WORKERS_MAP, GANG: "true", **jobset_keys, JOB_INDEX_KEY: "1",
                                   JOB_COMPLETIONS: "2", GANG_SIZE: "4"}
    assert meta["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": "train-workers-1",
                                        "controller": True, "blockOwnerDeletion": True}]
    assert pod_index(meta) == 3 and index_source(meta).name == "JobSet"
    assert workload_of(pod) == gang_key(pod) == ("owner", "team", "JobSet", "train")
    driver_meta = core.pod_for(driver, 0)["metadata"]
    assert driver_meta["labels"]["jobset.sigs.k8s.io/job-global-index"] == "2", "after the workers' 2 Jobs"
    assert GANG_SIZE not in driver_meta["annotations"], "the driver does not ask for the gang"
    for work in (workers, driver):
        assert [pod_index(core.pod_for(work, i)["metadata"]) for i in work.indexes] == list(work.indexes)


def test_a_jobset_is_one_gang_over_its_replicated_jobs_that_ask_for_it():
    workers, driver = (core.plan(w) for w in core.workloads(jobset(gang="true", driver_gang="true")))
    for plan in (workers, driver):
        assert (plan.gang.name, plan.gang.size, plan.gang.missing) == ("team/train", 5, 0)
        assert [(m.name, m.node) for m in plan.gang.members] == [
            ("team/train-workers-0-0-*", "node1"), ("team/train-workers-0-1-*", "node1"),
            ("team/train-workers-1-0-*", "node2"), ("team/train-workers-1-1-*", "node2"),
            ("team/train-driver-0-0-*", "node3")]
        assert {r.gang for r in plan.rows} == {"team/train"} and plan.warnings == ()
    workers, driver = (core.plan(w) for w in core.workloads(jobset(gang="true")))
    assert (workers.gang.size, len(workers.gang.members)) == (4, 4) and driver.gang is None
    assert {r.gang for r in driver.rows} == {""}


def lws(replicas=2, size=3, leader=True, gang="true"):
    """A LeaderWorkerSet of `replicas` groups of `size`; its leader has a template of its own."""
    text = "\n".join(f"{i}=node{i // 3 + 1}:{i % 3}" for i in range(6))
    annotations = {GANG: gang} if gang else None
    lwt = {"size": size, "workerTemplate": template(text, annotations=annotations)}
    if leader:
        lwt["leaderTemplate"] = template(text, annotations=annotations, containers=[{"name": "leader", "image": "i"}])
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "infer", "namespace": "team"}, "spec": {"replicas": replicas, "leaderWorkerTemplate": lwt}}


def test_a_leaderworkerset_plans_its_groups_leader_first():
    [work] = core.workloads(lws())
    assert (work.indexes, work.counted) == (tuple(range(6)), "replicas 2 × size 3 = 6 pods")
    plan = core.plan(work)
    assert [(r.index, r.pod, r.node, r.devices, r.gang) for r in plan.rows] == [
        (0, "infer-0", "node1", ("0",), "team/infer group 0"), (1, "infer-0-1", "node1", ("1",), "team/infer group 0"),
        (2, "infer-0-2", "node1", ("2",), "team/infer group 0"), (3, "infer-1", "node2", ("0",), "team/infer group 1"),
        (4, "infer-1-1", "node2", ("1",), "team/infer group 1"), (5, "infer-1-2", "node2", ("2",), "team/infer group 1")]
    assert [(g.name, g.size, [m.name for m in g.members]) for g in plan.gangs] == [
        ("team/infer group 0", 3, ["team/infer-0", "team/infer-0-1", "team/infer-0-2"]),
        ("team/infer group 1", 3, ["team/infer-1", "team/infer-1-1", "team/infer-1-2"])]
    assert plan.gang == plan.gangs[0] and plan.placeable and plan.warnings == ()
    assert plan.index_source == "LeaderWorkerSet"


def test_a_leaderworkerset_pod_is_what_its_controller_makes():
    [work] = core.workloads(lws())
    leader, worker = core.pod_for(work, 3), core.pod_for(work, 5)
    assert leader["spec"]["containers"][0]["name"] == "leader" and worker["spec"]["containers"][0]["name"] == "c"
    assert leader["metadata"]["ownerReferences"][0] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "infer",
                                                        "controller": True, "blockOwnerDeletion": True}
    assert worker["metadata"]["ownerReferences"][0]["name"] == "infer-1"
    assert {k: v for k, v in worker["metadata"]["labels"].items() if k.startswith("leaderworkerset")} == {
        "leaderworkerset.sigs.k8s.io/name": "infer", "leaderworkerset.sigs.k8s.io/group-index": "1",
        "leaderworkerset.sigs.k8s.io/worker-index": "2"}
    assert worker["metadata"]["annotations"][LWS_SIZE_ANNOTATION] == "3"
    assert worker["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/leader-name"] == "infer-1"
    for index in work.indexes:
        pod = core.pod_for(work, index)
        assert pod_index(pod["metadata"]) == index
        assert gang_key(pod) == ("owner", "team", "LeaderWorkerSet", "infer", str(index // 3))
    [without_leader] = core.workloads(lws(leader=False))
    assert core.pod_for(without_leader, 0)["spec"]["containers"][0]["name"] == "c", "the workerTemplate makes the leader"


def test_a_leaderworkerset_gang_smaller_than_its_group():
    plan = core.plan(core.workload(lws(gang="2")))
    assert [(g.size, len(g.members)) for g in plan.gangs] == [(2, 3), (2, 3)] and plan.warnings == ()


def test_a_leaderworkerset_without_the_map_is_not_ours():
    obj = lws(gang=None)
    for key in ("leaderTemplate", "workerTemplate"):
        del obj["spec"]["leaderWorkerTemplate"][key]["metadata"]["annotations"][ANNOTATION]
    assert core.workloads(obj) == [] and core.workload(obj) is None


def _without(obj, *path):
    obj = yaml.safe_load(yaml.safe_dump(obj))
    *parents, last = path
    target = obj
    for key in parents:
        target = target[key]
    del target[last]
    return obj


def _with(obj, value, *path):
    obj = yaml.safe_load(yaml.safe_dump(obj))
    *parents, last = path
    target = obj
    for key in parents:
        target = target[key]
    target[last] = value
    return obj


RJ = ("spec", "replicatedJobs", 0)
LWT = ("spec", "leaderWorkerTemplate")


@pytest.mark.parametrize("obj,message", [
    (_with(jobset(), "2", *RJ, "replicas"), 'spec.replicatedJobs[0].replicas: expected a non-negative integer, found "2"'),
    (_without(jobset(), *RJ, "template"), "spec.replicatedJobs[0].template: expected an object, found nothing"),
    (_without(jobset(), *RJ, "name"), "spec.replicatedJobs[0].name: a replicated job needs a name, found nothing"),
    (_without(jobset(), *RJ, "template", "spec", "template"),
     "spec.replicatedJobs[0].template.spec.template: expected an object, found nothing"),
    (_with(jobset(), -1, *RJ, "template", "spec", "completions"),
     "spec.replicatedJobs[0].template.spec.completions: expected a non-negative integer, found -1"),
    (_with(jobset(), "NonIndexed", *RJ, "template", "spec", "completionMode"),
     'spec.replicatedJobs[0].template.spec.completionMode: a JobSet\'s pods have an index only with Indexed'),
    (_with(jobset(), [], "spec", "replicatedJobs"), "spec.replicatedJobs: expected a list of replicated jobs, found a list"),
    (_with(jobset(), 5001, *RJ, "replicas"), f"a plan lists at most {core.MAX_REPLICAS} pods"),
    (_without(jobset(), "metadata", "name"), "metadata.name: a JobSet needs a name"),
    (_with(lws(), 0, *LWT, "size"), "spec.leaderWorkerTemplate.size: expected at least 1 (the leader), found 0"),
    (_with(lws(), "3", *LWT, "size"), 'spec.leaderWorkerTemplate.size: expected a non-negative integer, found "3"'),
    (_with(lws(), "2", "spec", "replicas"), 'spec.replicas: expected a non-negative integer, found "2"'),
    (_without(lws(), *LWT, "workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate: expected an object"),
    (_with(lws(), {"metadata": {}}, *LWT, "leaderTemplate"),
     "spec.leaderWorkerTemplate.leaderTemplate.spec: expected an object, found nothing"),
    (_without(lws(), "spec", "leaderWorkerTemplate"), "spec.leaderWorkerTemplate: expected an object, found nothing"),
    (_with(lws(), 5001, "spec", "replicas"), f"a plan lists at most {core.MAX_REPLICAS} pods"),
])
def test_malformed_jobsets_and_leaderworkersets_name_the_field(obj, message):
    with pytest.raises(core.ManifestError) as raised:
        for work in core.workloads(obj):
            core.plan(work)
    assert message in str(raised.value)


# -- pools: a Deployment's pods share the map's entries (issue 44) ----------------------------------
POOL_MAP = "0=node1:0,1\n1=node2:0,1\n2=node3:0,1\n3=node4:0,1\n"


def deployment(replicas=4, strategy=None, text=POOL_MAP, name="web", annotations=None, kind="Deployment", **tmpl):
    spec = {"selector": {"matchLabels": {"app": "w"}},
            "template": template(text, annotations={**(annotations or {})}, **tmpl)}
    if replicas is not None:
        spec["replicas"] = replicas
    if strategy is not None:
        spec["strategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def test_a_deployment_is_a_pool_one_row_per_entry_and_its_replicas_share_them():
    from gpu_scheduler.fit import workload
    from gpu_scheduler.placement import POOL_UNASSIGNED, NotPlaceable, pool_of
    work = core.workload(deployment())
    assert (work.pool, work.indexed, work.replicas, work.indexes) == (True, False, 4, (0, 1, 2, 3))
    plan = core.plan(work)
    assert [(e.entry, e.node, e.devices, e.env["CUDA_VISIBLE_DEVICES"], e.usable) for e in plan.pool.entries] == [
        (0, "node1", ("0", "1"), "0,1", True), (1, "node2", ("0", "1"), "0,1", True),
        (2, "node3", ("0", "1"), "0,1", True), (3, "node4", ("0", "1"), "0,1", True)]
    assert plan.pool.entries[0].nvidia_env == {"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
                                                "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert [(r.index, r.replica, r.pod, r.node, r.placeable) for r in plan.rows] == [
        (None, i, "web-*", "", True) for i in range(4)]
    assert plan.placeable and [w.reason for w in plan.warnings] == ["RolloutWaits"]  # below
    assert plan.pool.workload == {"kind": "Deployment", "namespace": "ns", "name": "web"}
    # each replica as the ReplicaSet creates it: a pool pod of the Deployment, with no entry yet
    pod = plan.rows[0].pod_object
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet" and pool_of(pod) is not None
    assert workload(pod) == ("owner", "ns", "Deployment", "web")
    with pytest.raises(NotPlaceable) as why:
        resolve(pod)
    assert why.value.reason == POOL_UNASSIGNED
    # its containers read their devices from the annotations the Binding writes
    assert plan.rows[0].env["CUDA_VISIBLE_DEVICES"] == {
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpu-scheduler/devices']"}}}
    assert work.counted == "a pool: replicas 4, maxSurge 1 (25%), maxUnavailable 1 (25%)"


@pytest.mark.parametrize("replicas,strategy,surge,unavailable", [
    (4, None, 1, 1),                                  # 25% each: surge rounded up, unavailable down
    (1, None, 1, 0),
    (None, None, 1, 0),                               # replicas default 1
    (10, None, 3, 2),
    (4, {"rollingUpdate": {"maxSurge": "50%"}}, 2, 1),
    (3, {"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": "10%"}}, 1, 0),
    (4, {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, 0, 1),
    (4, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2}}, 2, 1),
    (3, {"rollingUpdate": {"maxSurge": "0%", "maxUnavailable": "10%"}}, 0, 1),  # both 0 once rounded: 1
    (4, {"type": "Recreate"}, 0, 4),
    (0, None, 0, 1),
])
def test_max_surge_is_the_deployment_controllers(replicas, strategy, surge, unavailable):
    work = core.workload(deployment(replicas, strategy))
    assert (work.rollout.max_surge, work.rollout.max_unavailable) == (surge, unavailable)
    assert work.pods_at_once == (replicas if replicas is not None else 1) + (surge if replicas != 0 else 0)


@pytest.mark.parametrize("strategy,message", [
    ({"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}, "maxSurge and maxUnavailable may not both be 0"),
    ({"rollingUpdate": {"maxSurge": "1"}}, 'maxSurge: expected a non-negative integer or a percentage (as "25%"),'
                                           ' found "1"'),
    ({"rollingUpdate": {"maxUnavailable": -1}}, "maxUnavailable: expected a non-negative integer"),
    ({"rollingUpdate": {"maxUnavailable": "150%"}}, "maxUnavailable: 150% is more than 100%"),
    ({"type": "Recreate", "rollingUpdate": {}}, "may not be given when spec.strategy.type is Recreate"),
    ({"type": "BlueGreen"}, 'spec.strategy.type: expected RollingUpdate or Recreate, found "BlueGreen"'),
])
def test_a_strategy_the_api_server_refuses_is_the_workloads_error(strategy, message):
    with pytest.raises(core.ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        core.workload(deployment(4, strategy))


def test_a_rollout_that_needs_more_entries_than_the_map_has_is_warned_about():
    [warning] = core.plan(core.workload(deployment(4))).warnings
    assert warning.reason == "RolloutWaits"
    assert warning.message == (
        "replicas 4 + maxSurge 1 (25% of 4) = 5 pods at once during a rollout, but the pool has 4 usable entries:"
        " the rollout would wait: a new pod gets an entry only when an old one leaves; add entries or set"
        " maxSurge: 0")
    stuck = core.plan(core.workload(deployment(4, {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})))
    assert "with maxUnavailable 0 no old pod leaves before a new one is ready" in stuck.warnings[0].message
    for fine in (deployment(4, {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
                 deployment(4, {"type": "Recreate"}), deployment(3), deployment(0)):
        assert core.plan(core.workload(fine)).warnings == (), fine["spec"]


def test_replicas_beyond_the_entries_are_not_placeable_and_named():
    plan = core.plan(core.workload(deployment(6, {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})))
    assert [r.placeable for r in plan.rows] == [True] * 4 + [False] * 2 and not plan.placeable
    assert plan.rows[5].problems == (core.Note("NoPoolEntry", "replica 5: the pool has 4 usable entries for 6"
                                                              " replicas: the pod finds no entry and stays Pending"),)
    assert [(w.reason, w.message) for w in plan.warnings] == [(
        "ReplicasWithoutEntry", "6 replicas share 4 usable entries: replicas 4, 5 find none and stay Pending; add"
                                " entries to gpu-scheduling-map or lower spec.replicas")]


def test_an_entry_the_templates_selector_excludes_is_never_given():
    plan = core.plan(core.workload(deployment(3, {"type": "Recreate"}, nodeSelector={"kubernetes.io/hostname": "node1"})))
    assert [e.usable for e in plan.pool.entries] == [True, False, False, False]
    assert plan.pool.entries[1].problems[0].reason == "NodeAffinity"
    assert [r.placeable for r in plan.rows] == [True, False, False]
    assert "3 replicas share 1 usable entry" in plan.warnings[0].message


def test_what_looks_wrong_in_a_pool_map_is_warned_about():
    plan = core.plan(core.workload(deployment(2, {"type": "Recreate"}, text="0=node1:0,1\n1=node1:1\n2=node2:0\n")))
    assert [w.reason for w in plan.warnings] == ["EntrySizesDiffer"]
    assert "the entries give 1 to 2 GPUs" in plan.warnings[0].message
    assert [w.message for w in plan.pool.entries[1].warnings] == [
        "entry 1 shares GPUs on node1: device 1 also in entry 0: two pods of the pool may run on them at once"]
    assert not plan.template_counts_exact


def test_a_pool_in_dra_mode_is_placeable_and_one_for_another_scheduler_is_not():
    dra = core.plan(core.workload(deployment(2, annotations={MODE_ANNOTATION: "dra"})))
    assert not dra.rows[0].problems and dra.placeable
    other = core.plan(core.workload(deployment(2, scheduler="default-scheduler")))
    assert [p.reason for p in other.rows[1].problems] == ["NotOurScheduler"]


def test_a_deployment_gang_names_its_replicas_and_warns_when_it_never_forms():
    plan = core.plan(core.workload(deployment(4, annotations={"gpu-scheduler/gang": "true"})))
    assert (plan.gang.name, plan.gang.size) == ("ns/web", 4)
    assert [m.name for m in plan.gang.members] == [f"ns/web-replica-{i}" for i in range(4)]
    short = core.plan(core.workload(deployment(3, annotations={"gpu-scheduler/gang": "true"})))
    assert [w.reason for w in short.warnings] == ["GangNeverForms"]


def test_other_controllers_pods_are_a_pool_with_the_pool_annotation_only():
    pooled = {"gpu-scheduler/pool": "true"}
    replicaset = core.workload(deployment(2, kind="ReplicaSet"))
    assert (replicaset.pool, replicaset.replicas, replicaset.rollout) == (True, 2, None)
    assert core.plan(replicaset).pool.workload == {"kind": "ReplicaSet", "namespace": "ns", "name": "web"}
    daemonset = core.workload(deployment(None, kind="DaemonSet", annotations=pooled))
    assert (daemonset.pool, daemonset.replicas) == (True, None)
    assert [(r.replica, r.pod, r.placeable) for r in core.plan(daemonset).rows] == [(None, "web-*", True)]
    assert not core.workload(deployment(None, kind="DaemonSet")).pool  # no index: as before
    work = core.workload(job(mode="NonIndexed", annotations=pooled, text=POOL_MAP))
    assert (work.pool, work.replicas) == (True, 1)
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "w-", "annotations": {
        ANNOTATION: POOL_MAP, **pooled}}, "spec": {"schedulerName": SCHEDULER_NAME, "containers": []}}
    assert [(r.pod, r.placeable) for r in core.plan(core.workload(bare)).rows] == [("w-*", True)]
    # an index source on the template wins: the pods have an index of their own (here, none)
    indexed = core.workload(deployment(2, annotations={"gpu-scheduler/index-label": "rank"}))
    assert not indexed.pool and core.plan(indexed).rows[0].problems[0].reason == "UnknownIndex"


# -- pools on the cluster: what bind decides for each replica now ----------------------------------
def pool_pod(name, node="", entry=None, deleting=False, phase="Running"):
    """A live pod of Deployment ns/web (ReplicaSet web-7d9f8), holding `entry` on `node`."""
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
            "labels": {"app": "w", "pod-template-hash": "7d9f8"},
            "annotations": {ANNOTATION: POOL_MAP},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9f8", "controller": True}]}
    if entry is not None:
        meta["annotations"].update({"gpu-scheduler/entry": str(entry), "gpu-scheduler/devices": "0,1"})
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    pod = {"metadata": meta, "spec": {"schedulerName": SCHEDULER_NAME, "containers": [{"name": "c"}]},
           "status": {"phase": phase}}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def pool_view(pods=(), ready=("node1", "node2", "node3", "node4")) -> core.ReadView:
    """Four nodes (those in `ready` Ready), with the bound `pods` on theirs."""
    from gpu_scheduler.fit import NodeInfo
    return core.ReadView(lambda name, deciding: NodeSnapshot(
        name, node(name, ready=name in ready), NodeInfo.of([p for p in pods if p["spec"].get("nodeName") == name])),
        pods)


def replicas_of(obj):
    return [dict(row.pod_object) for row in core.plan(core.workload(obj)).rows]


def test_each_replica_takes_the_next_free_entry_as_bind_would_decide_them_in_turn():
    framework = new_framework(SchedulerConfig())
    holder = pool_pod("web-7d9f8-aaaaa", "node2", 1)
    leaving = pool_pod("web-7d9f8-bbbbb", "node4", 3, deleting=True)
    pods = replicas_of(deployment(4))
    said = core.pool_answers(pods, framework, pool_view([holder, leaving, *pods]))
    assert [(a.scheduling.action, a.scheduling.node, a.scheduling.entry) for a in said.answers] == [
        ("bind", "node1", 0), ("bind", "node3", 2), ("wait", "node1", None), ("wait", "node1", None)]
    assert said.answers[0].scheduling.message == "bind to node1, pool entry 0 (GPUs 0,1)"
    refusal = said.answers[2].scheduling
    assert refusal.plugin == "PoolEntry" and refusal.message.startswith(
        "no entry of the pool is free (4 refused): entry 0 (node1:0,1): held by ns/web-replica-0; entry 1"
        " (node2:0,1): held by ns/web-7d9f8-aaaaa; entry 2 (node3:0,1): held by ns/web-replica-1; entry 3"
        " (node4:0,1): held by ns/web-7d9f8-bbbbb (terminating). Add entries")
    assert "a pod leaving the node" in refusal.retried_on
    assert [(e.entry, e.state, e.replica, e.message) for e in said.entries] == [
        (0, core.TAKEN, 0, ""), (1, core.HELD, None, "held by ns/web-7d9f8-aaaaa"), (2, core.TAKEN, 1, ""),
        (3, core.HELD, None, "held by ns/web-7d9f8-bbbbb (terminating)")]


def test_a_bound_replica_holds_its_entry_and_a_free_entry_or_a_refused_one_is_said():
    framework = new_framework(SchedulerConfig())
    bound = pool_pod("web-7d9f8-aaaaa", "node2", 1)
    pods = [bound, *replicas_of(deployment(2))[1:]]
    said = core.pool_answers(pods, framework, pool_view(pods, ready=("node1", "node2", "node4")))
    assert [(a.scheduling.action, a.scheduling.node, a.scheduling.entry) for a in said.answers] == [
        ("nothing", "node2", 1), ("bind", "node1", 0)]
    assert [(e.entry, e.state, e.replica, e.plugin) for e in said.entries] == [
        (0, core.TAKEN, 1, ""), (1, core.HELD, 0, "PoolEntry"), (2, core.REFUSED_ENTRY, None, "NodeReady"),
        (3, core.FREE, None, "")]
    assert "not Ready" in said.entries[2].message


def test_a_pool_gangs_replicas_are_decided_together_on_distinct_entries():
    framework = new_framework(SchedulerConfig())
    pods = replicas_of(deployment(4, annotations={"gpu-scheduler/gang": "4"}))
    said = core.pool_answers(pods, framework, pool_view(pods))
    assert sorted(a.scheduling.entry for a in said.answers) == [0, 1, 2, 3]
    assert said.answers[0].gang.verdict.message == "bind 4 members together"
    assert [e.state for e in said.entries] == [core.TAKEN] * 4
    # one entry's node not Ready: the gang of 4 cannot form, every replica waits with its refusal
    held = core.pool_answers(pods, framework, pool_view(pods, ready=("node1", "node2", "node3")))
    assert {a.scheduling.action for a in held.answers} == {"wait"}
    assert held.answers[0].gang.verdict.plugin == "Gang"


def test_explain_reads_a_pool_pods_devices_from_its_annotations():
    from gpu_scheduler.devices import pool_device_env
    pod = pool_pod("web-7d9f8-aaaaa", "node2", 1)
    pod["spec"]["containers"][0]["env"] = [{"name": k, **({"value": v} if isinstance(v, str) else {"valueFrom": v})}
                                           for k, v in pool_device_env("nvidia").items()]
    pod["metadata"]["annotations"]["gpu-scheduler/device-ordinals"] = "0,1"
    assert core.device_env_of(pod) == {"c": {"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
                                             "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    assert core.device_env_refs(pod) == {"c": {"NVIDIA_VISIBLE_DEVICES": "gpu-scheduler/devices",
                                               "CUDA_VISIBLE_DEVICES": "gpu-scheduler/device-ordinals"}}
    assert core.pool_env_mode(pod) == "nvidia"
    pending = pool_pod("web-7d9f8-new")
    pending["spec"]["containers"][0]["env"] = pod["spec"]["containers"][0]["env"]
    assert core.device_env_of(pending)["c"]["CUDA_VISIBLE_DEVICES"] is None  # not written until bound
    assert core.pool_env_mode(pending) == "nvidia" and core.pool_env_mode(pool_pod("x")) is None
    framework = new_framework(SchedulerConfig())
    said = core.answer(pending, framework, pool_view([pod]))
    assert (said.scheduling.action, said.scheduling.entry) == ("bind", 0)
    states = list(core.entry_states(pending, framework, pool_view([pod]), {0: None}))
    assert [(s.state, s.replica) for s in states] == [(core.TAKEN, None), (core.HELD, None), (core.FREE, None),
                                                      (core.FREE, None)]


def test_each_entrys_state_is_bind_s_verdict_on_that_entry_of_the_whole_map():
    """Entries of one map that share a GPU are distinct entries (the map says the pods share it):
    one held leaves the other free, as bind's PoolEntry says."""
    framework = new_framework(SchedulerConfig())
    text = "0=node1:0\n1=node1:0\n2=node2:0\n"
    holder = pool_pod("web-7d9f8-aaaaa", "node1", 0)
    holder["metadata"]["annotations"].update({ANNOTATION: text, "gpu-scheduler/devices": "0"})
    pending = pool_pod("web-7d9f8-new")
    pending["metadata"]["annotations"][ANNOTATION] = text
    states = list(core.entry_states(pending, framework, pool_view([holder]), {}))
    assert [(s.entry, s.state) for s in states] == [(0, core.HELD), (1, core.FREE), (2, core.FREE)]
