"""Pinned workloads queued by the real Kueue v0.17.0 (localcp/workloads.py), placed by mutate and bind
on the real control plane. Node objects without kubelets: pods are bound and stay Pending.

Kueue decides from a workload's templates (times their pod counts), before any pod exists; mutate
writes on each template with a map what its largest entry pins (gpu_scheduler/templatecount.py), so
that Kueue counts pinned GPUs:

- a ClusterQueue of 8 GPUs, two pinned workloads of 8 GPUs each on different devices (so that only
  the queue holds the second back, never a GPU), for StatefulSets, Indexed Jobs, JobSets and
  LeaderWorkerSets: the first is admitted and every pod bound to its entry; the second waits in
  the queue, no pod of it bound, no device record naming it, no FailedScheduling Event from bind;
  once the first is deleted, the second is admitted and all its pods are bound within 10 s;
- per GPU type: ClusterQueues counting H100s and A100s (node1/node2 and node3/node4 labelled with
  nvidia.com/gpu.product): a second 4-H100 Job is held while an A100 Job is admitted and placed;
- a plain Pod (Kueue's pod integration) with a map is gated by Kueue and left alone by bind while
  its ClusterQueue has 0 GPUs; raising the quota lifts the gate and bind binds it within 2 s;
- a pod with a map and Kueue's Topology-Aware Scheduling annotation is refused by mutate.

The first two fail on the code before the template counting (c7c0bb3): there the templates request
no GPU, and Kueue reserves quota for the second workload at once; the fourth fails there too (no
refusal). The third passes there: a plain Pod's Workload is built from the pod, which mutate gave
its entry's GPUs before, and bind already left gated pods alone; it holds that this stays so.
Everything is polled; the checks that something does NOT happen hold for a few seconds after Kueue
has said it keeps the workload pending. Timings (admission -> bound, gate lifted -> bound) are printed.
"""
from __future__ import annotations

import itertools
import json
import re
import time
import urllib.parse
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from localcp.stack import LocalStack
from localcp.workloads import KUEUE_NAMESPACE_LABEL
from tests.conftest import release_namespace
from tests.test_end_to_end import env_of
from tests.test_kueue_controller_cluster import GATE, GPU, KUEUE, QUEUE_LABEL, V, condition, custom
from tests.test_pending_reasons_cluster import failed_scheduling

pytestmark = pytest.mark.controlplane

PRODUCT_LABEL = "nvidia.com/gpu.product"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
H100_RESOURCE, A100_RESOURCE = f"product.gpu-scheduler.io/{H100}", f"product.gpu-scheduler.io/{A100}"
FLAVOR = "default"
LOCAL_QUEUE = "team"
RECORDS = "/apis/coordination.k8s.io/v1/namespaces/gpu-scheduler/leases?labelSelector=" + urllib.parse.quote(
    "app.kubernetes.io/managed-by=gpu-scheduler")
HOLDERS = "gpu-scheduler/holders"
HOLD_SECONDS = 3  # how long "nothing happens to the held workload" is watched once Kueue said Pending


@pytest.fixture(scope="module")
def kueue_stack():
    with LocalStack(workloads=("jobset", "lws", "kueue"), event_source=False) as running:
        custom(running).create_cluster_custom_object(KUEUE, V, "resourceflavors", {
            "apiVersion": f"{KUEUE}/{V}", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
        yield running


class Queues:
    """The test's namespace (managed by Kueue) and its ClusterQueues, each with a LocalQueue in it."""

    def __init__(self, stack, namespace: str):
        self.stack, self.ns, self.cluster_queues = stack, namespace, []

    def add(self, name: str, quotas: dict[str, str], local: str = LOCAL_QUEUE) -> str:
        api = custom(self.stack)
        cq = f"{self.ns}-{name}"[:63]
        api.create_cluster_custom_object(KUEUE, V, "clusterqueues", {
            "apiVersion": f"{KUEUE}/{V}", "kind": "ClusterQueue", "metadata": {"name": cq},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": list(quotas),
                "flavors": [{"name": FLAVOR, "resources": [{"name": r, "nominalQuota": q} for r, q in quotas.items()]}]}]}})
        self.cluster_queues.append(cq)
        self.stack.wait_for(lambda: (condition(api.get_cluster_custom_object(KUEUE, V, "clusterqueues", cq), "Active")
                                     or {}).get("status") == "True", 60, f"ClusterQueue {cq} Active")
        api.create_namespaced_custom_object(KUEUE, V, self.ns, "localqueues", {
            "apiVersion": f"{KUEUE}/{V}", "kind": "LocalQueue", "metadata": {"name": local},
            "spec": {"clusterQueue": cq}})
        return cq

    def remove(self) -> None:
        for cq in self.cluster_queues:
            try:
                custom(self.stack).delete_cluster_custom_object(KUEUE, V, "clusterqueues", cq)
            except ApiException as error:
                if error.status != 404:
                    raise


