"""Pools (issue 44) on the four real nodes (the stack's kubelet + containerd each): a Deployment of the
check container (check/check.py), each pod on an entry of the pool that bind chose at binding.
The kubelet resolves CUDA_VISIBLE_DEVICES from the pod's gpu-scheduler/devices annotation (mutate
put a fieldRef there; the Binding wrote the annotation) when it starts the container, so each
container logs its own entry's devices. A rolling update with maxSurge 0, where old pods really
terminate (the kubelet stops them within their grace period) while new ones come: no entry is held
by two pods at once, Terminating ones included, and each new container logs its entry.

Fails on the code before pools: there the Deployment's pods stay Pending (UnknownIndex)."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import release_namespace
from tests.test_end_to_end import SEED
from tests.test_nodes import logged, running
from tests.test_pool_cluster import (DEVICES, ENTRIES_4, ENTRY, PodWatch, annotations, apps, deployment, describe,
                                     name_of, on_entries, remove_deployments, wait_rolled_out)

pytestmark = pytest.mark.controlplane

_names = iter(range(10**6))


@pytest.fixture
def ns(real_stack, request) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", f"p{next(_names)}-{request.node.name.lower()}")[:40].strip("-")
    yield real_stack.create_namespace(name)
    remove_deployments(real_stack, name)
    release_namespace(real_stack, name)


def check_deployment(namespace: str, replicas: int, strategy: dict | None = None) -> dict:
    """The check StatefulSet's pod template (check/statefulset.yaml: the check image, its user and
    NODE_NAME) in a Deployment on ENTRIES_4, logging every second."""
    manifest = deployment(namespace, "serve", ENTRIES_4, replicas, strategy)
    template = json.loads(json.dumps(SEED["spec"]["template"]))
    template["metadata"] = manifest["spec"]["template"]["metadata"]
    template["spec"]["containers"][0]["env"].append({"name": "CHECK_INTERVAL_SECONDS", "value": "1"})
    manifest["spec"]["template"] = template
    return manifest


def assert_logs_its_entry(stack, namespace: str, pods: list[dict]) -> dict[int, str]:
    held = on_entries(pods, ENTRIES_4)
    assert sorted(held) == [0, 1, 2, 3]
    for pod in pods:
        node, devices = pod["spec"]["nodeName"], annotations(pod)[DEVICES]
        assert logged(stack, namespace, name_of(pod)) == f"node={node} CUDA_VISIBLE_DEVICES={devices}", (
            f"{name_of(pod)} on entry {annotations(pod)[ENTRY]}")
    return held


def test_each_container_of_a_deployment_sees_the_devices_of_its_entry(real_stack, ns):
    real_stack.apply(check_deployment(ns, 4))
    try:
        pods = real_stack.wait_for(lambda: running(real_stack, ns, 4, "app=serve"), 120, "4 check pods Running")
    except TimeoutError as error:
        raise AssertionError(f"{error}; the pods:\n{describe(real_stack, ns, real_stack.pods(ns))}") from None
    assert_logs_its_entry(real_stack, ns, pods)


def test_a_rolling_update_on_real_nodes_hands_each_entry_on_once_its_pod_is_gone(real_stack, ns):
    watch = PodWatch(real_stack, ns, "app=serve")
    try:
        real_stack.apply(check_deployment(ns, 4, {"maxSurge": 0, "maxUnavailable": 1}))
        wait_rolled_out(real_stack, ns, "serve", 120, "the first revision available")
        old = {name_of(p) for p in real_stack.pods(ns, "app=serve")}
        apps(real_stack).patch_namespaced_deployment("serve", ns, {"spec": {"template": {"metadata": {
            "annotations": {"example.com/revision": "2"}}}}})
        current = wait_rolled_out(real_stack, ns, "serve", 240, "the rollout done")
        try:
            pods = real_stack.wait_for(lambda: running(real_stack, ns, 4, "app=serve"), 60, "only the new pods left")
        except TimeoutError as error:
            raise AssertionError(f"{error}; the pods:\n{describe(real_stack, ns, real_stack.pods(ns))}") from None
    finally:
        watch.stop()
    watch.assert_never_shared()
    assert not old & {name_of(p) for p in pods}
    assert {p["metadata"]["ownerReferences"][0]["name"] for p in pods} == {current.metadata.name}
    assert_logs_its_entry(real_stack, ns, pods)
    print(f"{watch.changes} pod changes watched; at most {watch.most} entries held at once")
