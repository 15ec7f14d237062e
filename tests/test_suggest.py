"""suggest's choosing (gpu_scheduler/suggest.py) on snapshots built here: every entry it writes
passes bind's own filters on the node as it was (the devices given to earlier replicas of the
same manifest taken out), --spread and --pack order the nodes as they say, DRA devices come from
ResourceSlices and stay under one PCIe root, and a request that does not fit says how many GPUs
are free and where. No Kubernetes API."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest

from gpu_scheduler import ANNOTATION, SCHEDULER_NAME
from gpu_scheduler.fit import NodeInfo
from gpu_scheduler.plugins.config import SchedulerConfig
from gpu_scheduler.plugins.registry import new_framework
from gpu_scheduler.framework.runtime import Framework
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.plan import workload
from gpu_scheduler.plugins.dynamicresources import allocator as dra
from gpu_scheduler.records import Record
from gpu_scheduler.schedmap import parse_map
from gpu_scheduler.suggest import (
    PACK, SPREAD, Placed, Shortfall, SuggestError, annotate, candidate_pod, pick, suggest,
)

CONFIG = SchedulerConfig()
FRAMEWORK = new_framework(CONFIG)
NOW = time.time()


def node(name: str, gpus: int | None = 4, ready: bool = True, cordoned: bool = False, cpu: str = "64",
         labels: dict | None = None) -> dict:
    capacity = {"cpu": cpu, "memory": "256Gi", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def holder(name: str, on: str, devices: str, namespace: str = "other") -> dict:
    """A running pod of another workload holding `devices` on node `on`."""
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "annotations": {"gpu-scheduler/devices": devices},
                         "ownerReferences": [{"kind": "StatefulSet", "name": name, "controller": True}]},
            "spec": {"nodeName": on, "schedulerName": SCHEDULER_NAME, "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}}


def snapshot(obj: dict, pods=(), records=(), **extra) -> NodeSnapshot:
    name = obj["metadata"]["name"]
    return NodeSnapshot(name, obj, NodeInfo.of(pods), {r.device: r for r in records}, now=NOW, **extra)


def record(on: str, device: str, holder_key: str = "StatefulSet other/ghost") -> Record:
    """bind's record of a device given moments ago (its pod not bound yet): held for its grace."""
    return Record(f"{on}-{device}", on, device, (holder_key,), False, NOW - 5, "1", "other/ghost-0", "uid-ghost")


def statefulset(replicas: int = 3, name: str = "train", namespace: str = "team", dra_mode: bool = False,
                cpu: str | None = None, **template_spec) -> dict:
    annotations = {"gpu-scheduler/device-env": "dra"} if dra_mode else {}
    container = {"name": "c", "image": "i", **({"resources": {"requests": {"cpu": cpu}}} if cpu else {})}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}, "annotations": annotations},
                                  "spec": {"schedulerName": SCHEDULER_NAME, "containers": [container],
                                           **template_spec}}}}


def run(obj: dict, gpus: int, strategy: str, nodes, config=CONFIG):
    [result] = suggest([workload(obj)], gpus, strategy, nodes, new_framework(config), config)
    return result


def entries(result: Placed) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {c.index: (c.node, c.devices) for c in result.choices}


def bind_passes_each_entry(obj: dict, result: Placed, nodes: list[NodeSnapshot]) -> None:
    """Each entry, in the map suggest wrote, through bind's framework on its node as it was; and
    no device twice."""
    by_name = {n.name: n for n in nodes}
    work = workload(obj)
    for choice in result.choices:
        pod = candidate_pod(work, choice.index, result.map_text)
        assert FRAMEWORK.decide(pod, lambda name: dataclasses.replace(by_name[name], claims={})).status.ok, choice
    given = [(c.node, d) for c in result.choices for d in c.devices]
    assert len(given) == len(set(given))
    assert len(parse_map(result.map_text)) == len(result.choices)


def test_spread_puts_one_replica_per_node_first_on_devices_no_one_holds():
    nodes = [snapshot(node("a"), pods=[holder("h", "a", "0")]),
             snapshot(node("b"), records=[record("b", "1")]),
             snapshot(node("c"))]
    obj = statefulset(4)
    result = run(obj, 2, SPREAD, nodes)
    assert isinstance(result, Placed)
    assert entries(result) == {0: ("a", ("1", "2")), 1: ("b", ("0", "2")), 2: ("c", ("0", "1")),
                               3: ("c", ("2", "3"))}
    assert result.map_text == "0=a:1,2\n1=b:0,2\n2=c:0,1\n3=c:2,3\n"
    bind_passes_each_entry(obj, result, nodes)


