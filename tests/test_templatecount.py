"""What mutate writes on a pinned workload's templates for queues that count templates (Kueue), and
how a pod made from such a template is counted (gpu_scheduler/templatecount.py, admission.py).
tests/test_kueue_cluster.py runs it against the real Kueue."""
from __future__ import annotations

import copy

import pytest

from gpu_scheduler.admission import Review, decide
from gpu_scheduler.templatecount import TEMPLATE_COUNTS, declared, pod_templates, template_counts, workload_patch
from tests.jsonpatch import apply_patch

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
TYPES = {"node1": H100, "node2": H100, "node3": A100}.get
SEED = "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n3=node4:3\n4=node4:3\n"


def test_the_count_is_the_largest_entry_in_total_and_per_gpu_type():
    assert template_counts(SEED, None) == {"gpu-scheduler.io/gpu": "3"}
    assert template_counts(SEED, TYPES) == {"gpu-scheduler.io/gpu": "3", f"product.gpu-scheduler.io/{H100}": "2",
                                            f"product.gpu-scheduler.io/{A100}": "3"}
    assert template_counts("0=node1:0,1\n1=node2:2,3\n", TYPES) == {"gpu-scheduler.io/gpu": "2",
                                                                    f"product.gpu-scheduler.io/{H100}": "2"}
    assert template_counts("0=node1:0\n0=node2:1\n", None) is None  # malformed: the pods are refused anyway


def template(map_text: str, **annotations: str) -> dict:
    return {"metadata": {"annotations": {"gpu-scheduling-map": map_text, **annotations}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}, {"name": "side"}]}}


def workloads() -> dict[str, dict]:
    return {
        "StatefulSet": {"kind": "StatefulSet", "spec": {"template": template(SEED)}},
        "Job": {"kind": "Job", "spec": {"template": template(SEED)}},
        "JobSet": {"kind": "JobSet", "spec": {"replicatedJobs": [
            {"name": "a", "template": {"spec": {"template": template("0=node1:0\n1=node2:1\n")}}},
            {"name": "b", "template": {"spec": {"template": {"metadata": {}, "spec": {"containers": [{"name": "c"}]}}}}},
            {"name": "c", "template": {"spec": {"template": template(SEED)}}}]}},
        "LeaderWorkerSet": {"kind": "LeaderWorkerSet", "spec": {"leaderWorkerTemplate": {
            "size": 2, "leaderTemplate": template(SEED), "workerTemplate": template(SEED)}}},
    }


@pytest.mark.parametrize("kind", ["StatefulSet", "Job", "JobSet", "LeaderWorkerSet"])
def test_each_template_with_a_map_declares_its_count_in_its_first_container(kind):
    obj = workloads()[kind]
    patched = apply_patch(copy.deepcopy(obj), workload_patch(obj, None))
    for _, tmpl in pod_templates(patched):
        if "gpu-scheduling-map" not in tmpl["metadata"].get("annotations", {}):
            assert "resources" not in tmpl["spec"]["containers"][0]  # a template without a map: untouched
            continue
        count = "1" if tmpl["metadata"]["annotations"]["gpu-scheduling-map"].startswith("0=node1:0\n") else "3"
        first = tmpl["spec"]["containers"][0]["resources"]
        assert first == {"requests": {"cpu": "1", "gpu-scheduler.io/gpu": count}, "limits": {"gpu-scheduler.io/gpu": count}}
        assert "resources" not in tmpl["spec"]["containers"][1]
        assert declared(tmpl) == {"gpu-scheduler.io/gpu": count}
    assert workload_patch(patched, None) == []  # applied again (an update, reinvocation): nothing more


def review(obj: dict, resource: str, operation: str = "CREATE", pod: bool = False) -> Review:
    return Review("admission.k8s.io/v1", "u", operation, resource, obj if pod else None, False,
                  workload=None if pod else obj)


