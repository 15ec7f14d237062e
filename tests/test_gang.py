"""Gangs in the framework's one cycle (gpu_scheduler/plugins/gang.py as PodGroup, PreFilter and
Permit; runtime.schedule and evaluate) with plugins made in the test: the annotation's values, the three quorums and their words, the
reservation order, and every member unreserved when one fails before the Bindings. No Kubernetes
API: the handle only records what was asked (the real stack's tests are test_gang_cluster.py)."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest

from gpu_scheduler import ANNOTATION, SCHEDULER_NAME
from gpu_scheduler.framework.interface import SUCCESS, Code, error, unschedulable
from gpu_scheduler.framework.profile import Profile
from gpu_scheduler.framework.runtime import Framework
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.fit import GANG_ANNOTATION
from gpu_scheduler.gangask import GangError, gang_size
from gpu_scheduler.plugins.gang import (
    MEMBERS_MISSING, MEMBERS_REFUSED, RESERVATION_LOST, Gang, WorkloadMembers, gang_of,
)
from gpu_scheduler.plugins.mapentry import MapEntry, resolved
from gpu_scheduler.podinputs import PodInputs
from test_framework import NODE, Handle, Step

MAP = "0=node2:1\n1=node1:0\n2=node1:1\n"


def member(index: int, gang: str = "true", text: str = MAP) -> dict:
    return {"metadata": {"name": f"train-{index}", "namespace": "ns", "uid": f"u{index}",
                         "labels": {"apps.kubernetes.io/pod-index": str(index)},
                         "ownerReferences": [{"controller": True, "kind": "StatefulSet", "name": "train", "uid": "s"}],
                         "annotations": {ANNOTATION: text, GANG_ANNOTATION: gang}},
            "spec": {"schedulerName": SCHEDULER_NAME}}


@pytest.mark.parametrize("value, size", [("true", 3), ("2", 2), ("1", 1), ("3", 3), ("false", None), (None, None)])
def test_the_gang_size_the_annotation_asks_for(value, size):
    pod = member(0)
    if value is None:
        del pod["metadata"]["annotations"][GANG_ANNOTATION]
    else:
        pod["metadata"]["annotations"][GANG_ANNOTATION] = value
    assert gang_size(pod) == size


@pytest.mark.parametrize("value", ["0", "4", "True", "yes", "-1", "", " 2", "２", "9" * 40])
def test_a_malformed_gang_size_names_the_fix(value):
    with pytest.raises(GangError) as refused:
        gang_size(member(0, value))
    assert GANG_ANNOTATION in str(refused.value) and '"true"' in str(refused.value)


class Members(Handle):
    """Nodes by name; a node's refusal by the Step filter given per node; assume always holds; the
    workload's pods as `members` (the Gang plugin's WorkloadPods)."""

    members = WorkloadMembers((), ())

    def workload_pods(self, key):
        return self.members

    def group_lock(self, group):
        return contextlib.nullcontext()

    def assumed(self, pod):
        return False

    def snapshot(self, node):
        self.calls.append(f"snapshot {node}")
        return NodeSnapshot(node, NODE)

    def assume(self, pod, node, devices):
        self.calls.append(f"assume {pod['metadata']['name']}")
        return True

    def forget(self, pod, node):
        self.calls.append(f"forget {pod['metadata']['name']}")

    def each(self, calls):
        return [call() for call in calls]


@dataclasses.dataclass
class PerNode(Step):
    """A filter and reserve that answers per node (`answers`), SUCCESS elsewhere."""

    answers: dict = dataclasses.field(default_factory=dict)

    def filter(self, state, pod, node):
        return self.answers.get(("filter", node.name), SUCCESS)

    def reserve(self, state, pod, node, cluster):
        cluster.calls.append(f"reserve {pod['metadata']['name']}")
        return self.answers.get(("reserve", pod["metadata"]["name"]), SUCCESS)

    def unreserve(self, state, pod, node, cluster):
        cluster.calls.append(f"unreserve {pod['metadata']['name']}")

    def pre_bind(self, state, pod, node, cluster):
        cluster.calls.append(f"prebind {pod['metadata']['name']}")
        return SUCCESS

    def bind(self, state, pod, node, cluster):
        cluster.calls.append(f"bind {pod['metadata']['name']}")
        return self.answers.get(("bind", pod["metadata"]["name"]), SUCCESS)


def framework(step: PerNode) -> Framework:
    gang = Gang()
    return Framework(Profile(pod_group=(gang,), pre_filter=(MapEntry(), gang), filter=(step,), reserve=(step,),
                             permit=(gang,), pre_bind=(step,), bind=(step,)))


def schedule(framework: Framework, group, handle: Members):
    """The cycle of the group's first pending member, its workload's pods being the group's."""
    handle.members = WorkloadMembers(group.pending, group.bound)
    return framework.schedule(group.pending[0], handle)