def test_pack_fills_a_node_before_the_next():
    nodes = [snapshot(node("a"), pods=[holder("h", "a", "3")]), snapshot(node("b")), snapshot(node("c"))]
    obj = statefulset(4)
    result = run(obj, 1, PACK, nodes)
    assert entries(result) == {0: ("a", ("0",)), 1: ("a", ("1",)), 2: ("a", ("2",)), 3: ("b", ("0",))}
    bind_passes_each_entry(obj, result, nodes)


def test_nodes_bind_refuses_are_not_used_and_are_named_when_it_does_not_fit():
    nodes = [snapshot(node("cordoned", cordoned=True)), snapshot(node("down", ready=False)),
             snapshot(node("cpu-only", gpus=None)), snapshot(node("a"), pods=[holder("h", "a", "0,1")]),
             snapshot(node("b"), records=[record("b", "3")])]
    obj = statefulset(3)
    result = run(obj, 2, SPREAD, nodes)
    assert isinstance(result, Shortfall)
    assert [c.entry for c in result.placed] == ["0=a:2,3", "1=b:0,1"]
    assert result.unplaced == (2,)
    message = result.message
    assert message.startswith("StatefulSet team/train: 3 replicas x 2 GPUs = 6 GPUs do not fit: 5 GPUs are free now:"
                              " a 2,3; b 0,1,2; each replica needs 2 on one node. 2 of 3 replicas fit; index 2"
                              " does not (after the 2 that fit, 1 GPU left: b 2)")
    assert "cordoned (NodeUnschedulable: node cordoned is cordoned (spec.unschedulable))" in message
    assert "down (NodeReady: node down is not Ready)" in message
    assert "cpu-only (NoGPUs: node cpu-only advertises no nvidia.com/gpu)" in message


def test_each_replica_placed_counts_on_its_node_for_the_next():
    """bind's NodeResourcesFit sees the replicas already chosen: 40 of 64 CPUs each, one a node."""
    nodes = [snapshot(node("a")), snapshot(node("b"))]
    obj = statefulset(2, cpu="40")
    result = run(obj, 1, PACK, nodes)
    assert entries(result) == {0: ("a", ("0",)), 1: ("b", ("0",))}
    assert isinstance(run(statefulset(3, cpu="40"), 1, PACK, nodes), Shortfall)


def test_the_template_s_node_selector_keeps_replicas_on_its_nodes():
    nodes = [snapshot(node("a")), snapshot(node("b", labels={"pool": "mine"}))]
    obj = statefulset(2, nodeSelector={"pool": "mine"})
    result = run(obj, 2, SPREAD, nodes)
    assert entries(result) == {0: ("b", ("0", "1")), 1: ("b", ("2", "3"))}
    short = run(statefulset(3, nodeSelector={"pool": "mine"}), 2, SPREAD, nodes)
    assert "no GPU free on a (NodeAffinity:" in short.message


def test_a_second_workload_does_not_get_the_first_ones_devices():
    nodes = [snapshot(node("a"))]
    first, second = statefulset(1, name="one"), statefulset(1, name="two")
    results = suggest([workload(first), workload(second)], 2, PACK, nodes, FRAMEWORK, CONFIG)
    assert [r.map_text for r in results] == ["0=a:0,1\n", "0=a:2,3\n"]


# -- DRA mode -------------------------------------------------------------------------------------------
def slice_of(on: str, devices: list[tuple[str, str | None]], driver: str = "gpu.nvidia.com") -> dict:
    """A ResourceSlice of `on`'s devices: (name, PCIe root or None)."""
    return {"spec": {"driver": driver, "nodeName": on, "pool": {"name": on, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": name, "attributes": {
                         "index": {"int": int(name.rsplit("-", 1)[1])},
                         **({dra.PCIE_ROOT: {"string": root}} if root else {})}} for name, root in devices]}}