_names = itertools.count()


@pytest.fixture
def queues(kueue_stack, request) -> Queues:
    name = re.sub(r"[^a-z0-9-]+", "-", f"kq{next(_names)}-{request.node.name.lower()}")[:40].strip("-")
    kueue_stack.create_namespace(name, labels=KUEUE_NAMESPACE_LABEL)
    made = Queues(kueue_stack, name)
    yield made
    release_namespace(kueue_stack, name)
    made.remove()


# -- the workloads --------------------------------------------------------------------------
def entries(devices: str, nodes=("node1", "node2", "node3", "node4")) -> str:
    return "".join(f"{i}={node}:{devices}\n" for i, node in enumerate(nodes))


def pod_template(name: str, map_text: str, restart: str) -> dict:
    return {"metadata": {"labels": {"app": name}, "annotations": {"gpu-scheduling-map": map_text}},
            "spec": {"schedulerName": "gpu-scheduler", "restartPolicy": restart, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "pause"}]}}


def indexed_job(name: str, map_text: str, count: int = 4) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
            "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count, "backoffLimit": 0,
                     "template": pod_template(name, map_text, "Never")}}


def manifest(kind: str, namespace: str, name: str, map_text: str) -> dict:
    """8 GPUs: 4 pods of 2 GPUs each, the queue-name label on the object (as Kueue reads it for each)."""
    meta = {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: LOCAL_QUEUE}}
    if kind == "StatefulSet":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": {
            "replicas": 4, "serviceName": name, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}}, "template": pod_template(name, map_text, "Always")}}
    if kind == "Job":
        return {**indexed_job(name, map_text), "metadata": meta}
    if kind == "JobSet":
        return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": kind, "metadata": meta, "spec": {"replicatedJobs": [{
            "name": "w", "replicas": 2, "template": {"spec": {
                "parallelism": 2, "completions": 2, "completionMode": "Indexed", "backoffLimit": 0,
                "template": pod_template(name, map_text, "Never")}}}]}}
    if kind == "LeaderWorkerSet":
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": kind, "metadata": meta, "spec": {
            "replicas": 2, "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": pod_template(name, map_text, "Always")}}}
    raise ValueError(kind)


def index_of(kind: str, pod: dict) -> int:
    """The pod's map entry, as podindex.py reads it."""
    labels = pod["metadata"]["labels"]
    if kind == "StatefulSet":
        return int(labels["apps.kubernetes.io/pod-index"])
    if kind == "Job":
        return int(labels["batch.kubernetes.io/job-completion-index"])
    if kind == "JobSet":
        return int(labels["jobset.sigs.k8s.io/job-index"]) * 2 + int(labels["batch.kubernetes.io/job-completion-index"])
    return int(labels["leaderworkerset.sigs.k8s.io/group-index"]) * 2 + int(labels["leaderworkerset.sigs.k8s.io/worker-index"])


