"""The fit checks and GPU accounting (gpu_scheduler/fit.py): every rule on small tables, and
properties over random pods. The same checks against kube-scheduler itself, side by side, are in
test_fit_scheduler.py."""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_scheduler import fit
from decide import problem as bind_problem
from decide import problem as fit_problem
from gpu_scheduler.fit import DEVICES_ANNOTATION, SHARE_ANNOTATION, NodeInfo, PodInfo, parse_quantity, pod_requests
from gpu_scheduler.plugins.gpusheld import gpus_held as _gpus_held
from gpu_scheduler.podinputs import PodInputs
from gpu_scheduler.plugins.nodeports import PORTS_REASON, node_ports
from gpu_scheduler.plugins.noderesourcesfit import node_resources_fit
from gpu_scheduler.schedmap import Placement


def gpus_held(pod, placement: Placement, info: NodeInfo) -> str | None:
    return _gpus_held(PodInputs.of(pod), placement.devices, placement.node, info.pods)

NODE = {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "zone": "a", "gen": "3"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi", "pods": "10",
                                   "nvidia.com/gpu": "4", "example.com/fpga": "2"},
                   "capacity": {"nvidia.com/gpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}
HERE = Placement("n1", ("3",))


def container(name="c", requests=None, limits=None, ports=None, restart=None):
    c = {"name": name, "image": "x"}
    if requests or limits:
        c["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    if ports:
        c["ports"] = ports
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(name="p", containers=None, init=None, overhead=None, owner=None, record=None, phase=None,
        map_text=None, node="n1", share=False, pod_resources=None, **spec):
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner,
                                    "uid": f"uid-{owner}", "controller": True}]
    if record is not None:
        meta["annotations"][DEVICES_ANNOTATION] = record
    if map_text is not None:
        meta["annotations"]["gpu-scheduling-map"] = map_text
        meta["labels"] = {"apps.kubernetes.io/pod-index": name.rsplit("-", 1)[-1]}
    if share:
        meta["annotations"][SHARE_ANNOTATION] = "true"
    body = {"containers": containers or [container()], "nodeName": node, "schedulerName": "gpu-scheduler", **spec}
    if init:
        body["initContainers"] = init
    if overhead:
        body["overhead"] = overhead
    if pod_resources:
        body["resources"] = {"requests": pod_resources}
    result = {"metadata": meta, "spec": body, "status": {"phase": phase} if phase else {}}
    return result


# -- quantities ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("1", 1), ("250m", Fraction(1, 4)), ("1.5", Fraction(3, 2)), ("2k", 2000), ("1Ki", 1024), ("1.5Gi", 3 * 2**29),
    ("1e3", 1000), ("1E-3", Fraction(1, 1000)), ("100n", Fraction(1, 10**7)), ("5u", Fraction(5, 10**6)),
    ("3M", 3 * 10**6), ("1Ei", 2**60), (".5", Fraction(1, 2)), ("7", 7), (4, 4),
])
def test_quantities_parse_exactly(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "x", "1Kb", "1.2.3", "--1", True, None, [], "1" * 100, "1 Gi"])
def test_what_is_not_a_quantity_is_none(text):
    assert parse_quantity(text) is None


def test_cpu_rounds_up_to_millicores_and_the_rest_to_units():
    assert (pod_requests(pod(containers=[container(requests={"cpu": "0.0001", "memory": "0.5"})])) ==
            {"cpu": 1, "memory": 1})


# -- the effective request -------------------------------------------------------------------------
def cpu(value):
    return {"cpu": value}


