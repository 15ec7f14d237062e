"""The framework's runner (gpu_scheduler/framework/runtime.py) with plugins made in the test: the
order of the phases, Unreserve after a later failure, a stale snapshot decided again, and the
profile that bind, plan and explain share. No Kubernetes API: the handle here only counts."""
from __future__ import annotations

import dataclasses

from gpu_scheduler import SCHEDULER_NAME, ANNOTATION
from gpu_scheduler.framework.config import SchedulerConfig
from gpu_scheduler.framework.interface import (
    SUCCESS, BindPlugin, Code, FilterPlugin, PreBindPlugin, ReservePlugin, Status, error, unschedulable,
)
from gpu_scheduler.framework.profile import PLUGINS, Profile, default_profile
from gpu_scheduler.framework.runtime import Framework
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.plugins.mapentry import MapEntry

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
    return Profile((MapEntry(),), tuple(filters), (), tuple(reserve), (), tuple(pre_bind), tuple(bind))


def test_the_phases_run_in_order_and_bind_once():
    handle = Handle()
    outcome = Framework(profile([Step("a"), Step("b")], [Step("c")], [Step("d"), Step("e")])).schedule(POD, handle)
    assert outcome.bound and outcome.node == "node1" and outcome.phase == "Bind"
    assert handle.calls == ["snapshot 0", "assume 0 ('0',)", "reserve a", "reserve b", "prebind c", "bind d"]


def test_a_failure_after_reserve_unreserves_in_reverse_and_forgets_the_pod():
    handle = Handle()
    failing = Step("c", error("Step", "the API failed"))
    outcome = Framework(profile([Step("a"), Step("b")], [failing], [Step("d")])).schedule(POD, handle)
    assert outcome.status.code is Code.ERROR and outcome.phase == "PreBind"
    assert handle.calls[-4:] == ["prebind c", "unreserve b", "unreserve a", "forget"]


def test_a_refusal_reserves_nothing():
    handle = Handle()
    outcome = Framework(profile([Step("a")], filters=[Step("f", unschedulable("Step", "no"))])).schedule(POD, handle)
    assert outcome.status.refused and outcome.phase == "Filter" and handle.calls == ["snapshot 0"]


def test_a_node_changed_since_its_snapshot_is_decided_again():
    handle = Handle(generations=(0, 1))
    outcome = Framework(profile([Step("a")], bind=[Step("d")])).schedule(POD, handle)
    assert outcome.bound
    assert handle.calls[:4] == ["snapshot 0", "assume 0 ('0',)", "snapshot 1", "assume 1 ('0',)"]


def test_a_map_refusal_looks_at_no_node():
    handle = Handle()
    pod = {**POD, "metadata": {**POD["metadata"], "name": "w-7"}}
    outcome = Framework(default_profile(SchedulerConfig())).schedule(pod, handle)
    assert (outcome.status.plugin, outcome.status.reason, outcome.phase) == ("MapEntry", "NoMapEntry", "PreFilter")
    assert handle.calls == []


def test_one_profile_names_every_plugin_once():
    names = [plugin.name for plugin in PLUGINS]
    assert len(names) == len(set(names))
    profile_ = default_profile(SchedulerConfig())
    assert [p.name for p in profile_.filter][:3] == ["NodeExists", "NodeUnschedulable", "NodeReady"]
    assert [p.name for p in profile_.reserve] == ["GPUsHeld", "DynamicResources"] and {p.name for p in profile_.bind} == {"DefaultBinder"}


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