def test_dra_devices_come_from_the_slices_and_stay_under_one_pcie_root():
    roots = [("gpu-0", "pci0000:00"), ("gpu-1", "pci0000:00"), ("gpu-2", "pci0000:80"), ("gpu-3", "pci0000:80")]
    theirs = dra.Device("gpu.nvidia.com", "a", "gpu-1")
    nodes = [snapshot(node("a", gpus=None), slices=(slice_of("a", roots),), held={theirs: "other/theirs"}),
             snapshot(node("b", gpus=None), slices=(slice_of("b", roots),))]
    obj = statefulset(3, dra_mode=True)
    result = run(obj, 2, PACK, nodes)
    # a: gpu-1 is another claim's, so only root pci0000:80 has two free; 0 and 2 would cross roots.
    assert entries(result) == {0: ("a", ("2", "3")), 1: ("b", ("0", "1")), 2: ("b", ("2", "3"))}
    bind_passes_each_entry(obj, result, nodes)

    short = run(statefulset(1, dra_mode=True), 3, PACK, nodes)
    assert isinstance(short, Shortfall)
    assert "each replica needs 3 on one node under one PCIe root (resource.kubernetes.io/pcieRoot)" in short.message
    assert "3 GPUs are free now" not in short.message and "7 GPUs are free now: a 0,2,3; b 0,1,2,3" in short.message


def test_dra_without_pcie_roots_takes_any_free_devices_of_the_node():
    flat = [(f"gpu-{i}", None) for i in range(4)]
    nodes = [snapshot(node("a", gpus=None), slices=(slice_of("a", flat),),
                      held={dra.Device("gpu.nvidia.com", "a", "gpu-1"): "other/theirs"})]
    result = run(statefulset(1, dra_mode=True), 3, PACK, nodes)
    assert result.map_text == "0=a:0,2,3\n"


def test_dra_a_node_without_slices_of_a_ruled_driver_is_named():
    nodes = [snapshot(node("a", gpus=None))]
    short = run(statefulset(1, dra_mode=True), 1, PACK, nodes)
    assert ("no GPU free on a (NoGPUs: no ResourceSlice of node a publishes a device of driver gpu.nvidia.com"
            " (DeviceClass gpu.nvidia.com))") in short.message
    assert "1 replica x 1 GPU = 1 GPU do not fit: 0 GPUs are free now" in short.message


@pytest.mark.parametrize("rule, device, body, expected", [
    ({"name": "gpu-{index}"}, "gpu-3", {}, "3"),
    ({"name": "device-{index:02d}"}, "device-07", {}, "7"),
    ({"name": "device-{index:02d}"}, "device-7", {}, None),
    ({"name": "gpu-{index}"}, "nic-3", {}, None),
    ({"attribute": "index"}, "x", {"attributes": {"index": {"int": 5}}}, "5"),
    ({"attribute": "uuid", "table": {"a": {"1": "GPU-aaaa"}}}, "x", {"attributes": {"uuid": {"string": "GPU-aaaa"}}}, "1"),
    ({"attribute": "uuid", "table": {"a": {"1": "GPU-aaaa"}}}, "x", {"attributes": {"uuid": {"string": "GPU-bbbb"}}}, None),
])
def test_a_device_s_map_device_is_what_the_rule_turns_into_it(rule, device, body, expected):
    parsed = dra.parse_rules('{"gpu.nvidia.com": %s}' % __import__("json").dumps(rule))["gpu.nvidia.com"]
    assert dra.map_device(parsed, "a", dra.Device("gpu.nvidia.com", "a", device), body) == expected


# -- picking and bad requests -----------------------------------------------------------------------------
def test_pick_takes_the_fullest_fitting_group_and_its_lowest_devices():
    groups = {"0": "r0", "1": "r0", "2": "r1", "3": "r1", "4": "r1", "10": "r1"}
    assert pick(["0", "1", "2", "3", "4", "10"], groups, 2) == ("0", "1")
    assert pick(["0", "2", "3", "10"], groups, 2) == ("2", "3")
    assert pick(["0", "2", "10", "3"], groups, 3) == ("2", "3", "10")
    assert pick(["0", "2"], groups, 2) is None