@pytest.mark.parametrize("containers, init, overhead, pod_resources, expected", [
    ([container(requests=cpu("1")), container("d", requests=cpu("500m"))], None, None, None, 1500),
    # a regular init container bigger than the containers sets the request
    ([container(requests=cpu("1"))], [container("i", requests=cpu("3"))], None, None, 3000),
    ([container(requests=cpu("2"))], [container("i", requests=cpu("1"))], None, None, 2000),
    # a sidecar adds to the containers' sum ...
    ([container(requests=cpu("1"))], [container("s", requests=cpu("500m"), restart="Always")], None, None, 1500),
    # ... and to every regular init container started after it, not before
    ([container(requests=cpu("1"))],
     [container("s", requests=cpu("1"), restart="Always"), container("i", requests=cpu("2"))], None, None, 3000),
    ([container(requests=cpu("1"))],
     [container("i", requests=cpu("2")), container("s", requests=cpu("1"), restart="Always")], None, None, 2000),
    # overhead is added last
    ([container(requests=cpu("1"))], [container("i", requests=cpu("3"))], cpu("250m"), None, 3250),
    # limits alone default the request, as the API server does
    ([container(limits=cpu("2"))], None, None, None, 2000),
    ([container(requests=cpu("1"), limits=cpu("2"))], None, None, None, 1000),
    # pod-level requests replace the containers' cpu and memory
    ([container(requests=cpu("1"))], None, cpu("100m"), cpu("3"), 3100),
])
def test_the_effective_cpu_request(containers, init, overhead, pod_resources, expected):
    assert pod_requests(pod(containers=containers, init=init, overhead=overhead,
                            pod_resources=pod_resources))["cpu"] == expected


def test_extended_resources_are_summed_like_cpu():
    p = pod(containers=[container(requests={"example.com/fpga": "1"}), container("d", requests={"example.com/fpga": "1"})])
    assert pod_requests(p) == {"example.com/fpga": 2}


# -- NodeResourcesFit ------------------------------------------------------------------------------
def others(*pods):
    return NodeInfo.of(pods)


@pytest.mark.parametrize("wanted, used, fits", [
    ("1", ["3"], True), ("1", ["3", "1m"], False), ("4", [], True), ("4001m", [], False),
    ("500m", ["3500m"], True), ("501m", ["3500m"], False),
])
def test_cpu_fits_in_what_is_left(wanted, used, fits):
    problem = node_resources_fit(pod(containers=[container(requests=cpu(wanted))]), NODE,
                                 others(*[pod(f"o{i}", containers=[container(requests=cpu(u))]) for i, u in enumerate(used)]))
    assert (problem is None) == fits
    if not fits:
        assert problem.startswith("node n1: Insufficient cpu")


def test_terminal_pods_are_not_counted():
    held = [pod("done", containers=[container(requests=cpu("4"))], phase="Succeeded"),
            pod("failed", containers=[container(requests=cpu("4"))], phase="Failed")]
    assert node_resources_fit(pod(containers=[container(requests=cpu("4"))]), NODE, others(*held)) is None
    running = pod("running", containers=[container(requests=cpu("4"))], phase="Running")
    assert "Insufficient cpu" in node_resources_fit(pod(containers=[container(requests=cpu("1"))]), NODE, others(running))


@pytest.mark.parametrize("requests, reason", [
    ({"memory": "9Gi"}, "Insufficient memory"),
    ({"ephemeral-storage": "101Gi"}, "Insufficient ephemeral-storage"),
    ({"example.com/fpga": "3"}, "Insufficient example.com/fpga"),
    ({"example.com/absent": "1"}, "Insufficient example.com/absent"),  # the node has none of it
    ({"nvidia.com/gpu": "5"}, "Insufficient nvidia.com/gpu"),
])
def test_every_resource_the_pod_requests_is_checked(requests, reason):
    assert reason in node_resources_fit(pod(containers=[container(requests=requests)]), NODE, others())


def test_a_pod_without_requests_fits_and_too_many_pods_does_not():
    assert node_resources_fit(pod(), NODE, others(*[pod(f"o{i}") for i in range(9)])) is None
    assert "Too many pods (10 of 10" in node_resources_fit(pod(), NODE, others(*[pod(f"o{i}") for i in range(10)]))


def test_several_shortfalls_are_all_named():
    problem = node_resources_fit(pod(containers=[container(requests={"cpu": "5", "memory": "9Gi"})]), NODE, others())
    assert "Insufficient cpu" in problem and "Insufficient memory" in problem


def test_the_pod_itself_is_not_counted_against_itself():
    me = pod("me", containers=[container(requests=cpu("4"))])
    assert fit_problem(me, NODE, Placement("n1", ("0",)), [me]) is None