def gang(*indexes: int, bound=(), size: str = "true"):
    pods = [member(i, size) for i in indexes]
    return gang_of(pods[0], PodInputs.of(pods[0]), pods, bound)


def test_members_missing_decide_nothing_and_say_how_many_exist():
    handle = Members()
    outcome = schedule(framework(PerNode("s")), gang(0, 1), handle)
    assert outcome.status.code is Code.UNSCHEDULABLE and outcome.status.reason == MEMBERS_MISSING
    assert outcome.status.message.startswith("gang ns/train: 2 of 3 members exist;")
    assert "podManagementPolicy: Parallel" in outcome.status.message
    assert handle.calls == [] and outcome.waits_on is None


def test_a_refused_member_holds_the_gang_back_with_nothing_reserved():
    handle = Members()
    step = PerNode("s", answers={("filter", "node1"): unschedulable("GPUsHeld", "GPU 1 on node1 is held by ns/x-0")})
    outcome = schedule(framework(step), gang(0, 1, 2), handle)
    assert outcome.status.reason == MEMBERS_REFUSED and outcome.status.plugin == "Gang"
    assert outcome.status.message == "gang ns/train: 1 of 3 members placeable; member train-1: GPU 1 on node1 is held by ns/x-0"
    assert (outcome.waits_on.status.plugin, outcome.waits_on.node) == ("GPUsHeld", "node1")
    assert not [c for c in handle.calls if not c.startswith("snapshot")]  # decided only: nothing assumed or written
    assert [o.pod["metadata"]["name"] for o in outcome.members] == ["train-0", "train-1", "train-2"]


def test_members_are_reserved_in_node_then_device_order_and_bound_after_every_prebind():
    handle = Members()
    outcome = schedule(framework(PerNode("s")), gang(0, 1, 2), handle)
    assert outcome.status.ok and all(o.bound for o in outcome.members)
    writes = [c for c in handle.calls if not c.startswith("snapshot")]
    assert writes == ["assume train-1", "reserve train-1", "assume train-2", "reserve train-2",  # node1: 0, then 1
                      "assume train-0", "reserve train-0",  # node2
                      "prebind train-1", "prebind train-2", "prebind train-0",
                      "bind train-1", "bind train-2", "bind train-0"]


def test_a_lost_reservation_unreserves_every_member_in_reverse_and_binds_none():
    handle = Members()
    lost = unschedulable("GPUsHeld", "GPU 1 on node2 is held by ns/other-0")
    outcome = schedule(framework(PerNode("s", answers={("reserve", "train-0"): lost})), gang(0, 1, 2), handle)
    assert outcome.status.reason == RESERVATION_LOST
    assert outcome.status.message.startswith("gang ns/train: 2 of 3 members reserved, the rest released; member train-0")
    writes = [c for c in handle.calls if not c.startswith("snapshot")]
    assert writes[-7:] == ["reserve train-0", "unreserve train-0", "forget train-0",  # its own, at once
                           "unreserve train-2", "forget train-2", "unreserve train-1", "forget train-1"]  # reverse
    assert not any(c.startswith(("bind", "prebind")) for c in writes)