@pytest.mark.parametrize("obj, gpus, words", [
    (statefulset(2), 0, "--gpus 0: each replica needs at least 1 GPU; give --gpus 1 or more"),
    (statefulset(0), 1, "StatefulSet team/train: spec.replicas is 0, so there is nothing to place;"
                        " set spec.replicas to 1 or more"),
    ({**statefulset(0), "kind": "Deployment"}, 1, "Deployment team/train: spec.replicas is 0, so there is nothing"
                                                  " to place; set spec.replicas to 1 or more"),
    ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
      "spec": {"template": statefulset()["spec"]["template"]}}, 1,
     "Job default/j: a NonIndexed Job's pods are named with generateName, so a map cannot name them; suggest places"
     " the replicas of a StatefulSet, a Job with completionMode: Indexed, a JobSet's replicated jobs, a"
     " LeaderWorkerSet or a Deployment (its pool)"),
    ({**statefulset(2, dra_mode=True), "kind": "Deployment"}, 1,
     "Deployment team/train: suggest does not write a pool's map in device mode dra yet"),
    (statefulset(2, schedulerName="default-scheduler"), 1,
     "spec.template.spec.schedulerName is default-scheduler, so bind would not place the replicas; set it to"
     " gpu-scheduler"),
])
def test_bad_requests_name_the_fix(obj, gpus, words):
    obj = dict(obj)
    if obj["kind"] == "Deployment":  # workload() passes over a Deployment without the map
        annotate_deployment = obj["spec"]["template"]["metadata"]["annotations"]
        obj = {**obj, "spec": {**obj["spec"], "template": {**obj["spec"]["template"], "metadata": {
            **obj["spec"]["template"]["metadata"], "annotations": {**annotate_deployment, ANNOTATION: "0=a:0"}}}}}
    with pytest.raises(SuggestError) as raised:
        suggest([workload(obj)], gpus, SPREAD, [snapshot(node("a"))], FRAMEWORK, CONFIG)
    assert words in str(raised.value)


def test_annotate_writes_the_map_into_the_pod_template():
    obj = statefulset(1)
    obj["spec"]["template"]["metadata"] = {}
    annotate(obj, "0=a:0\n")
    assert obj["spec"]["template"]["metadata"]["annotations"] == {ANNOTATION: "0=a:0\n"}


def test_an_indexed_job_s_completions_are_its_replicas():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "team"},
           "spec": {"completionMode": "Indexed", "completions": 3, "template": statefulset()["spec"]["template"]}}
    result = run(job, 4, SPREAD, [snapshot(node("a")), snapshot(node("b")), snapshot(node("c"))])
    assert result.map_text == "0=a:0,1,2,3\n1=b:0,1,2,3\n2=c:0,1,2,3\n"
    assert [c.pod for c in result.choices] == ["j-0-*", "j-1-*", "j-2-*"]
    bind_passes_each_entry(job, result, [snapshot(node("a")), snapshot(node("b")), snapshot(node("c"))])


def test_many_nodes_and_replicas_are_chosen_in_bounded_time():
    """Each device is decided once per node until a replica is placed there, not once per replica."""
    nodes = [snapshot(node(f"n{i:03d}", gpus=8)) for i in range(200)]
    started = time.monotonic()
    result = run(statefulset(400), 4, PACK, nodes)
    assert isinstance(result, Placed) and len(result.choices) == 400
    assert time.monotonic() - started < 30


# -- JobSet and LeaderWorkerSet ------------------------------------------------------------------------
from gpu_scheduler.plan import plan as plan_of, workloads  # noqa: E402

GANG = "gpu-scheduler/gang"


def pod_template(containers=("c",), gang: bool = True) -> dict:
    return {"metadata": {"annotations": {GANG: "true"} if gang else {}},
            "spec": {"schedulerName": SCHEDULER_NAME, "containers": [{"name": c, "image": "i"} for c in containers]}}


def jobset() -> dict:
    """Workers: 2 Jobs of 2 pods; driver: 1 Job of 1 pod; no map yet (suggest's input)."""
    def job(name, replicas, n):
        return {"name": name, "replicas": replicas,
                "template": {"spec": {"parallelism": n, "completions": n, "template": pod_template()}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "train", "namespace": "team"},
            "spec": {"replicatedJobs": [job("workers", 2, 2), job("driver", 1, 1)]}}


def lws(leader: bool = True) -> dict:
    lwt = {"size": 3, "workerTemplate": pod_template()}
    if leader:
        lwt["leaderTemplate"] = pod_template(("leader",))
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "infer", "namespace": "team"}, "spec": {"replicas": 2, "leaderWorkerTemplate": lwt}}


def with_empty_maps(obj: dict) -> dict:
    """What the plugin gives suggest: the templates as if they had a map (cli._with_map)."""
    from kubectl_gpu_scheduler.cli import _with_map
    return _with_map(obj)


def suggested(obj: dict, gpus: int, strategy: str, nodes) -> list:
    results = suggest(workloads(with_empty_maps(obj)), gpus, strategy, nodes, FRAMEWORK, CONFIG)
    for result in results:
        assert isinstance(result, Placed), result.message
        annotate(obj, result.map_text, result.work.part)
    return results


