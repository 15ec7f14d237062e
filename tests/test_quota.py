"""Quotas, the pure part (gpu_scheduler/quota.py, admission): the GPUs a placed pod pins become
requests a ResourceQuota counts, stable under reinvocation, and a pod that names them itself is
refused. The API server's counting of them is shown on the real control plane
(tests/test_quota_cluster.py)."""
from __future__ import annotations

import pytest

from jsonpatch import apply_patch
from gpu_scheduler.admission import admission_response
from gpu_scheduler.quota import GPU_RESOURCE, counted, product_resource, quota_requests
from tests.test_admission import SEED_DEVICES, container, counted_gpus, decode_patch, make_pod, make_review

PRODUCTS = {"node1": "NVIDIA-A100-SXM4-80GB", "node2": "Tesla T4"}


def admit(pod, mode="cuda", quota=True, products=PRODUCTS):
    response, decision = admission_response(make_review(pod), mode, quota, products.get)
    patch = decode_patch(response) if "patch" in response["response"] else []
    return decision, apply_patch(pod, patch)


def stable(pod, **options):
    decision, patched = admit(pod, **options)
    assert decision.allowed, decision.message
    again, repatched = admit(patched, **options)
    assert again.allowed and again.patch == () and repatched == patched
    return patched


@pytest.mark.parametrize("index, devices", sorted(SEED_DEVICES.items()))
def test_each_pod_requests_the_gpus_of_its_entry(index, devices):
    patched = stable(make_pod(f"web-{index}"))
    n = str(len(devices.split(",")))
    resources = patched["spec"]["containers"][0]["resources"]
    product = {"node1": {"product.gpu-scheduler.io/NVIDIA-A100-SXM4-80GB": n},
               "node2": {"product.gpu-scheduler.io/Tesla-T4": n}}.get(f"node{index + 1}" if index < 3 else "node4", {})
    assert resources["requests"] == resources["limits"] == {GPU_RESOURCE: n, **product}


def test_shared_gpus_count_once_per_pod_that_holds_them():
    # The seed gives device 3 of node4 to indexes 3 and 4: each pod asked for it, each counts 1.
    for index in (3, 4):
        assert counted(stable(make_pod(f"web-{index}"))) == {GPU_RESOURCE: 1}


def test_the_containers_own_resources_are_kept():
    pod = make_pod("web-0", containers=[container(resources={"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}),
                                        container("side")])
    patched = stable(pod)
    first = patched["spec"]["containers"][0]["resources"]
    assert first["requests"] == {"cpu": "1", GPU_RESOURCE: "2", "product.gpu-scheduler.io/NVIDIA-A100-SXM4-80GB": "2"}
    assert first["limits"] == {"memory": "1Gi", GPU_RESOURCE: "2", "product.gpu-scheduler.io/NVIDIA-A100-SXM4-80GB": "2"}
    assert "resources" not in patched["spec"]["containers"][1]


def test_dra_mode_counts_too_and_keeps_the_containers_claim():
    patched = stable(make_pod("web-1", annotations={"gpu-scheduler/device-env": "dra"}))
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpu-scheduler"}]
    assert resources["requests"] == resources["limits"] == {GPU_RESOURCE: "1", "product.gpu-scheduler.io/Tesla-T4": "1"}


def test_an_unknown_node_or_product_counts_the_total_only():
    assert counted(stable(make_pod("web-3"))) == {GPU_RESOURCE: 1}  # node4: no product known
    assert counted(stable(make_pod("web-0"), products={})) == {GPU_RESOURCE: 2}


def test_quota_off_adds_no_requests():
    decision, patched = admit(make_pod("web-0"), quota=False)
    assert decision.allowed and "resources" not in patched["spec"]["containers"][0]


def test_a_pod_without_an_entry_pins_nothing_and_requests_nothing():
    decision, patched = admit(make_pod("web-9"))
    assert decision.allowed and "resources" not in patched["spec"]["containers"][0]


@pytest.mark.parametrize("where", ["first requests", "first limits", "second container", "init container",
                                   "other product", "pod level"])
def test_a_pod_naming_the_counted_resources_itself_is_refused(where):
    first, others, init, pod_level = {}, [], None, None
    if where == "first requests":
        first = {"requests": {GPU_RESOURCE: "0"}}
    elif where == "first limits":
        first = {"limits": {GPU_RESOURCE: "1"}}  # the entry has 2: a limit of 1 would be the request
    elif where == "second container":
        others = [container("side", resources={"requests": {GPU_RESOURCE: "2"}, "limits": {GPU_RESOURCE: "2"}})]
    elif where == "init container":
        init = [container("init", resources={"limits": {GPU_RESOURCE: "1"}})]
    elif where == "other product":
        first = counted_gpus(2)
        first["requests"]["product.gpu-scheduler.io/Tesla-T4"] = "2"
    else:
        pod_level = {"requests": {GPU_RESOURCE: "1"}}
    pod = make_pod("web-0", containers=[container(resources=first), *others], init_containers=init)
    if pod_level:
        pod["spec"]["resources"] = pod_level
    decision, _ = admit(pod)
    assert not decision.allowed and decision.reason == "QuotaDodge"
    assert "gpu-scheduler sets this resource itself" in decision.message
    assert "remove it from the pod's template" in decision.message


def test_the_values_mutate_set_itself_are_not_a_dodge():
    pod = make_pod("web-0", containers=[container(resources=counted_gpus(2, "NVIDIA-A100-SXM4-80GB"))])
    decision, patched = admit(pod)
    assert decision.allowed and not [op for op in decision.patch if "/resources" in op["path"]]


@pytest.mark.parametrize("label, resource", [
    ("NVIDIA-A100-SXM4-80GB", "product.gpu-scheduler.io/NVIDIA-A100-SXM4-80GB"),
    ("Tesla T4", "product.gpu-scheduler.io/Tesla-T4"),
    ("NVIDIA H100 80GB HBM3", "product.gpu-scheduler.io/NVIDIA-H100-80GB-HBM3"),
    ("-weird_/name.", "product.gpu-scheduler.io/weird_-name"),
    ("x" * 100, "product.gpu-scheduler.io/" + "x" * 63),
    ("///", None), ("", None), (None, None), (7, None),
])
def test_product_resource_names_are_valid(label, resource):
    assert product_resource(label) == resource


def test_quota_requests():
    assert quota_requests(3, None) == {GPU_RESOURCE: "3"}
    assert quota_requests(1, "Tesla T4") == {GPU_RESOURCE: "1", "product.gpu-scheduler.io/Tesla-T4": "1"}