# Kueue's Workloads per object: one, but one per group of a LeaderWorkerSet.
WORKLOADS = {"StatefulSet": 1, "Job": 1, "JobSet": 1, "LeaderWorkerSet": 2}
# Whose pods exist, gated by Kueue, before admission (the others are suspended: no pod at all).
GATED_PODS = {"StatefulSet": 4, "LeaderWorkerSet": 4}
PLURALS = {"StatefulSet": ("apps", "v1", "statefulsets"), "Job": ("batch", "v1", "jobs"),
           "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
           "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")}


def workloads_of(stack, namespace: str, kind: str, name: str) -> list[dict]:
    """The Workloads Kueue made for the object `kind`/`name` (their owner)."""
    return [w for w in custom(stack).list_namespaced_custom_object(KUEUE, V, namespace, "workloads")["items"]
            if any(o["kind"] == kind and o["name"] == name for o in w["metadata"].get("ownerReferences") or [])]


def admitted(stack, namespace: str, kind: str, name: str, count: int = 1) -> list[dict] | None:
    found = workloads_of(stack, namespace, kind, name)
    if len(found) == count and all((condition(w, "Admitted") or {}).get("status") == "True" for w in found):
        return found
    return None


def pending(stack, namespace: str, kind: str, name: str, count: int = 1) -> list[dict] | None:
    """The Workloads, once Kueue has tried each and keeps it pending for want of quota."""
    found = workloads_of(stack, namespace, kind, name)
    taken = [w["metadata"]["name"] for w in found if (condition(w, "QuotaReserved") or {}).get("status") == "True"]
    assert not taken, f"{kind} {name}: quota reserved for {taken}, past the ClusterQueue's GPUs"
    if len(found) == count and all((condition(w, "QuotaReserved") or {}).get("reason") == "Pending" for w in found):
        return found
    return None


def podset_requests(workload: dict) -> list[dict]:
    return [ps["template"]["spec"]["containers"][0].get("resources", {}).get("requests", {})
            for ps in workload["spec"]["podSets"]]


def read(stack, kind: str, namespace: str, name: str) -> dict:
    group, version, plural = PLURALS[kind]
    prefix = "/api" if not group else f"/apis/{group}"
    return json.loads(stack.cp.get(f"{prefix}/{version}/namespaces/{namespace}/{plural}/{name}"))


def delete(stack, kind: str, namespace: str, name: str) -> None:
    group, version, plural = PLURALS[kind]
    stack.cp.request("DELETE", f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
                     {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})


def gates(pod: dict) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def records_naming(stack, namespace: str, name: str) -> list[str]:
    """bind's device records (Leases) with a holder `<kind> <namespace>/<name>`."""
    leases = json.loads(stack.cp.get(RECORDS))["items"]
    return [lease["metadata"]["name"] for lease in leases
            if any(h.endswith(f" {namespace}/{name}")
                   for h in json.loads((lease["metadata"].get("annotations") or {}).get(HOLDERS) or "[]"))]


def binds_events(stack, namespace: str, pods: list[dict]) -> list[str]:
    return [e["message"] for p in pods for e in failed_scheduling(stack, namespace, p["metadata"]["uid"])]


