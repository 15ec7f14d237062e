"""Nothing lost by decoding only what bind reads (kubeapi/projection.py): captured and generated
pods and nodes, every field the plugins read set at random among values that change a verdict,
with random extras everywhere (managed fields, container statuses, volumes, images, unknown keys),
decoded both ways (json.loads in full, and the projection bind watches with), each way put into
bind's own cache as its listings would, then compared: every pod's PodInfo (fit and GPU
accounting), bind's decision to take the pod or not, PreEnqueue, each PreFilter and each Filter
plugin's own verdict on the pod's node, the whole cycle's decision, and `explain`'s answer (the
group, the quorum, PostFilter's choice of victims)."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from conftest import REPO
from gpu_scheduler import ANNOTATION, SCHEDULER_NAME
from gpu_scheduler.binding import bind_decision
from gpu_scheduler.fit import DEVICES_ANNOTATION, GANG_ANNOTATION, SHARE_ANNOTATION, PodInfo, is_terminal
from gpu_scheduler.framework.interface import CycleState
from gpu_scheduler.plan import ReadView, answer
from gpu_scheduler.plugins.registry import new_framework
from kubeapi import projection

sys.path.insert(0, str(REPO / "functions" / "bind"))
from cache import Cache  # noqa: E402

FRAMEWORK = new_framework()
FIXTURES = REPO / "tests" / "fixtures" / "sample-events"
NODES = ("node1", "node2", "node3")
TAINTS = ({"key": "gpu", "value": "a100", "effect": "NoSchedule"}, {"key": "dedicated", "effect": "NoExecute"},
          {"key": "soft", "effect": "PreferNoSchedule"})


def extras(rng: random.Random) -> dict:
    """Keys no plugin reads, of every JSON type, which the projection must drop without a trace."""
    return {f"x-extra-{i}": rng.choice([None, 1, 2.5, "text", True, [1, {"a": None}], {"nested": {"deep": [1]}}])
            for i in range(rng.randint(0, 3))}


def managed_fields(rng: random.Random) -> list:
    return [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": "2026-11-22T20:43:35Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}}}}}}
            for m in rng.sample(["kubelet", "kube-controller-manager", "gpu-scheduler", "kubectl"], 2)]


def random_node(rng: random.Random, name: str) -> dict:
    gpus = rng.choice(["0", "4", "8"])
    allocatable = {"cpu": rng.choice(["4", "500m", "64"]), "memory": rng.choice(["1Gi", "256Gi"]),
                   "pods": rng.choice(["2", "110"]), "nvidia.com/gpu": gpus}
    conditions = [{"type": "Ready", "status": rng.choice(["True", "True", "False", "Unknown"]),
                   "reason": "KubeletReady", "message": "kubelet is posting ready status",
                   "lastHeartbeatTime": "2026-11-22T20:43:35Z", "lastTransitionTime": "2026-11-22T20:40:00Z", **extras(rng)}]
    conditions += [{"type": t, "status": rng.choice(["False", "False", "True"]), "lastHeartbeatTime": "x"}
                   for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rng.randint(1, 10**6)),
                         "labels": {"kubernetes.io/hostname": name, "zone": rng.choice(["a", "b"]),
                                    "nvidia.com/gpu.product": rng.choice(["A100", "H100"])},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                         "managedFields": managed_fields(rng), **extras(rng)},
            "spec": {"podCIDR": "10.244.0.0/24", "unschedulable": rng.random() < 0.15,
                     "taints": rng.sample(TAINTS, rng.randint(0, 1)) if rng.random() < 0.3 else [], **extras(rng)},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable, "conditions": conditions,
                       "images": [{"names": [f"image-{i}"], "sizeBytes": i} for i in range(rng.randint(0, 5))],
                       "nodeInfo": {"kubeletVersion": "v1.34.0"}, "addresses": [{"type": "Hostname", "address": name}],
                       **extras(rng)}}


def container(rng: random.Random, name: str, sidecar: bool = False) -> dict:
    requests = {k: v for k, v in (("cpu", rng.choice(["100m", "2", "100"])), ("memory", rng.choice(["64Mi", "300Gi"])),
                                   ("nvidia.com/gpu", rng.choice(["1", "2"]))) if rng.random() < 0.6}
    c = {"name": name, "image": "busybox", "command": ["sleep", "1"], "imagePullPolicy": "IfNotPresent",
         "resources": {"requests": requests, "limits": {k: v for k, v in requests.items() if k == "nvidia.com/gpu"}},
         "volumeMounts": [{"name": "v", "mountPath": "/v"}], "livenessProbe": {"exec": {"command": ["true"]}},
         **extras(rng)}
    if rng.random() < 0.3:
        c["ports"] = [{"containerPort": 80, "hostPort": rng.choice([8080, 9090]), "protocol": rng.choice(["TCP", "UDP"])}]
    if rng.random() < 0.4:
        c["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": rng.choice(["0", "1,2"])}]
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def random_pod(rng: random.Random, i: int, bound: bool) -> dict:
    workload = rng.choice(["train", "serve"])
    entries = "".join(f"{k}={rng.choice(NODES + ('gone',))}:{rng.choice(['0', '1', '0,1', '2,3'])}\n" for k in range(6))
    annotations = {ANNOTATION: entries, **({GANG_ANNOTATION: "true"} if rng.random() < 0.2 else {}),
                   **({SHARE_ANNOTATION: "true"} if rng.random() < 0.2 else {}),
                   "kubectl.kubernetes.io/last-applied-configuration": json.dumps({"big": "x" * 200})}
    node = rng.choice(NODES) if bound else None
    if bound and rng.random() < 0.6:
        annotations[DEVICES_ANNOTATION] = rng.choice(["0", "1", "0,1", "2"])
    index = i % 6
    spec: dict = {"schedulerName": SCHEDULER_NAME if rng.random() < 0.8 else "default-scheduler",
                  "containers": [container(rng, "c")], "terminationGracePeriodSeconds": rng.choice([0, 30]),
                  "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
                  "volumes": [{"name": "v", "emptyDir": {}}], "securityContext": {"runAsUser": 1000},
                  "priority": rng.choice([0, 100, 1000]), "preemptionPolicy": rng.choice(["PreemptLowerPriority", "Never"]),
                  "tolerations": rng.sample(TAINTS, rng.randint(0, 2)), **extras(rng)}
    if node:
        spec["nodeName"] = node
    if rng.random() < 0.3:
        spec["initContainers"] = [container(rng, "init", sidecar=rng.random() < 0.5)]
    if rng.random() < 0.2:
        spec["overhead"] = {"cpu": "250m"}
    if rng.random() < 0.2:
        spec["nodeSelector"] = {"zone": rng.choice(["a", "b"])}
    if rng.random() < 0.2:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [rng.choice(["A100", "H100"])]}]}]}}}
    if rng.random() < 0.1:
        spec["schedulingGates"] = [{"name": "example.com/wait"}]
    status: dict = {"phase": rng.choice(["Pending", "Running", "Running", "Succeeded", "Failed"]) if bound else "Pending",
                    "qosClass": "Burstable", "hostIP": "10.0.0.1", **extras(rng)}
    if bound:
        status["startTime"] = rng.choice(["2026-11-22T20:43:35Z", "2026-11-22T21:00:00Z"])
        status["containerStatuses"] = [{"name": "c", "ready": True, "restartCount": 0, "image": "busybox",
                                        "state": {"running": {"startedAt": "2026-11-22T20:43:40Z"}}}]
    status["conditions"] = [{"type": "PodScheduled", "status": "True" if bound else "False",
                             "lastTransitionTime": "2026-11-22T20:43:35Z", **extras(rng)}]
    meta: dict = {"name": f"{workload}-{index}" if rng.random() < 0.9 else f"{workload}-{index}-{i}",
                  "namespace": rng.choice(["team-a", "team-b"]), "uid": f"uid-{i}", "resourceVersion": str(1000 + i),
                  "generateName": f"{workload}-", "creationTimestamp": "2026-11-22T20:43:35Z",
                  "labels": {"app": workload, "apps.kubernetes.io/pod-index": str(index)},
                  "annotations": annotations, "managedFields": managed_fields(rng), **extras(rng),
                  "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": workload,
                                       "uid": f"owner-{workload}", "controller": True, "blockOwnerDeletion": True}]}
    if rng.random() < 0.1:
        meta["deletionTimestamp"] = "2026-11-22T21:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def captured_pods() -> list[dict]:
    pods = []
    for path in sorted(FIXTURES.rglob("*.json")):
        document = json.loads(path.read_text())
        body = document.get("body", document)
        obj = (body.get("request") or {}).get("object") if "request" in body else body
        if isinstance(obj, dict) and obj.get("kind") == "Pod":
            pods.append(obj)
    return pods


def both_ways(obj: dict, decoder: projection.Decoder) -> tuple[dict, dict]:
    """(in full, projected), each decoded from the watch event bind would receive."""
    line = json.dumps({"type": "MODIFIED", "object": obj}, separators=(",", ":")).encode()
    return json.loads(line)["object"], decoder.event(line)["object"]


def cache_of(nodes: list[dict], pods: list[dict]) -> Cache:
    cache = Cache(dra=False)
    cache.replace_nodes([nodes])
    cache.replace_pods([pods])
    return cache


def verdicts(pod: dict, cache: Cache, pods: list[dict]) -> dict:
    """Everything bind's framework says of `pod` over `cache`, plugin by plugin."""
    said: dict = {"bind_decision": repr(bind_decision(pod)), "pre_enqueue": FRAMEWORK.pre_enqueue(pod)}
    state, names = CycleState(), None
    for plugin in FRAMEWORK.profile.pre_filter:
        result = plugin.pre_filter(state, pod)
        said[f"pre_filter {plugin.name}"] = (result.status, result.node_names)
        if not result.status.ok:
            break
        names = result.node_names if result.node_names is not None else names
    for node in sorted(names or ()):
        snapshot = cache.snapshot(node)
        for plugin in FRAMEWORK.profile.filter:  # in turn, as the framework runs them: each may
            status = plugin.filter(state, pod, snapshot)  # count on the ones before it passing
            said[f"filter {plugin.name} on {node}"] = status
            if not status.ok:
                break
    decision = FRAMEWORK.decide(pod, cache.snapshot)
    said["decide"] = (decision.status, decision.node.name if decision.node else None, decision.devices)
    said["explain"] = answer(pod, FRAMEWORK, ReadView(lambda node, deciding: cache.snapshot(node), pods))
    return said


