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
    assert "re-create it" in uncounted(pod, 2, node())  # quotas not known: any may count it
    assert uncounted(make_pod("web-0", containers=[container(resources=counted_gpus(2))]), 2, node()) is None
    # The node's GPU type known now, not when the pod was created.
    message = uncounted(make_pod("web-0", containers=[container(resources=counted_gpus(2))]), 2, node(product="Tesla T4"))
    assert "product.gpu-scheduler.io/Tesla-T4: 2 (it requests 0)" in message
    assert uncounted(make_pod("web-0", containers=[container(resources=counted_gpus(2, "Tesla-T4"))]), 2,
                     node(product="Tesla T4")) is None


# --------------------------------------------------------------------------- GPUQuota: only where a quota counts
def resource_quota(name, hard, **spec):
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"hard": hard, **spec},
            "status": {"used": {k: "0" for k in hard}}}


TOTAL = "requests.gpu-scheduler.io/gpu"
T4 = "product.gpu-scheduler.io/Tesla-T4"


def test_gpuquota_refuses_nothing_where_no_quota_of_the_namespace_counts_the_gpus():
    from gpu_scheduler.plugins.gpuquota import uncounted
    short = make_pod("web-0", containers=[container(resources=counted_gpus(1))])
    assert uncounted(short, 2, node(product="Tesla T4"), []) is None  # no quota at all
    assert uncounted(short, 2, node(product="Tesla T4"), [resource_quota("cpu", {"requests.cpu": "4"})]) is None
    # a quota on another GPU type, or on nvidia.com/gpu, counts none of what the pod is short of
    other = resource_quota("a100", {"requests.product.gpu-scheduler.io/NVIDIA-A100-SXM4-80GB": "1",
                                    "requests.nvidia.com/gpu": "1"})
    assert uncounted(short, 2, node(product="Tesla T4"), [other]) is None


def test_gpuquota_refuses_only_for_the_resources_a_quota_counts():
    from gpu_scheduler.plugins.gpuquota import uncounted
    # counted for 2 in total, 0 of its type (the node's type not known at its creation)
    pod = make_pod("web-0", containers=[container(resources=counted_gpus(2))])
    total_only = resource_quota("gpus", {TOTAL: "8"})
    assert uncounted(pod, 2, node(product="Tesla T4"), [total_only]) is None  # the total it requests is right
    message = uncounted(pod, 2, node(product="Tesla T4"), [total_only, resource_quota("t4", {f"requests.{T4}": "2"})])
    assert f"as {T4}: 2 (it requests 0), which ResourceQuota t4 bounds;" in message
    assert "gpu-scheduler.io/gpu:" not in message.split("as ", 1)[1].split(", which")[0]
    # pinning more: the total is short; either spelling of the resource in spec.hard counts it
    for hard in ({TOTAL: "8"}, {"gpu-scheduler.io/gpu": "8"}):
        message = uncounted(pod, 3, node(), [resource_quota("gpus", hard)])
        assert "as gpu-scheduler.io/gpu: 3 (it requests 2), which ResourceQuota gpus bounds;" in message
    both = uncounted(pod, 3, node(product="Tesla T4"), [resource_quota("gpus", {TOTAL: "8"}),
                                                      resource_quota("t4", {f"requests.{T4}": "8", TOTAL: "8"})])
    assert f"gpu-scheduler.io/gpu: 3 (it requests 2), {T4}: 3 (it requests 0), which ResourceQuotas gpus, t4 bound" in both


def test_gpuquota_names_the_fix_that_works_for_the_pod():
    from gpu_scheduler.plugins.gpuquota import uncounted
    quotas = [resource_quota("gpus", {TOTAL: "8"})]
    bare = make_pod("web-0", containers=[container(resources=counted_gpus(1))])
    message = uncounted(bare, 2, node(), quotas)
    assert message.endswith(": re-create it (delete it and create it again: gpu-scheduler's webhook counts it when it"
                            " is created)") and "controller" not in message
    owned = {**bare, "metadata": {**bare["metadata"], "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s", "controller": True}]}}
    assert uncounted(owned, 2, node(), quotas).endswith(": delete it, and its controller creates it again, counted")
    # an owner that is not its controller creates nothing again
    owner_only = {**bare, "metadata": {**bare["metadata"], "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c"}]}}
    assert "re-create it" in uncounted(owner_only, 2, node(), quotas)