def hold_unplaced(stack, namespace: str, name: str, seconds: float = HOLD_SECONDS) -> list[dict]:
    """For `seconds`: no pod of `name` bound, no record naming it, no FailedScheduling Event from
    bind on its pods. Its pods at the end."""
    deadline = time.monotonic() + seconds
    while True:
        pods = stack.pods(namespace, f"app={name}")
        assert not [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")], f"pods of {name} bound"
        assert records_naming(stack, namespace, name) == [], f"device records naming {name}"
        assert binds_events(stack, namespace, pods) == [], f"bind's Events on pods of {name}"
        if time.monotonic() > deadline:
            return pods
        time.sleep(0.3)


def check_placed(kind: str, pods: list[dict], map_text: str) -> None:
    want = {int(i): tuple(entry.split(":")) for i, entry in (line.split("=") for line in map_text.split())}
    got = {index_of(kind, p): (p["spec"]["nodeName"], env_of(p).get("CUDA_VISIBLE_DEVICES")) for p in pods}
    assert got == want
    for pod in pods:
        devices = want[index_of(kind, pod)][1]
        assert pod["spec"]["containers"][0]["resources"]["requests"][GPU] == str(len(devices.split(",")))
        assert pod["metadata"]["annotations"]["gpu-scheduler/devices"] == devices


def force_delete_pods(stack, namespace: str, selector: str) -> None:
    for pod in stack.pods(namespace, selector):
        try:
            stack.api.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise


def diagnosis(stack, namespace: str) -> str:
    """The namespace's Workloads (conditions) and pods (gates, node, finalizers), for a failure."""
    lines = []
    for w in custom(stack).list_namespaced_custom_object(KUEUE, V, namespace, "workloads")["items"]:
        lines.append(f"Workload {w['metadata']['name']} owners={[o['name'] for o in w['metadata'].get('ownerReferences') or []]}"
                     f" deleting={bool(w['metadata'].get('deletionTimestamp'))} finalizers={w['metadata'].get('finalizers')}")
        lines += [f"  {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
                  for c in (w.get("status") or {}).get("conditions") or []]
    for p in stack.pods(namespace):
        lines.append(f"Pod {p['metadata']['name']} node={p['spec'].get('nodeName')} gates={gates(p)}"
                     f" deleting={bool(p['metadata'].get('deletionTimestamp'))} finalizers={p['metadata'].get('finalizers')}")
    return "\n".join(lines)


# -- 1. one ClusterQueue of 8 GPUs, two workloads of 8 -------------------------------------------
@pytest.mark.parametrize("kind", ["StatefulSet", "Job", "JobSet", "LeaderWorkerSet"])
def test_the_second_pinned_workload_waits_in_the_queue_until_the_first_is_gone(kueue_stack, queues, kind):
    stack, ns = kueue_stack, queues.ns
    queues.add("eight", {GPU: "8"})
    first_map, second_map = entries("0,1"), entries("2,3")  # never the same GPU: only the queue holds back
    count = WORKLOADS[kind]

    stack.apply(manifest(kind, ns, "alpha", first_map))
    stack.wait_for(lambda: admitted(stack, ns, kind, "alpha", count), 60, f"{kind} alpha admitted")
    pods = stack.wait_bound(ns, 4, "app=alpha")
    check_placed(kind, pods, first_map)
    assert records_naming(stack, ns, "alpha"), "bind's records of alpha"

    stack.apply(manifest(kind, ns, "beta", second_map))
    held = stack.wait_for(lambda: pending(stack, ns, kind, "beta", count), 60, f"{kind} beta pending in the queue")
    assert all(GPU in condition(w, "QuotaReserved")["message"] for w in held), [condition(w, "QuotaReserved") for w in held]
    if kind in GATED_PODS:
        stack.wait_for(lambda: len(stack.pods(ns, "app=beta")) == GATED_PODS[kind], 60, f"the gated pods of {kind} beta")
    pods = hold_unplaced(stack, ns, "beta")
    if kind in GATED_PODS:
        assert len(pods) == GATED_PODS[kind] and all(GATE in gates(p) for p in pods), [gates(p) for p in pods]
    else:
        assert pods == [] and read(stack, kind, ns, "beta")["spec"]["suspend"] is True

    delete(stack, kind, ns, "alpha")
    force_delete_pods(stack, ns, "app=alpha")

    def alpha_gone():
        force_delete_pods(stack, ns, "app=alpha")  # a controller may still make one before it goes
        return not stack.pods(ns, "app=alpha")
    stack.wait_for(alpha_gone, 60, f"the pods of {kind} alpha gone", interval=0.5)
    gone = time.monotonic()
    admitted_at = released_at = None

    def all_bound():
        nonlocal admitted_at, released_at
        if released_at is None and not workloads_of(stack, ns, kind, "alpha"):
            released_at = time.monotonic()
        if admitted_at is None and admitted(stack, ns, kind, "beta", count):
            admitted_at = time.monotonic()
        pods = stack.pods(ns, "app=beta")
        return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None
    try:
        pods = stack.wait_for(all_bound, 10, f"the 4 pods of {kind} beta bound", interval=0.1)
    except TimeoutError:
        print(diagnosis(stack, ns))
        kueue_log = stack.cp.workdir / "kueue-controller.log"
        (Path("/tmp") / f"kueue-{ns}.log").write_text(kueue_log.read_text(errors="replace"))
        raise
    bound = time.monotonic()
    print(f"\n{kind}: alpha's Workload gone {released_at - gone if released_at else float('nan'):.2f} s,"
          f" beta admitted {admitted_at - gone if admitted_at else float('nan'):.2f} s and all bound "
          f"{bound - gone:.2f} s after alpha's pods were gone (admission -> bound "
          f"{bound - admitted_at if admitted_at else float('nan'):.2f} s)")
    check_placed(kind, pods, second_map)
    for workload in workloads_of(stack, ns, kind, "beta"):  # what Kueue counted: mutate's counts on the templates
        assert all(r.get(GPU) == "2" for r in podset_requests(workload)), podset_requests(workload)


# -- 2. per GPU type ----------------------------------------------------------------------------
def products_seen(stack, namespace: str, want: dict[str, str | None]) -> bool:
    """mutate counts each node with the type it is labelled with now: a dry-run pod per node."""
    for node, product in want.items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "probe-0", "annotations": {"gpu-scheduling-map": f"0={node}:0\n"}},
            "spec": pod_template("probe", "", "Never")["spec"]}
        made = json.loads(stack.api.create_namespaced_pod(namespace, pod, dry_run="All", _preload_content=False).data)
        requests = made["spec"]["containers"][0].get("resources", {}).get("requests", {})
        have = [r.removeprefix("product.gpu-scheduler.io/") for r in requests if r.startswith("product.")]
        if have != ([product] if product else []):
            return False
    return True