def scenario(seed: int) -> None:
    rng = random.Random(seed)
    full_nodes, kept_nodes = zip(*(both_ways(random_node(rng, name), projection.NODES) for name in NODES))
    generated = [random_pod(rng, i, bound=rng.random() < 0.5) for i in range(12)]
    full_pods, kept_pods = map(list, zip(*(both_ways(p, projection.PODS) for p in generated + captured_pods())))
    assert len(json.dumps(kept_pods)) < len(json.dumps(full_pods))  # the extras are gone
    full, kept = cache_of(list(full_nodes), full_pods), cache_of(list(kept_nodes), kept_pods)
    for node in NODES:
        assert full.snapshot(node).info == kept.snapshot(node).info, node
    for whole, projected in zip(full_pods, kept_pods):
        assert PodInfo.of(whole) == PodInfo.of(projected)
        assert is_terminal(whole) == is_terminal(projected)
        if not (whole.get("spec") or {}).get("nodeName"):
            assert verdicts(whole, full, full_pods) == verdicts(projected, kept, kept_pods), whole["metadata"]["name"]


@pytest.mark.parametrize("seed", range(60))
def test_a_projected_pod_gets_every_verdict_its_full_json_gets(seed):
    scenario(seed)


def test_what_is_not_shaped_as_the_kind_is_decoded_in_full():
    """An object where a TypedDict is declared (never sent by an API server): json.loads' answer,
    so the plugins judge it as before; an ERROR event's Status keeps its code and message."""
    odd = b'{"type":"ADDED","object":{"metadata":"not an object","spec":[1]}}'
    assert projection.PODS.event(odd) == json.loads(odd)
    gone = b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}'
    assert projection.PODS.event(gone) == json.loads(gone)
    with pytest.raises(ValueError):
        projection.PODS.event(b"{not json")


