"""Quotas, the pure part (gpu_scheduler/quota.py, admission): the GPUs a placed pod pins become
requests a ResourceQuota counts, stable under reinvocation, and a pod that names them itself is
refused. The API server's counting of them is shown on the real control plane
(tests/test_quota_cluster.py)."""
from __future__ import annotations

import pytest

from jsonpatch import apply_patch
from gpu_scheduler.admission import admission_response
from gpu_scheduler.quota import GPU_RESOURCE, advertisement, counted, product_resource, quota_requests
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


# --------------------------------------------------------------------------- nodes advertise, bind checks the count

def node(name="node1", product=None, capacity=None, allocatable=None):
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return {"metadata": {"name": name, "labels": labels},
            "status": {"capacity": capacity or {"cpu": "8"}, "allocatable": allocatable or {"cpu": "8"}}}


def test_a_node_advertises_the_total_and_its_gpu_type():
    assert advertisement(node()) == {"status": {"capacity": {GPU_RESOURCE: "100000"},
                                                "allocatable": {GPU_RESOURCE: "100000"}}}
    wanted = {GPU_RESOURCE: "100000", "product.gpu-scheduler.io/Tesla-T4": "100000"}
    assert advertisement(node(product="Tesla T4")) == {"status": {"capacity": wanted, "allocatable": wanted}}
    assert advertisement(node(product="Tesla T4", capacity=wanted, allocatable=wanted)) is None
    # A kubelet that reset its extended resources (allocatable only copied from capacity later).
    assert advertisement(node(product="Tesla T4", capacity=wanted)) == {"status": {"allocatable": wanted}}


def test_gpuquota_refuses_a_created_pod_counted_for_less_than_its_entry():
    from gpu_scheduler.plugins.gpuquota import uncounted
    pod = make_pod("web-0", containers=[container(resources=counted_gpus(1))])
    assert "pins 2 GPU(s) on node node1" in uncounted(pod, 2, node())
    assert "delete the pod" in uncounted(pod, 2, node())
    assert uncounted(make_pod("web-0", containers=[container(resources=counted_gpus(2))]), 2, node()) is None
    # The node's GPU type known now, not when the pod was created.
    message = uncounted(make_pod("web-0", containers=[container(resources=counted_gpus(2))]), 2, node(product="Tesla T4"))
    assert "product.gpu-scheduler.io/Tesla-T4: 2 (it requests 0)" in message
    assert uncounted(make_pod("web-0", containers=[container(resources=counted_gpus(2, "Tesla-T4"))]), 2,
                     node(product="Tesla T4")) is None


# --------------------------------------------------------------------------- mutate's node reads (error paths: a fake API)

class _Nodes:
    """read_node as the API server answers it, counting the reads."""

    def __init__(self, answers):
        self.answers, self.reads = answers, 0

    def read_node(self, name, cached=False):
        from kubeapi.errors import APIError
        self.reads += 1
        answer = self.answers[name]
        if isinstance(answer, APIError):
            raise answer
        return answer


def _node_products(answers, seconds=10.0):
    # Loaded from its file, as functions-framework loads mutate: functions/mutate is no package.
    import importlib.util
    from conftest import REPO
    spec = importlib.util.spec_from_file_location("mutate_nodeproduct", REPO / "functions" / "mutate" / "nodeproduct.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    api = _Nodes(answers)
    return module.NodeProducts(api, seconds), api


def test_a_nodes_gpu_type_is_read_once_per_interval():
    products, api = _node_products({"node1": node(product="Tesla-T4")})
    assert [products("node1") for _ in range(5)] == ["Tesla-T4"] * 5
    assert api.reads == 1
    products.seconds = 0
    assert products("node1") == "Tesla-T4" and api.reads == 2


def test_a_missing_node_has_no_type_yet_and_a_failed_read_is_not_kept():
    from kubeapi.errors import APIError
    products, api = _node_products({"gone": APIError(404, 'nodes "gone" not found', "NotFound", "nodes", "gone"),
                                    "down": APIError(0, "connection refused")})
    assert products("gone") is None and products("gone") is None and api.reads == 1  # kept: asked again later
    assert products("down") is None and products("down") is None and api.reads == 3  # not kept: asked each time


def test_without_an_api_server_every_pod_counts_in_the_total_only():
    products, _ = _node_products({})
    products.kube = None
    assert products("node1") is None


# --------------------------------------------------------------------------- bind's setting

def test_bind_counts_quotas_unless_told_not_to_and_refuses_a_wrong_value():
    import sys
    from conftest import REPO
    sys.path.insert(0, str(REPO / "functions" / "bind"))  # as tests/test_placer.py imports bind's modules
    from config import BindConfig, ConfigError
    assert BindConfig.from_environment({}).scheduler.quota is True
    assert BindConfig.from_environment({"GPU_SCHEDULER_QUOTA": "false"}).scheduler.quota is False
    with pytest.raises(ConfigError, match="GPU_SCHEDULER_QUOTA: 'no': expected true or false"):
        BindConfig.from_environment({"GPU_SCHEDULER_QUOTA": "no"})