# -- NodePorts -------------------------------------------------------------------------------------
def port(number, protocol=None, ip=None):
    p = {"containerPort": 80, "hostPort": number}
    if protocol:
        p["protocol"] = protocol
    if ip:
        p["hostIP"] = ip
    return p


@pytest.mark.parametrize("wanted, taken, conflict", [
    (port(8080), port(8080), True),
    (port(8080), port(8081), False),
    (port(8080, "UDP"), port(8080), False),
    (port(8080, "UDP"), port(8080, "UDP"), True),
    (port(8080, ip="10.0.0.1"), port(8080, ip="10.0.0.2"), False),
    (port(8080, ip="10.0.0.1"), port(8080), True),  # 0.0.0.0 takes every address
    (port(8080), port(8080, ip="10.0.0.2"), True),
    (port(8080, ip="10.0.0.1"), port(8080, ip="10.0.0.1"), True),
    ({"containerPort": 80}, {"containerPort": 80}, False),  # no hostPort: nothing on the node
])
def test_host_ports(wanted, taken, conflict):
    problem = node_ports(pod(containers=[container(ports=[wanted])]),
                         others(pod("holder", containers=[container(ports=[taken])])))
    assert (problem is not None) == conflict
    if conflict:
        assert problem.startswith(PORTS_REASON) and "ns/holder" in problem


def test_host_ports_of_sidecars_count_and_of_init_containers_do_not():
    sidecar = pod("side", containers=[container()], init=[container("s", ports=[port(9000)], restart="Always")])
    init = pod("init", containers=[container()], init=[container("i", ports=[port(9001)])])
    info = others(sidecar, init)
    assert node_ports(pod(containers=[container(ports=[port(9000)])]), info) is not None
    assert node_ports(pod(containers=[container(ports=[port(9001)])]), info) is None
    done = pod("done", containers=[container(ports=[port(9002)])], phase="Failed")
    assert node_ports(pod(containers=[container(ports=[port(9002)])]), others(done)) is None


# -- NodeAffinity (the selector logic is also tested, by property, in test_plan.py) ----------------
@pytest.mark.parametrize("spec, fits", [
    ({"nodeSelector": {"zone": "a"}}, True),
    ({"nodeSelector": {"zone": "b"}}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["2"]}]}]}}}}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["2"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["2"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}, True),
])
def test_node_affinity_is_checked_against_the_node(spec, fits):
    problem = fit_problem(pod(**spec), NODE, HERE, [])
    assert (problem is None) == fits
    if not fits:
        assert problem.startswith("node(s) didn't match Pod's node affinity/selector")


# -- GPUs held by other workloads ------------------------------------------------------------------
SEED = "0=n1:3\n1=n1:3\n"


@pytest.mark.parametrize("holder, mine, held", [
    (pod("a-0", owner="a", record="3"), pod("b-0", owner="b"), True),          # another StatefulSet
    (pod("a-0", owner="a", record="0,1"), pod("b-0", owner="b"), False),       # other GPUs
    (pod("a-0", owner="a", record="3"), pod("a-1", owner="a"), False),         # the same workload
    (pod("a-0", owner="a", record="3", phase="Succeeded"), pod("b-0", owner="b"), False),  # done
    (pod("a-0", owner="a", record="3", share=True), pod("b-0", owner="b", share=True), False),  # both opt in
    (pod("a-0", owner="a", record="3", share=True), pod("b-0", owner="b"), True),   # one opts in
    (pod("a-0", owner="a", record="3"), pod("b-0", owner="b", share=True), True),
    # bare pods: one map is one workload, another map another
    (pod("x-0", map_text=SEED), pod("x-1", map_text=SEED), False),
    (pod("x-0", map_text=SEED), pod("y-1", map_text="1=n1:3\n"), True),
    # bound before records were written: its map entry counts, when it names the pod's node
    (pod("a-0", owner="a", map_text=SEED), pod("b-0", owner="b"), True),
    (pod("a-0", owner="a", map_text="0=n2:3\n"), pod("b-0", owner="b"), False),
    (pod("a-0", owner="a", map_text="malformed"), pod("b-0", owner="b"), False),
    (pod("plain", owner="a"), pod("b-0", owner="b"), False),  # not ours: no GPU known
])
def test_gpus_held_by_other_workloads(holder, mine, held):
    problem = gpus_held(mine, HERE, others(holder))
    assert (problem is not None) == held
    if held:
        assert problem.startswith(f"GPU 3 on n1 is held by ns/{holder['metadata']['name']}")