def test_a_status_only_update_of_a_running_pod_decodes_to_the_pod_as_it_was():
    """A kubelet's status update (its conditions' times, container restarts) leaves what bind keeps
    the same but for the resourceVersion."""
    rng = random.Random(7)
    pod = random_pod(rng, 0, bound=True)
    pod["status"]["phase"] = "Running"
    later = json.loads(json.dumps(pod))
    later["metadata"]["resourceVersion"] = "99999"
    later["status"]["containerStatuses"][0]["restartCount"] = 3
    later["metadata"]["managedFields"][0]["time"] = "2026-11-23T00:00:00Z"
    before, after = both_ways(pod, projection.PODS)[1], both_ways(later, projection.PODS)[1]
    after["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"]
    assert before == after


def test_the_cache_skips_a_status_update_of_a_pod_bound_elsewhere_and_takes_any_other_change(monkeypatch):
    """bind's cache works out a watched pod's PodInfo again only when something it reads changed:
    a kubelet's status update is skipped, a label or a phase is taken."""
    import cache as cache_module
    computed = []
    real_of = PodInfo.of
    monkeypatch.setattr(cache_module.PodInfo, "of", staticmethod(lambda pod: computed.append(1) or real_of(pod)))
    rng = random.Random(3)
    pod = random_pod(rng, 0, bound=True)
    pod["status"]["phase"], pod["spec"]["schedulerName"] = "Running", "default-scheduler"
    pod["metadata"].pop("deletionTimestamp", None)
    cache = Cache(dra=False)
    decoded = both_ways(pod, projection.PODS)[1]
    cache.apply_pod("ADDED", decoded)
    assert len(computed) == 1
    for restarts in range(3):  # the kubelet's updates: container statuses, a condition's time
        pod["status"]["containerStatuses"][0]["restartCount"] = restarts
        pod["status"]["conditions"][0]["lastTransitionTime"] = f"2026-11-23T00:00:0{restarts}Z"
        pod["metadata"]["resourceVersion"] = str(5000 + restarts)
        assert cache.apply_pod("MODIFIED", both_ways(pod, projection.PODS)[1]) == cache_module.NOTHING
    assert len(computed) == 1
    pod["metadata"]["labels"]["team"] = "b"
    cache.apply_pod("MODIFIED", both_ways(pod, projection.PODS)[1])
    assert len(computed) == 2 and ("team", "b") in cache.snapshot(pod["spec"]["nodeName"]).info.pods[0].labels
    pod["status"]["phase"] = "Succeeded"
    cache.apply_pod("MODIFIED", both_ways(pod, projection.PODS)[1])
    assert not cache.snapshot(pod["spec"]["nodeName"]).info.pods  # terminal: its node is free again