def test_an_api_failure_while_reserving_releases_all_and_is_retried():
    handle = Members()
    failed = error("GPUsHeld", "writing the record of GPU 0 on node1: connection refused")
    outcome = schedule(framework(PerNode("s", answers={("reserve", "train-2"): failed})), gang(0, 1, 2), handle)
    assert outcome.status.code is Code.ERROR and outcome.status.reason == "Retry"
    assert "member train-2" in outcome.status.message
    assert "unreserve train-1" in handle.calls and not any(c.startswith("bind") for c in handle.calls)


def test_bound_members_count_so_a_re_created_member_goes_alone():
    handle = Members()
    pods = [member(1)]
    alone = gang_of(pods[0], PodInputs.of(pods[0]), pods, ["ns/train-0", "ns/train-2"])
    outcome = schedule(framework(PerNode("s")), alone, handle)
    assert outcome.status.ok and [o.bound for o in outcome.members] == [True]


def test_a_gang_of_n_binds_once_n_are_placeable_and_leaves_the_refused_one_its_own_reason():
    handle = Members()
    step = PerNode("s", answers={("filter", "node2"): unschedulable("NodeReady", "node node2 is not Ready")})
    outcome = schedule(framework(step), gang(0, 1, 2, size="2"), handle)
    by_name = {o.pod["metadata"]["name"]: o for o in outcome.members}
    assert by_name["train-1"].bound and by_name["train-2"].bound
    assert by_name["train-0"].status.plugin == "NodeReady"


def test_a_pod_alone_never_waits_in_permit():
    """A pod that no PodGroup plugin groups goes alone: a Permit that asks it to wait is an error,
    not a silent hold."""
    gang = Gang()
    alone = Framework(Profile(pre_filter=(MapEntry(), gang), permit=(gang,), bind=(PerNode("s"),)))
    [outcome] = alone.schedule(member(0), Members()).members
    assert outcome.status.code is Code.ERROR and outcome.phase == "Permit"


def test_a_malformed_gang_is_refused_by_its_prefilter_alone():
    [outcome] = framework(PerNode("s")).schedule(member(0, "many"), Members()).members
    assert (outcome.status.plugin, outcome.status.code, outcome.phase) == (
        "Gang", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "PreFilter")


def test_explain_decides_every_member_even_when_some_are_missing():
    handle = Members()
    group = gang(0, 1)
    handle.members = WorkloadMembers(group.pending, group.bound)
    decided = framework(PerNode("s")).evaluate(group.pending[0], handle)
    assert decided.status.reason == MEMBERS_MISSING and [m.name for m in decided.members] == ["ns/train-0", "ns/train-1"]
    assert all(m.decision.status.ok for m in decided.members) and resolved(decided.members[0].decision.state).index == 0


def test_dra_unreserve_takes_back_the_allocation_this_attempt_wrote():
    """A gang member whose claim PreBind allocated, when a later member fails: the claim is
    deallocated at the version written, so the unbound member holds no device (DRA mode)."""
    from gpu_scheduler.plugins.config import SchedulerConfig
    from gpu_scheduler.framework.interface import CycleState
    from gpu_scheduler.plugins.dynamicresources.plugin import ALLOCATED, DynamicResources

    written = {"metadata": {"name": "train-0-gpus", "namespace": "ns", "resourceVersion": "7",
                            "finalizers": ["resource.kubernetes.io/delete-protection"]},
               "status": {"allocation": {"devices": {"results": []}}, "reservedFor": [{"resource": "pods"}]}}

    class Claims:
        updates: list = []

        def update_claim_status(self, namespace, name, body):
            self.updates.append((namespace, name, body))
            return body

    state, cluster = CycleState(), Claims()
    DynamicResources(SchedulerConfig()).unreserve(state, member(0), None, cluster)
    assert cluster.updates == []  # nothing allocated by this attempt: nothing taken back
    state.write(ALLOCATED, written)
    DynamicResources(SchedulerConfig()).unreserve(state, member(0), None, cluster)
    (namespace, name, body), = cluster.updates
    assert (namespace, name, body["metadata"]["resourceVersion"], body["status"]) == ("ns", "train-0-gpus", "7", {})


