"""The framework's runner (gpu_scheduler/framework/runtime.py) with plugins made in the test: the
order of the phases, Unreserve after a later failure, a stale snapshot decided again, PreEnqueue,
PreFilter's named nodes, and the profile (data, built from the registry) that bind, plan, explain
and suggest share. No Kubernetes API: the handle here only counts."""
from __future__ import annotations

import dataclasses

from gpu_scheduler import SCHEDULER_NAME, ANNOTATION
import pytest

from gpu_scheduler.framework.interface import (
    SUCCESS, BindPlugin, Code, FilterPlugin, PreBindPlugin, PreFilterPlugin, PreFilterResult, ReservePlugin, Status,
    error, unresolvable, unschedulable,
)
from gpu_scheduler.framework.profile import Profile, ProfileError
from gpu_scheduler.framework.runtime import Framework
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.plugins.mapentry import MapEntry
from gpu_scheduler.plugins.registry import DEFAULT_PROFILE, EVENTS_TO_REGISTER, REGISTRY, new_framework

POD = {"metadata": {"name": "w-0", "namespace": "ns", "uid": "u0", "annotations": {ANNOTATION: "0=node1:0\n"}},
       "spec": {"schedulerName": SCHEDULER_NAME}}
NODE = {"metadata": {"name": "node1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


class Handle:
    def __init__(self, generations=(0,)):
        self.calls: list[str] = []
        self.generations = list(generations)

    def snapshot(self, node):
        generation = self.generations.pop(0) if len(self.generations) > 1 else self.generations[0]
        self.calls.append(f"snapshot {generation}")
        return NodeSnapshot(node, NODE, generation=generation)

    def assume(self, pod, node, devices):
        self.calls.append(f"assume {node.generation} {devices}")
        return node.generation == self.generations[-1]

    def forget(self, pod, node):
        self.calls.append("forget")

    def each(self, calls):
        return [call() for call in calls]

    def group_formed(self, pods):
        pass


@dataclasses.dataclass
class Step(ReservePlugin, PreBindPlugin, BindPlugin, FilterPlugin):
    label: str
    answer: Status = SUCCESS
    name = "Step"

    def filter(self, state, pod, node):
        return self.answer

    def reserve(self, state, pod, node, cluster):
        cluster.calls.append(f"reserve {self.label}")
        return self.answer

    def unreserve(self, state, pod, node, cluster):
        cluster.calls.append(f"unreserve {self.label}")

    def pre_bind(self, state, pod, node, cluster):
        cluster.calls.append(f"prebind {self.label}")
        return self.answer

    def bind(self, state, pod, node, cluster):
        cluster.calls.append(f"bind {self.label}")
        return self.answer


def profile(reserve=(), pre_bind=(), bind=(), filters=()) -> Profile:
    return Profile(pre_filter=(MapEntry(),), filter=tuple(filters), reserve=tuple(reserve), pre_bind=tuple(pre_bind),
                   bind=tuple(bind))


def only(cycle):
    """The one pod's Outcome of a cycle of a pod alone."""
    [outcome] = cycle.members
    return outcome


def test_the_phases_run_in_order_and_bind_once():
    handle = Handle()
    outcome = only(Framework(profile([Step("a"), Step("b")], [Step("c")], [Step("d"), Step("e")])).schedule(POD, handle))
    assert outcome.bound and outcome.node == "node1" and outcome.phase == "Bind"
    assert handle.calls == ["snapshot 0", "assume 0 ('0',)", "reserve a", "reserve b", "prebind c", "bind d"]


def test_a_failure_after_reserve_unreserves_in_reverse_and_forgets_the_pod():
    handle = Handle()
    failing = Step("c", error("Step", "the API failed"))
    outcome = only(Framework(profile([Step("a"), Step("b")], [failing], [Step("d")])).schedule(POD, handle))
    assert outcome.status.code is Code.ERROR and outcome.phase == "PreBind"
    assert handle.calls[-4:] == ["prebind c", "unreserve b", "unreserve a", "forget"]


def test_a_refusal_reserves_nothing():
    handle = Handle()
    outcome = only(Framework(profile([Step("a")], filters=[Step("f", unschedulable("Step", "no"))])).schedule(POD, handle))
    assert outcome.status.refused and outcome.phase == "Filter" and handle.calls == ["snapshot 0"]


def test_a_node_changed_since_its_snapshot_is_decided_again():
    handle = Handle(generations=(0, 1))
    outcome = only(Framework(profile([Step("a")], bind=[Step("d")])).schedule(POD, handle))
    assert outcome.bound
    assert handle.calls[:4] == ["snapshot 0", "assume 0 ('0',)", "snapshot 1", "assume 1 ('0',)"]


def test_a_map_refusal_looks_at_no_node():
    handle = Handle()
    pod = {**POD, "metadata": {**POD["metadata"], "name": "w-7"}}
    outcome = only(new_framework().schedule(pod, handle))
    assert (outcome.status.plugin, outcome.status.reason, outcome.phase) == ("MapEntry", "NoMapEntry", "PreFilter")
    assert handle.calls == []


def test_one_profile_names_every_plugin_once():
    assert set(EVENTS_TO_REGISTER) == set(REGISTRY)
    profile_ = new_framework().profile
    assert len({id(p) for p in profile_.plugins()}) == len({p.name for p in profile_.plugins()})
    # PoolEntry (a no-op for a pod with an index) first, then the node checks the others rely on
    assert [p.name for p in profile_.filter][:4] == ["PoolEntry", "NodeExists", "NodeUnschedulable", "NodeReady"]
    assert [p.name for p in profile_.reserve] == ["PoolEntry", "GPUsHeld", "DynamicResources"] and {p.name for p in profile_.bind} == {"DefaultBinder"}


def test_mutate_s_image_imports_the_core_without_the_api_client():
    """Dockerfile.mutate copies gpu_scheduler/ and not kubeapi/: admission's use of the NodeAffinity
    plugin must not pull the API client in (its pods failed their probes when it did)."""
    import subprocess
    import sys
    code = "import sys; sys.modules['kubeapi'] = None; import gpu_scheduler.admission"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_package_ships_the_framework_and_its_plugins():
    """The images install the core with pip from pyproject.toml: its subpackages must be found."""
    import tomllib
    from pathlib import Path
    include = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert "gpu_scheduler.*" in include


def test_the_framework_imports_no_plugin():
    """kube-scheduler's rule: plugins register beside themselves, and a profile names them."""
    from pathlib import Path
    framework = Path(__file__).parent.parent / "gpu_scheduler" / "framework"
    for module in framework.glob("*.py"):
        imports = [line for line in module.read_text().splitlines() if line.startswith(("from ", "import "))]
        assert not [line for line in imports if "plugins" in line], module.name


def test_a_profile_naming_an_unknown_plugin_or_a_point_it_lacks_is_refused_naming_the_fix():
    with pytest.raises(ProfileError, match="'NoSuch' .* is not registered"):
        Framework.from_config({"plugins": {"filter": ["NoSuch"]}}, REGISTRY)
    with pytest.raises(ProfileError, match="'MapEntry' does not implement bind"):
        Framework.from_config({"plugins": {"bind": ["MapEntry"]}}, REGISTRY)
    with pytest.raises(ProfileError, match="unknown extension point"):
        Framework.from_config({"plugins": {"score": ["MapEntry"]}}, REGISTRY)


def test_the_default_profile_is_data_and_one_instance_serves_every_point_it_names():
    framework = Framework.from_config(DEFAULT_PROFILE, REGISTRY)
    gpus_held = [p for p in framework.profile.filter if p.name == "GPUsHeld"][0]
    assert [p for p in framework.profile.reserve if p.name == "GPUsHeld"][0] is gpus_held
    assert [p.name for p in framework.profile.pre_enqueue] == ["SchedulingGates"]


def test_a_gated_pod_is_not_enqueued_and_its_cycle_looks_at_nothing():
    handle = Handle()
    pod = {**POD, "spec": {**POD["spec"], "schedulingGates": [{"name": "example.com/hold"}, {"name": "kueue"}]}}
    framework = new_framework()
    status = framework.pre_enqueue(pod)
    assert (status.plugin, status.reason, status.code) == ("SchedulingGates", "SchedulingGated",
                                                           Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
    assert status.message == "waiting for scheduling gates: [example.com/hold kueue]"
    outcome = only(framework.schedule(pod, handle))
    assert outcome.phase == "PreEnqueue" and handle.calls == []
    assert framework.pre_enqueue(POD).ok


@dataclasses.dataclass
class Names(PreFilterPlugin):
    nodes: frozenset | None
    name = "Names"

    def pre_filter(self, state, pod):
        return PreFilterResult(node_names=self.nodes)


def test_pre_filter_results_name_the_nodes_and_the_runtime_intersects_them():
    handle = Handle()
    apart = Framework(Profile(pre_filter=(MapEntry(), Names(frozenset({"node2"})))))
    decision = apart.decide(POD, handle.snapshot)
    assert decision.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE and decision.phase == "PreFilter"
    assert handle.calls == []  # no node looked at
    agreeing = Framework(Profile(pre_filter=(MapEntry(), Names(None), Names(frozenset({"node1", "node9"})))))
    assert agreeing.decide(POD, handle.snapshot).node.name == "node1"


def test_preemption_is_asked_by_status_code_not_by_plugin_name():
    """Only an Unschedulable refusal runs PostFilter; a taint, a cordon, a missing node are
    UnschedulableAndUnresolvable."""
    assert unschedulable("Anything", "x").preemption_may_help
    assert not unresolvable("GPUsHeld", "x").preemption_may_help
    node = NodeSnapshot("node1", {"metadata": {"name": "node1"}, "spec": {"unschedulable": True}})
    decision = new_framework().decide(POD, lambda name: node)
    assert decision.status.plugin == "NodeUnschedulable" and not decision.status.preemption_may_help