def test_the_record_wins_over_an_edited_map():
    holder = pod("a-0", owner="a", record="2", map_text="0=n1:3\n")
    assert gpus_held(pod("b-0", owner="b"), HERE, others(holder)) is None
    assert gpus_held(pod("b-0", owner="b"), Placement("n1", ("2",)), others(holder)) is not None


def test_bind_problem_puts_node_checks_first_then_fit():
    assert bind_problem(pod(), None, HERE) == "node n1 does not exist"
    cordoned = {**NODE, "spec": {"unschedulable": True}}
    assert "cordoned" in bind_problem(pod(), cordoned, HERE, [pod("a-0", owner="a", record="3")])
    assert "held by" in bind_problem(pod(owner="b"), NODE, HERE, [pod("a-0", owner="a", record="3")])
    assert bind_problem(pod(owner="b"), NODE, HERE, []) is None


# -- properties --------------------------------------------------------------------------------------
quantities = st.sampled_from(["0", "1m", "100m", "250m", "1", "1500m", "2", "3", "4"])


@st.composite
def pods(draw, name):
    containers = [container(f"c{i}", requests=cpu(draw(quantities))) for i in range(draw(st.integers(1, 3)))]
    init = [container(f"i{i}", requests=cpu(draw(quantities)), restart=draw(st.sampled_from([None, "Always"])))
            for i in range(draw(st.integers(0, 3)))]
    return pod(name, containers=containers, init=init or None,
               overhead=draw(st.sampled_from([None, cpu("50m")])), phase=draw(st.sampled_from([None, "Running", "Succeeded"])))


def reference_cpu(p) -> Fraction:
    """The KEP-753 formula, written out by hand: max(sum(containers) + sum(sidecars),
    max over regular init i of (init_i + sidecars before i), max over sidecar j of sidecars up to j)."""
    q = lambda c: parse_quantity(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))  # noqa: E731
    init = p["spec"].get("initContainers") or []
    sidecars = [q(c) for c in init if c.get("restartPolicy") == "Always"]
    candidates = [sum(q(c) for c in p["spec"]["containers"]) + sum(sidecars, Fraction(0))]
    before = Fraction(0)
    for c in init:
        if c.get("restartPolicy") == "Always":
            before += q(c)
            candidates.append(before)
        else:
            candidates.append(q(c) + before)
    overhead = parse_quantity((p["spec"].get("overhead") or {}).get("cpu", "0"))
    return max(candidates) + overhead


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_cpu_fit_is_the_arithmetic_of_the_kep(data):
    mine = data.draw(pods("mine"))
    existing = [data.draw(pods(f"o{i}")) for i in range(data.draw(st.integers(0, 4)))]
    assert pod_requests(mine).get("cpu", 0) == int(reference_cpu(mine) * 1000)
    used = sum(reference_cpu(o) for o in existing if o["status"].get("phase") != "Succeeded")
    wanted = reference_cpu(mine)
    fits = wanted == 0 or wanted <= 4 - used
    assert (node_resources_fit(mine, NODE, NodeInfo.of(existing)) is None) == fits


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_node_info_of_listed_plus_assumed_pods_is_the_node_info_of_all(data):
    all_pods = [data.draw(pods(f"o{i}")) for i in range(data.draw(st.integers(0, 6)))]
    split = data.draw(st.integers(0, len(all_pods)))
    listed = NodeInfo.of(all_pods[:split])
    combined = NodeInfo.of(listed.pods + tuple(PodInfo.of(p) for p in all_pods[split:]
                                               if p["status"].get("phase") != "Succeeded"))
    assert combined == NodeInfo.of(all_pods)