def test_a_jobset_gets_a_map_on_each_replicated_job_that_plan_then_places():
    nodes = [snapshot(node("a")), snapshot(node("b")), snapshot(node("c"))]
    obj = jobset()
    workers, driver = suggested(obj, 2, SPREAD, nodes)
    assert (workers.work.part, workers.map_text) == ("workers", "0=a:0,1\n1=a:2,3\n2=b:0,1\n3=b:2,3\n")
    assert (driver.work.part, driver.map_text) == ("driver", "0=c:0,1\n"), "a's and b's GPUs went to the workers"
    texts = [job["template"]["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
             for job in obj["spec"]["replicatedJobs"]]
    assert texts == [workers.map_text, driver.map_text]
    plans = [plan_of(work) for work in workloads(obj)]
    assert [[(r.index, r.node, r.devices) for r in p.rows] for p in plans] == [
        [(c.index, c.node, c.devices) for c in result.choices] for result in (workers, driver)]
    assert all(p.placeable for p in plans) and plans[0].gang.size == 5 and len(plans[0].gang.members) == 5


def test_a_leaderworkerset_gets_one_map_on_both_templates_each_group_on_one_node():
    nodes = [snapshot(node("a"), pods=[holder("h", "a", "0")]), snapshot(node("b")), snapshot(node("c"))]
    obj = lws()
    [result] = suggested(obj, 1, PACK, nodes)
    # Pack would fill a's 3 free GPUs with group 0 and b with group 1: each group whole on one node.
    assert entries(result) == {0: ("a", ("1",)), 1: ("a", ("2",)), 2: ("a", ("3",)),
                               3: ("b", ("0",)), 4: ("b", ("1",)), 5: ("b", ("2",))}
    lwt = obj["spec"]["leaderWorkerTemplate"]
    assert lwt["leaderTemplate"]["metadata"]["annotations"][ANNOTATION] == result.map_text
    assert lwt["workerTemplate"]["metadata"]["annotations"][ANNOTATION] == result.map_text
    plan = plan_of(workloads(obj)[0])
    assert plan.placeable and [(r.pod, r.node) for r in plan.rows][::3] == [("infer-0", "a"), ("infer-1", "b")]
    assert [(g.name, {m.node for m in g.members}) for g in plan.gangs] == [
        ("team/infer group 0", {"a"}), ("team/infer group 1", {"b"})]


def test_a_group_goes_whole_to_a_node_that_holds_it_rather_than_split():
    nodes = [snapshot(node("a"), pods=[holder("h", "a", "0,1")]), snapshot(node("b"))]
    [result] = suggested(lws(leader=False), 1, PACK, nodes)
    assert [c.node for c in result.choices] == ["b", "b", "b", "a", "a", "b"], (
        "group 0 on b, which holds it whole; group 1: a's 2 free, then b's last")
    assert "leaderTemplate" not in lws(leader=False)["spec"]["leaderWorkerTemplate"]


def test_spread_puts_each_group_on_its_own_node():
    nodes = [snapshot(node("a")), snapshot(node("b")), snapshot(node("c"))]
    [result] = suggested(lws(), 1, SPREAD, nodes)
    assert [c.node for c in result.choices] == ["a", "a", "a", "b", "b", "b"]


def test_a_leaderworkerset_that_does_not_fit_names_it():
    nodes = [snapshot(node("a", gpus=2))]
    [result] = suggest(workloads(with_empty_maps(lws())), 1, PACK, nodes, FRAMEWORK, CONFIG)
    assert isinstance(result, Shortfall) and result.unplaced == (2, 3, 4, 5)
    assert result.message.startswith("LeaderWorkerSet team/infer: 6 replicas x 1 GPU = 6 GPUs do not fit: 2 GPUs are"
                                     " free now: a 0,1")


def test_a_jobset_or_leaderworkerset_template_for_another_scheduler_names_its_field():
    obj = lws()
    obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["schedulerName"] = "default-scheduler"
    with pytest.raises(SuggestError, match="spec.leaderWorkerTemplate.leaderTemplate.spec.schedulerName is"
                                           " default-scheduler"):
        suggest(workloads(with_empty_maps(obj)), 1, PACK, [snapshot(node("a"))], FRAMEWORK, CONFIG)


# -- a Deployment: a pool, one entry for each pod its rollout runs at once ------------------------------
def deployment(replicas: int = 4, strategy: dict | None = None, **kwargs) -> dict:
    """A Deployment as the plugin gives it to suggest (its template as if it had a map)."""
    obj = {**statefulset(replicas, name="web", **kwargs), "kind": "Deployment"}
    obj["spec"].pop("serviceName")
    if strategy is not None:
        obj["spec"]["strategy"] = strategy
    return with_empty_maps(obj)


def pool_of_map(obj: dict, text: str) -> dict:
    annotated = json.loads(json.dumps(obj))
    annotate(annotated, text)
    return annotated


def test_a_deployment_gets_an_entry_for_each_replica_and_its_surge_on_free_gpus_that_bind_then_gives():
    from gpu_scheduler import plan as core
    nodes = [snapshot(node("a"), pods=[holder("h", "a", "0")]), snapshot(node("b")), snapshot(node("c"))]
    obj = deployment(4)  # maxSurge 25% of 4: 1
    result = run(obj, 2, SPREAD, nodes)
    assert isinstance(result, Placed)
    assert result.map_text == "0=a:1,2\n1=b:0,1\n2=c:0,1\n3=b:2,3\n4=c:2,3\n"
    assert [c.pod for c in result.choices] == ["web-*"] * 5
    # the map written into the template: plan sees a pool of 5 entries for 4 replicas (no rollout warning),
    # and bind's framework gives each replica, then the surge pod, an entry of its own
    annotated = pool_of_map(obj, result.map_text)
    assert annotated["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] == result.map_text
    plan = core.plan(core.workload(annotated))
    assert plan.warnings == () and plan.placeable
    by_name = {n.name: n for n in nodes}
    pods = [dict(row.pod_object) for row in plan.rows] + [{**plan.rows[0].pod_object, "metadata": {
        **plan.rows[0].pod_object["metadata"], "name": "web-surge"}}]
    view = core.ReadView(lambda name, deciding: by_name[name], pods)
    said = core.pool_answers(pods, FRAMEWORK, view)
    assert [a.scheduling.entry for a in said.answers] == [0, 1, 2, 3, 4]


def test_pack_fills_a_node_with_a_pools_entries_first():
    nodes = [snapshot(node("a")), snapshot(node("b"))]
    result = run(deployment(2, {"type": "Recreate"}), 1, PACK, nodes)
    assert result.map_text == "0=a:0\n1=a:1\n"


def test_a_pool_that_does_not_fit_names_its_entries():
    nodes = [snapshot(node("a", gpus=2)), snapshot(node("b", gpus=2))]
    result = run(deployment(2), 2, SPREAD, nodes)  # 2 replicas + maxSurge 1 = 3 entries of 2 GPUs: 6 > 4
    assert isinstance(result, Shortfall)
    assert result.message.startswith("Deployment team/web: 3 entries x 2 GPUs = 6 GPUs do not fit: 4 GPUs are free"
                                      " now: a 0,1; b 0,1; each entry needs 2 on one node. 2 of 3 entries fit;"
                                      " entry 2 does not")


def test_the_running_deployments_own_entries_do_not_hold_its_new_map():
    # its running pods hold entries 0 and 1 of the old map: a rollout replaces them, so the new map
    # may use those indexes (and, as a StatefulSet's, its own pods' GPUs)
    running = [{**holder(f"web-old{i}", on, "0,1", namespace="team"), "metadata": {
        "name": f"web-old{i}", "namespace": "team", "uid": f"old{i}",
        "labels": {"pod-template-hash": "old"},
        "annotations": {"gpu-scheduler/devices": "0,1", "gpu-scheduler/entry": str(i), ANNOTATION: "0=a:0,1\n1=b:0,1"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-old", "controller": True}]}}
        for i, on in enumerate(("a", "b"))]
    nodes = [snapshot(node("a", gpus=2), pods=[running[0]]), snapshot(node("b", gpus=2), pods=[running[1]])]
    result = run(deployment(2, {"type": "Recreate"}), 2, SPREAD, nodes)
    assert isinstance(result, Placed) and result.map_text == "0=a:0,1\n1=b:0,1\n"


def test_annotate_writes_a_deployments_map_into_its_pod_template():
    obj = deployment(1)
    annotate(obj, "0=a:0\n")
    assert obj["spec"]["template"]["metadata"]["annotations"] == {ANNOTATION: "0=a:0\n"}
    assert "annotations" not in obj["metadata"]