def review_of(pod: dict, rng: random.Random) -> bytes:
    pod = json.loads(json.dumps(pod))
    pod["spec"].pop("nodeName", None)
    pod.pop("status", None)
    if rng.random() < 0.3:
        pod["spec"]["containers"][0]["resources"] = {"requests": {"gpu-scheduler.io/gpu": "1"}}  # quota dodge
    if rng.random() < 0.2:
        pod["metadata"]["annotations"]["gpu-scheduler/device-env"] = rng.choice(["dra", "nvidia", "cuda", "bogus"])
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", **extras(rng), "request": {
        "uid": f"review-{rng.random()}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": pod["metadata"]["name"],
        "namespace": pod["metadata"]["namespace"], "operation": "CREATE", "dryRun": rng.random() < 0.1,
        "userInfo": {"username": "system:serviceaccount:kube-system:statefulset-controller"},
        "object": pod, "oldObject": None, "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}}).encode()


@pytest.mark.parametrize("seed", range(40))
def test_mutate_answers_a_projected_review_as_the_full_one(seed):
    """mutate's answer (patch, warnings, refusal) to a review decoded in full and projected."""
    from gpu_scheduler.admission import admission_response
    rng = random.Random(seed)
    reviews = [review_of(random_pod(rng, i, bound=False), rng) for i in range(10)]
    for raw in reviews:
        for mode in ("cuda", "dra"):
            assert (admission_response(json.loads(raw), mode, quota=seed % 2 == 0) ==
                    admission_response(projection.admission_review(raw), mode, quota=seed % 2 == 0))


def test_mutate_answers_the_captured_reviews_as_before():
    from gpu_scheduler.admission import admission_response
    for path in sorted(FIXTURES.rglob("admissionreview-*.json")):
        document = json.loads(path.read_text())
        raw = json.dumps(document.get("body", document)).encode()
        assert admission_response(json.loads(raw)) == admission_response(projection.admission_review(raw)), path