@pytest.fixture
def gpu_types(kueue_stack, queues):
    types = {"node1": H100, "node2": H100, "node3": A100, "node4": A100}
    for node, product in types.items():
        kueue_stack.cp.kubectl("label", "node", node, f"{PRODUCT_LABEL}={product}", "--overwrite")
    kueue_stack.wait_for(lambda: products_seen(kueue_stack, queues.ns, types), 30, "mutate seeing the GPU types",
                         interval=0.5)
    yield types
    for node in types:
        kueue_stack.cp.kubectl("label", "node", node, f"{PRODUCT_LABEL}-")
    kueue_stack.wait_for(lambda: products_seen(kueue_stack, queues.ns, dict.fromkeys(types)), 30,
                         "mutate seeing the nodes without a type", interval=0.5)


def test_a_queue_per_gpu_type_holds_h100_jobs_while_an_a100_job_runs(kueue_stack, queues, gpu_types):
    stack, ns = kueue_stack, queues.ns
    queues.add("h100", {GPU: "100", H100_RESOURCE: "4"}, local="h100")
    queues.add("a100", {GPU: "100", A100_RESOURCE: "8"}, local="a100")

    def job(name: str, map_text: str, queue: str) -> dict:
        body = indexed_job(name, map_text)
        body["metadata"].update(namespace=ns, labels={QUEUE_LABEL: queue})
        return body

    first_map = "0=node1:0\n1=node1:1\n2=node2:0\n3=node2:1\n"
    second_map = "0=node1:2\n1=node1:3\n2=node2:2\n3=node2:3\n"
    a100_map = "0=node3:0\n1=node3:1\n2=node4:0\n3=node4:1\n"
    stack.apply(job("h100-a", first_map, "h100"))
    [workload] = stack.wait_for(lambda: admitted(stack, ns, "Job", "h100-a"), 60, "Job h100-a admitted")
    pods = stack.wait_bound(ns, 4, "app=h100-a")
    check_placed("Job", pods, first_map)

    stack.apply(job("h100-b", second_map, "h100"))
    [held] = stack.wait_for(lambda: pending(stack, ns, "Job", "h100-b"), 60, "Job h100-b pending in the queue")
    assert H100_RESOURCE in condition(held, "QuotaReserved")["message"], condition(held, "QuotaReserved")
    assert podset_requests(workload) == podset_requests(held) == [{GPU: "1", H100_RESOURCE: "1"}]

    stack.apply(job("a100", a100_map, "a100"))
    [workload] = stack.wait_for(lambda: admitted(stack, ns, "Job", "a100"), 60, "Job a100 admitted")
    assert podset_requests(workload) == [{GPU: "1", A100_RESOURCE: "1"}]
    pods = stack.wait_bound(ns, 4, "app=a100")
    check_placed("Job", pods, a100_map)

    assert hold_unplaced(stack, ns, "h100-b") == []
    assert pending(stack, ns, "Job", "h100-b")
    assert read(stack, "Job", ns, "h100-b")["spec"]["suspend"] is True