def test_mutate_counts_a_workloads_templates_with_quotas_on_only():
    obj = workloads()["StatefulSet"]
    decision = decide(review(obj, "statefulsets", "UPDATE"), quota=True, product_of=TYPES)
    assert decision.allowed and decision.reason == "TemplateCounted"
    patched = apply_patch(copy.deepcopy(obj), list(decision.patch))
    assert patched["spec"]["template"]["metadata"]["annotations"][TEMPLATE_COUNTS] == (
        f"gpu-scheduler.io/gpu=3,product.gpu-scheduler.io/{A100}=3,product.gpu-scheduler.io/{H100}=2")
    assert decide(review(obj, "statefulsets"), quota=False).patch == ()


def a_pod_of(tmpl: dict, index: int) -> dict:
    pod = copy.deepcopy(tmpl)
    pod["metadata"].update(name=f"web-{index}", namespace="team", labels={"apps.kubernetes.io/pod-index": str(index)})
    pod["spec"]["schedulerName"] = "gpu-scheduler"
    return pod


def test_a_pod_made_from_a_counted_template_requests_exactly_its_own_entry():
    obj = workloads()["StatefulSet"]
    counted = apply_patch(copy.deepcopy(obj), workload_patch(obj, TYPES))["spec"]["template"]
    pod = a_pod_of(counted, 1)  # node2: 1 H100
    decision = decide(review(pod, "pods", pod=True), quota=True, product_of=TYPES)
    assert decision.allowed, decision.message
    first = apply_patch(copy.deepcopy(pod), list(decision.patch))["spec"]["containers"][0]["resources"]
    want = {"gpu-scheduler.io/gpu": "1", f"product.gpu-scheduler.io/{H100}": "1"}
    assert first == {"requests": {"cpu": "1", **want}, "limits": want}  # the A100 count is gone


def test_counts_the_template_did_not_declare_are_still_a_dodge():
    obj = workloads()["StatefulSet"]
    counted = apply_patch(copy.deepcopy(obj), workload_patch(obj, None))["spec"]["template"]
    counted["spec"]["containers"][0]["resources"]["requests"]["gpu-scheduler.io/gpu"] = "0"  # edited by hand
    decision = decide(review(a_pod_of(counted, 2), "pods", pod=True), quota=True)
    assert not decision.allowed and decision.reason == "QuotaDodge"


@pytest.mark.parametrize("key", ["kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"])
def test_a_map_beside_kueues_topology_aware_scheduling_is_refused(key):
    tmpl = template(SEED, **{key: "cloud.provider.com/topology-rack"})
    decision = decide(review({"kind": "Job", "spec": {"template": tmpl}}, "jobs"), quota=True)
    assert not decision.allowed and decision.reason == "TopologyAwareScheduling"
    assert key in decision.message and "gpu-scheduling-map" in decision.message
    decision = decide(review(a_pod_of(tmpl, 0), "pods", pod=True), quota=True)
    assert not decision.allowed and decision.reason == "TopologyAwareScheduling"


@pytest.mark.parametrize("kind, spec, warned", [
    ("LeaderWorkerSet", {"startupPolicy": "LeaderReady"}, True),
    ("LeaderWorkerSet", {"startupPolicy": "LeaderCreated"}, False),
    ("JobSet", {"startupPolicy": {"startupPolicyOrder": "InOrder"}}, True),
    ("JobSet", {"startupPolicy": {"startupPolicyOrder": "AnyOrder"}}, False),
])
def test_a_gang_whose_controller_waits_for_ready_members_is_warned_about(kind, spec, warned):
    obj = workloads()[kind]
    for _, tmpl in pod_templates(obj):
        tmpl["metadata"].setdefault("annotations", {})["gpu-scheduler/gang"] = "true"
    obj["spec"].update(spec)
    decision = decide(review(obj, kind.lower() + "s"), quota=True)
    assert decision.allowed
    assert bool([w for w in decision.warnings if "would wait for good" in w]) is warned