def test_a_gated_member_is_not_there_yet_for_its_gang():
    """PreEnqueue holds a gated member back, and its gang counts it as missing: nothing decided or
    reserved for the others until its gate is gone."""
    from gpu_scheduler.plugins.schedulinggates import SchedulingGates

    gang_plugin, step = Gang(), PerNode("s")
    framework = Framework(Profile(pre_enqueue=(SchedulingGates(),), pod_group=(gang_plugin,),
                                  pre_filter=(MapEntry(), gang_plugin), filter=(step,), reserve=(step,),
                                  permit=(gang_plugin,), pre_bind=(step,), bind=(step,)))
    pods = [member(i) for i in range(3)]
    pods[2]["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    handle = Members()
    handle.members = WorkloadMembers(pods, ())
    cycle = framework.schedule(pods[0], handle)
    assert cycle.status.reason == MEMBERS_MISSING and cycle.status.message.startswith("gang ns/train: 2 of 3")
    assert [o.pod["metadata"]["name"] for o in cycle.members] == ["train-0", "train-1"]
    assert not [c for c in handle.calls if not c.startswith("snapshot")]
    ungated = [pods[0], pods[1], member(2)]
    handle.members = WorkloadMembers(ungated, ())
    assert framework.schedule(ungated[0], handle).status.ok


# -- upstream gangs (a PodGroup named in spec.schedulingGroup, Kubernetes 1.36+): not run, said once --
def naming_podgroup(pod: dict, group="train-group") -> dict:
    pod = {**pod, "spec": {**pod["spec"], "schedulingGroup": {"podGroupName": group}}}
    return pod


@pytest.mark.parametrize("group, named", [
    ({"podGroupName": "train-group"}, "train-group"), ({"podGroupName": ""}, None), ({"podGroupName": 7}, None),
    ({}, None), ("train-group", None), (None, None)])
def test_the_upstream_podgroup_a_pod_names(group, named):
    from gpu_scheduler.gangask import upstream_pod_group

    pod = member(0)
    if group is not None:
        pod["spec"]["schedulingGroup"] = group
    assert upstream_pod_group(pod) == named


def test_a_pod_naming_an_upstream_podgroup_is_told_its_gang_is_gpu_scheduler_s():
    [(reason, said)] = PodInputs.of(naming_podgroup(member(0))).notices
    assert reason == "UpstreamPodGroupIgnored"
    assert said == ("the pod names PodGroup 'train-group' (spec.schedulingGroup.podGroupName), but gpu-scheduler does"
                    " not run upstream gangs (PodGroups): its gangs are the gpu-scheduler/gang annotation's; this pod"
                    " is placed with its gang ns/train")


@pytest.mark.parametrize("gang", ["false", None])
def test_a_pod_naming_an_upstream_podgroup_and_no_gang_is_told_it_goes_alone(gang):
    pod = member(0, gang=gang or "true")
    if gang is None:
        del pod["metadata"]["annotations"][GANG_ANNOTATION]
    [(_, said)] = PodInputs.of(naming_podgroup(pod)).notices
    assert said.endswith("this pod is placed on its own (to place replicas together, set gpu-scheduler/gang on the"
                         " pod template)")


def test_a_pod_naming_no_upstream_podgroup_gets_no_notice_and_naming_one_changes_no_decision():
    """The notice is all: the same pod, with or without the PodGroup, decides the same (the framework
    reads no spec.schedulingGroup)."""
    from gpu_scheduler.plugins.registry import new_framework
    from gpu_scheduler.plugins.config import SchedulerConfig

    pod = member(1, gang="false")
    assert PodInputs.of(pod).notices == ()
    framework = new_framework(SchedulerConfig())
    snapshot = lambda name: NodeSnapshot(name, {**NODE, "metadata": {"name": name}})  # noqa: E731
    plain, named = framework.decide(pod, snapshot), framework.decide(naming_podgroup(pod), snapshot)
    assert (plain.status, plain.node_name, plain.devices) == (named.status, named.node_name, named.devices)