# -- 3. a plain Pod, gated by Kueue ----------------------------------------------------------------
def test_a_pod_gated_by_kueue_is_left_alone_then_bound_once_the_gate_is_lifted(kueue_stack, queues):
    stack, ns = kueue_stack, queues.ns
    cq = queues.add("none", {GPU: "0"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "solo-0", "labels": {QUEUE_LABEL: LOCAL_QUEUE, "app": "solo"},
        "annotations": {"gpu-scheduling-map": "0=node1:0\n"}}, "spec": pod_template("solo", "", "Never")["spec"]}
    created = json.loads(stack.api.create_namespaced_pod(ns, pod, _preload_content=False).data)
    assert GATE in gates(created)  # Kueue's pod webhook
    assert created["spec"]["containers"][0]["resources"]["requests"] == {GPU: "1"}  # mutate's
    [held] = stack.wait_for(lambda: pending(stack, ns, "Pod", "solo-0"), 60, "the Workload of Pod solo-0 pending")
    assert podset_requests(held) == [{GPU: "1"}]
    [pod_now] = hold_unplaced(stack, ns, "solo")
    assert GATE in gates(pod_now)

    custom(stack).patch_cluster_custom_object(KUEUE, V, "clusterqueues", cq, {"spec": {"resourceGroups": [{
        "coveredResources": [GPU], "flavors": [{"name": FLAVOR, "resources": [{"name": GPU, "nominalQuota": "1"}]}]}]}})

    def read_pod() -> dict:
        return json.loads(stack.api.read_namespaced_pod("solo-0", ns, _preload_content=False).data)
    stack.wait_for(lambda: GATE not in gates(read_pod()), 60, "Kueue lifting the gate", interval=0.05)
    ungated = time.monotonic()
    stack.wait_for(lambda: read_pod()["spec"].get("nodeName"), 2, "solo-0 bound within 2 s of its gate's removal",
                   interval=0.05)
    print(f"\nPod solo-0 bound {time.monotonic() - ungated:.2f} s after Kueue lifted its gate")
    bound = read_pod()
    assert bound["spec"]["nodeName"] == "node1" and env_of(bound)["CUDA_VISIBLE_DEVICES"] == "0"
    assert binds_events(stack, ns, [bound]) == []


# -- 4. a map beside Topology-Aware Scheduling ------------------------------------------------------
def test_a_pod_with_a_map_and_a_kueue_topology_request_is_refused(kueue_stack, queues):
    stack, ns = kueue_stack, queues.ns
    queues.add("tas", {GPU: "8"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "tas-0", "labels": {QUEUE_LABEL: LOCAL_QUEUE},
        "annotations": {"gpu-scheduling-map": "0=node1:0\n",
                        f"{KUEUE}/podset-required-topology": "kubernetes.io/hostname"}},
        "spec": pod_template("tas", "", "Never")["spec"]}
    with pytest.raises(ApiException) as refused:
        stack.api.create_namespaced_pod(ns, pod)
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "mutate.gpu-scheduler.local" denied the request' in message, message
    assert f"{KUEUE}/podset-required-topology" in message and "gpu-scheduling-map" in message, message
    assert stack.pods(ns) == []