def test_gpuquota_counts_a_quota_only_for_the_pods_its_scopes_select():
    from gpu_scheduler.plugins.gpuquota import uncounted
    pod = make_pod("web-0", containers=[container(resources=counted_gpus(1))])
    pod["spec"]["priorityClassName"] = "low"
    high = resource_quota("high", {TOTAL: "8"}, scopeSelector={"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})
    assert uncounted(pod, 2, node(), [high]) is None
    low = resource_quota("low", {TOTAL: "8"}, scopeSelector={"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["low"]}]})
    assert "ResourceQuota low bounds" in uncounted(pod, 2, node(), [high, low])
    assert uncounted(pod, 2, node(), [resource_quota("t", {TOTAL: "8"}, scopes=["Terminating"])]) is None
    assert uncounted(pod, 2, node(), [resource_quota("n", {TOTAL: "8"}, scopes=["NotTerminating"])]) is not None
    # a scope not known here: the quota is taken to count the pod
    assert uncounted(pod, 2, node(), [resource_quota("x", {TOTAL: "8"}, scopes=["SomethingNew"])]) is not None


def _gpuquota_answer(pod, quotas):
    from gpu_scheduler import plan as core
    from gpu_scheduler.framework.snapshot import NodeSnapshot
    from gpu_scheduler.plugins.config import SchedulerConfig
    from gpu_scheduler.plugins.registry import new_framework
    ready = {"type": "Ready", "status": "True"}
    node_object = {"metadata": {"name": "node1", "labels": {}},
                   "status": {"capacity": {"nvidia.com/gpu": "4", GPU_RESOURCE: "100000"},
                              "allocatable": {"nvidia.com/gpu": "4", GPU_RESOURCE: "100000"}, "conditions": [ready]}}
    framework = new_framework(SchedulerConfig(quota=True))
    view = core.ReadView(lambda name, deciding: NodeSnapshot(name, node_object, quotas=quotas))
    return core.answer(pod, framework, view).scheduling


def test_gpuquota_in_the_framework_places_a_short_pod_unless_its_namespace_has_a_quota_counting_it():
    from gpu_scheduler.quota import quota_view
    pod = make_pod("web-0", map_text="0=node1:0,1\n", containers=[container(resources=counted_gpus(1))])
    pod["metadata"]["uid"] = "u-1"
    assert _gpuquota_answer(pod, {"default": ()}).action == "bind"
    assert _gpuquota_answer(pod, {"other": (quota_view(resource_quota("gpus", {TOTAL: "8"})),)}).action == "bind"
    refused = _gpuquota_answer(pod, {"default": (quota_view(resource_quota("gpus", {TOTAL: "8"})),)})
    assert refused.action != "bind" and "which ResourceQuota gpus bounds" in refused.message, refused
    assert "re-create it" in refused.message
    # quotas not read (None): taken to count it, as before
    assert _gpuquota_answer(pod, None).action != "bind"


def test_gpuquota_is_retried_when_a_resourcequota_is_added_changed_or_deleted():
    from gpu_scheduler.framework.events import QUOTA_ADD, QUOTA_DELETE, QUOTA_UPDATE
    from gpu_scheduler.plugins.gpuquota import GPUQuota
    from gpu_scheduler.queueing import ANY_NODE, Refused, requeues
    assert {QUOTA_ADD, QUOTA_UPDATE, QUOTA_DELETE} <= GPUQuota.events
    assert all(requeues(Refused("GPUQuota", "node1"), event, ANY_NODE) for event in (QUOTA_ADD, QUOTA_UPDATE, QUOTA_DELETE))
    assert not requeues(Refused("GPUsHeld", "node1"), QUOTA_DELETE, ANY_NODE)


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
    return (module.NodeProducts(api) if seconds is None else module.NodeProducts(api, seconds)), api


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


def test_a_nodes_gpu_type_is_kept_a_second_at_most_and_the_cache_stays_bounded(monkeypatch):
    products, api = _node_products({f"n{i}": node(product="Tesla-T4") for i in range(5)}, seconds=None)
    assert products.seconds <= 1.0  # the module's own default: a label 2 s old is read
    monkeypatch.setitem(type(products).__init__.__globals__, "MAX_NODES", 3)  # the module's globals
    for i in range(5):
        products(f"n{i}")
    assert len(products._known) <= 3 and api.reads == 5


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


# --------------------------------------------------------------------------- bind's ResourceQuota view

def _bind_cache(**options):
    import sys
    from conftest import REPO
    sys.path.insert(0, str(REPO / "functions" / "bind"))
    from cache import Cache
    return Cache(dra=False, **options)


def test_bind_keeps_each_namespaces_quotas_for_the_snapshots_and_says_what_changed():
    from gpu_scheduler.framework.events import ANY_NODE, QUOTA_ADD, QUOTA_DELETE, QUOTA_UPDATE
    cache = _bind_cache(quotas=True)
    gpus = {**resource_quota("gpus", {TOTAL: "8"}), "metadata": {"name": "gpus", "namespace": "a", "resourceVersion": "1",
                                                                 "managedFields": [{"manager": "kubectl"}]}}
    cache.replace_quotas(iter([[gpus]]))
    snapshot = cache.snapshot("node1", namespaces=["a", "b"])
    assert snapshot.quotas == {"a": ({"metadata": {"name": "gpus", "namespace": "a"}, "spec": {"hard": {TOTAL: "8"}}},),
                               "b": ()}
    # its use changes with every pod of the namespace: no event (no refusal can change with it)
    used = {**gpus, "status": {"used": {TOTAL: "3"}}, "metadata": {**gpus["metadata"], "resourceVersion": "2"}}
    assert cache.apply_quota("MODIFIED", used).events == ()
    raised = {**used, "spec": {"hard": {"requests.cpu": "8"}}}
    assert cache.apply_quota("MODIFIED", raised).events == ((QUOTA_UPDATE, ANY_NODE),)
    assert cache.snapshot("node1", namespaces=["a"]).quotas["a"][0]["spec"] == {"hard": {"requests.cpu": "8"}}
    other = {**gpus, "metadata": {"name": "t4", "namespace": "b"}}
    assert cache.apply_quota("ADDED", other).events == ((QUOTA_ADD, ANY_NODE),)
    assert cache.apply_quota("DELETED", raised).events == ((QUOTA_DELETE, ANY_NODE),)
    assert cache.snapshot("node1", namespaces=["a", "b"]).quotas == {"a": (), "b": (quota_view_of(other),)}
    # not watched (quotas off): snapshots say they were not read
    assert _bind_cache().snapshot("node1", namespaces=["a"]).quotas is None


def quota_view_of(quota):
    from gpu_scheduler.quota import quota_view
    return quota_view(quota)
