"""A pod naming an upstream PodGroup (`spec.schedulingGroup.podGroupName`, Kubernetes 1.36+ with the
GenericWorkload feature gate, off by default) on a real API server with that gate on: the server
keeps the field (without the gate it drops it on create, pkg/api/pod/util.go
dropDisabledSchedulingGroup, and bind never sees it), bind places the pod on its map's entry as
any other, and writes one Warning Event `UpstreamPodGroupIgnored` naming `gpu-scheduler/gang`
(gpu_scheduler/plugins/gang.py). The unit tests (test_gang.py, test_placer.py) hold the wording and
the once-only rule; this one holds that the field, as the real server returns it, reaches bind.

A stack of its own (the session's runs without the gate, as users' clusters do by default); on
minors before 1.36 the field does not exist (1.35 has the alpha `workloadRef` instead) and the
module skips."""
from __future__ import annotations


import pytest

from localcp import cluster, versions
from test_end_to_end import env_of, pod_manifest

pytestmark = pytest.mark.controlplane

MINOR = versions.minor(cluster.KUBERNETES_VERSION)
# The gate, and on 1.36 (alpha) its API too: the server's own Workload and PodGroup informers need
# scheduling.k8s.io/v1alpha2, and without it the server is never ready (1.37's beta is served).
GATE = ("--feature-gates=GenericWorkload=true",
        *(("--runtime-config=scheduling.k8s.io/v1alpha2=true",) if MINOR == 36 else ()))
NAMESPACE = "upstream-podgroup"
GROUP = "train-group"


@pytest.fixture(scope="module")
def gated_stack():
    if MINOR < 36:
        pytest.skip(f"{cluster.KUBERNETES_VERSION}: spec.schedulingGroup is served from 1.36 (GenericWorkload)")
    from localcp.stack import LocalStack

    with LocalStack(apiserver_flags=GATE) as running:
        running.create_namespace(NAMESPACE)
        yield running


def naming_podgroup(name: str, annotation: str) -> dict:
    pod = pod_manifest(NAMESPACE, name, annotation)
    pod["spec"]["schedulingGroup"] = {"podGroupName": GROUP}
    return pod


def warnings_for(stack, name: str) -> list:
    events = stack.api.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.reason == "UpstreamPodGroupIgnored"]


def test_a_pod_naming_an_upstream_podgroup_is_placed_on_its_entry_with_one_warning_event(gated_stack):
    stack = gated_stack
    stack.apply(naming_podgroup("worker-0", "0=node2:1\n"))
    [pod] = stack.wait_bound(NAMESPACE, 1)
    # The server kept the field (the gate is on): otherwise this test would show nothing.
    assert pod["spec"].get("schedulingGroup") == {"podGroupName": GROUP}, pod["spec"]
    assert pod["spec"]["nodeName"] == "node2" and env_of(pod)["CUDA_VISIBLE_DEVICES"] == "1"
    [warning] = stack.wait_for(lambda: warnings_for(stack, "worker-0"), 30, "the UpstreamPodGroupIgnored Event")
    assert warning.type == "Warning" and warning.involved_object.uid == pod["metadata"]["uid"]
    assert f"PodGroup '{GROUP}'" in warning.message and "gpu-scheduler/gang" in warning.message
    assert warning.count in (None, 1)
