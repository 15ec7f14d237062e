"""The project on real Knative: Eventing and Serving (localcp/versions.env) installed on the four
real nodes from their own release configuration (localcp/knative.py), the chart installed on
them with runtime knative as a user installs it (LocalStack(knative=True), localcp/knative-values.yaml).

- Knative's components run as pods on the nodes; bind and mutate are Knative Services whose
  Configuration, Revision, PodAutoscaler and ServerlessService are Ready, their revision pods
  run the real queue-proxy, and the Route is the one thing unready (IngressNotConfigured: no
  networking layer can run here).
- Each annotated pod is admitted through mutate's revision (webhook.path direct-service) and
  placed by bind from the real ApiServerSource adapter's add event, which bind answered 2xx.
- The real PingSource's ping reaches bind.
- mutate rolled to a new revision while pods are created: no creation fails.
- bind's revision pod deleted: Knative brings one back, and every pod created meanwhile is placed.
- Two bind instances (min-scale 2) under the real adapter: no GPU is given twice.
"""
from __future__ import annotations

import json
import re
import threading
import time

import pytest

from localcp import adapter, knative, versions
from localcp.cluster import KUBERNETES_VERSION, NODES
from localcp.stack import LocalStack
from tests.test_end_to_end import EXPECTED, statefulset
from tests.test_nodes import placement_from_logs, running

pytestmark = [pytest.mark.controlplane, pytest.mark.skipif(
    not versions.knative_supported(KUBERNETES_VERSION),
    reason=f"Knative v0.50.0 needs Kubernetes 1.{versions.KNATIVE_FIRST_MINOR} or newer (knative.dev/pkg's"
           f" DefaultKubernetesMinVersion); the stack's is {KUBERNETES_VERSION}")]
NS = "gpu-scheduler"
ADD = "dev.knative.apiserver.resource.add"
PING = "dev.knative.sources.ping"


@pytest.fixture(scope="module")
def kn():
    with LocalStack(knative=True) as running_stack:
        yield running_stack
    assert not running_stack.nodes.leftovers(), running_stack.nodes.leftovers()


def revision_pods(stack: LocalStack, service: str) -> list[dict]:
    return [p for p in stack.pods(NS, f"serving.knative.dev/service={service}")
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def events_counted(stack: LocalStack, pod: str) -> dict[tuple[str, str], float]:
    """bind's gpu_scheduler_bind_events_total in one of its pods, by (type, status): read from
    the pod's own port through the API server (each instance counts its own)."""
    metrics = stack.cp.get(f"/api/v1/namespaces/{NS}/pods/{pod}:8080/proxy/metrics").decode()
    counted = {}
    for labels, value in re.findall(r'^gpu_scheduler_bind_events_total\{([^}]*)\} (\S+)$', metrics, re.M):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counted[(fields["type"], fields["status"])] = float(value)
    return counted


def total(stack: LocalStack, kind: str, statuses=("200", "202", "204")) -> float:
    return sum(n for pod in revision_pods(stack, "bind") if ready(pod)
               for (k, status), n in events_counted(stack, pod["metadata"]["name"]).items()
               if k == kind and status in statuses)


def conditions(item: dict) -> dict[str, dict]:
    return {c["type"]: c for c in item.get("status", {}).get("conditions", [])}


def test_knative_runs_as_pods_on_the_real_nodes(kn):
    for namespace in knative.NAMESPACES:
        pods = kn.pods(namespace)
        assert pods, f"nothing runs in {namespace}"
        for pod in pods:
            assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] in NODES, pod["metadata"]["name"]
            for container in pod["spec"]["containers"]:
                assert container["image"].startswith("localhost/knative/"), container["image"]
    # Eventing's adapters are Knative's too: the ApiServerSource's Deployment and PingSource's mtping.
    adapters = [p for p in kn.pods(NS) if p["metadata"]["name"].startswith("apiserversource-")]
    assert adapters and all(ready(p) for p in adapters)
    assert adapters[0]["spec"]["containers"][0]["image"] == \
        knative.projects()[0].image_name("apiserver_receive_adapter")


def test_the_adapter_the_machine_runs_is_configured_as_eventings_controller_configures_it(kn):
    """localcp/adapter.py runs the same adapter on the machine for stacks without Knative: its
    environment is the one the real controller wrote into the adapter's Deployment here."""
    [deployment] = [d for d in kn.knative_resources("deployments") if d["metadata"]["name"].startswith("apiserversource-")]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    real = {e["name"]: e.get("value") for e in container["env"]}
    tap = adapter.EventTap("http://127.0.0.1:9")
    try:
        ours = adapter.ReceiveAdapter(kn.cp, kn.api, tap, kn.cp.kubeconfig).environment()
    finally:
        tap.stop()
    assert set(ours) == set(real)
    for name in ("SYSTEM_NAMESPACE", "NAME", "METRICS_DOMAIN", "K_KLOG_VERBOSITY"):
        assert ours[name] == real[name], name
    assert json.loads(ours["K_OBSERVABILITY_CONFIG"]) == json.loads(real["K_OBSERVABILITY_CONFIG"])
    assert json.loads(json.loads(ours["K_LOGGING_CONFIG"])["zap-logger-config"]) == \
        json.loads(json.loads(real["K_LOGGING_CONFIG"])["zap-logger-config"])
    ours_config, real_config = json.loads(ours["K_SOURCE_CONFIG"]), json.loads(real["K_SOURCE_CONFIG"])
    assert set(real_config["namespaces"]) <= set(ours_config.pop("namespaces"))  # listed when it reconciled
    real_config.pop("namespaces")
    assert ours_config == real_config


@pytest.mark.parametrize("service", ["bind", "mutate"])
def test_the_functions_are_knative_services_whose_revisions_are_ready(kn, service):
    [configuration] = [c for c in kn.knative_resources("configurations.serving.knative.dev")
                       if c["metadata"]["name"] == service]
    assert conditions(configuration)["Ready"]["status"] == "True"
    revision = configuration["status"]["latestReadyRevisionName"]
    [pod, *_] = revision_pods(kn, service)
    assert pod["metadata"]["labels"]["serving.knative.dev/revision"] == revision
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert "queue-proxy" in names and service in names
    [queue] = [c for c in pod["spec"]["containers"] if c["name"] == "queue-proxy"]
    assert queue["image"] == knative.projects()[1].image_name("queue")
    # The real autoscaler keeps min-scale: the PodAutoscaler wants at least one pod, and has it.
    [autoscaler] = [p for p in kn.knative_resources("podautoscalers.autoscaling.internal.knative.dev")
                    if p["metadata"]["name"] == revision]
    assert conditions(autoscaler)["Ready"]["status"] == "True"
    assert autoscaler["status"].get("actualScale", 0) >= 1
    # The Route: the one condition expected unready, and why.
    [route] = [r for r in kn.knative_resources("routes.serving.knative.dev") if r["metadata"]["name"] == service]
    assert conditions(route)["IngressReady"]["reason"] == "IngressNotConfigured"


def test_each_annotated_pod_is_admitted_by_mutates_revision_and_placed_by_bind_from_the_adapters_events(kn):
    added = total(kn, ADD)
    kn.create_namespace("seed")
    kn.apply(statefulset("seed"))
    pods = kn.wait_for(lambda: running(kn, "seed", 5), 180, "5 check pods Running")
    assert ({int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]): p["spec"]["nodeName"] for p in pods} ==
            {i: node for i, (node, _) in EXPECTED.items()})
    assert placement_from_logs(kn, "seed", pods) == EXPECTED  # CUDA_VISIBLE_DEVICES set by mutate
    # Admitted by mutate's revision pod (its TLS container's log: the API server called it).
    [mutate] = revision_pods(kn, "mutate")
    log = kn.cp.kubectl("logs", "-n", NS, mutate["metadata"]["name"], "-c", "webhook-tls").stdout
    admitted = {json.loads(line).get("pod") for line in log.splitlines() if line.startswith("{")}
    assert {f"seed/{p['metadata']['name']}" for p in pods} <= admitted
    # The real adapter's add events, answered 2xx by bind (at least one per pod).
    assert total(kn, ADD) - added >= 5


def test_a_ping_of_the_real_pingsource_reaches_bind(kn):
    before = total(kn, PING)
    kn.wait_for(lambda: total(kn, PING) > before, 90, "a ping answered 2xx (the PingSource: every minute)", interval=1)


def test_mutate_rolled_to_a_new_revision_while_pods_are_created_admits_every_one(kn):
    [old] = {p["metadata"]["labels"]["serving.knative.dev/revision"] for p in revision_pods(kn, "mutate")}
    kn.create_namespace("rollout")
    failures, created, stop = [], [], threading.Event()

    def create() -> None:
        i = 0
        while not stop.is_set():
            done = kn.cp.kubectl("apply", "-f", "-", input=json.dumps(statefulset(
                "rollout", f"0=node{i % 4 + 1}:3\n", replicas=0, name=f"roll-{i}")), check=False)
            (created if done.returncode == 0 else failures).append(done.stderr.strip() or f"roll-{i}")
            i += 1
    thread = threading.Thread(target=create)
    thread.start()
    try:
        kn.cp.kubectl("patch", "ksvc", "mutate", "-n", NS, "--type", "merge", "-p", json.dumps(
            {"spec": {"template": {"metadata": {"annotations": {"gpu-scheduler.test/rollout": str(time.time())}}}}}))
        kn.wait_for(lambda: {p["metadata"]["labels"]["serving.knative.dev/revision"]
                             for p in revision_pods(kn, "mutate") if ready(p)} - {old}, 120,
                    "a ready pod of mutate's new revision", interval=1)
        # With a gateway, the Route would move traffic to the new revision and the autoscaler
        # scale the old one down; here the Route is never programmed, so the old revision stays
        # scaled. Deleted (as Serving's revision GC does), its pods drain and stop while pods are
        # still being created.
        kn.cp.kubectl("delete", "revision", old, "-n", NS, "--wait=false")
        kn.wait_for(lambda: not [p for p in kn.pods(NS, f"serving.knative.dev/revision={old}")], 120,
                    "the old revision's pods gone", interval=1)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures[:3]
    assert len(created) > 10


def test_bind_pod_deleted_knative_brings_one_back_and_every_pending_pod_is_placed(kn):
    [pod] = revision_pods(kn, "bind")
    kn.create_namespace("outage")
    kn.cp.kubectl("delete", "pod", "-n", NS, pod["metadata"]["name"], "--wait=false")
    kn.apply(statefulset("outage", "0=node1:2\n1=node2:0\n", replicas=2))
    kn.wait_for(lambda: [p for p in revision_pods(kn, "bind") if ready(p) and p["metadata"]["uid"] != pod["metadata"]["uid"]],
                120, "a new bind pod ready", interval=1)
    pods = kn.wait_for(lambda: running(kn, "outage", 2), 120, "both replicas Running")
    assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods} == {
        "gpu-scheduler-check-0": "node1", "gpu-scheduler-check-1": "node2"}


def test_two_bind_instances_under_the_real_adapter_never_give_a_gpu_twice(kn):
    kn.helm("upgrade", "gpu-scheduler", str(knative.REPO / "chart" / "gpu-scheduler"), "--namespace", NS,
            "--reuse-values", "--set", "bind.scale.min=2")
    kn.wait_for(lambda: len([p for p in revision_pods(kn, "bind") if ready(p)]) >= 2 and not kn.knative_not_ready(),
                180, "two bind instances ready", interval=1)
    instances = [p["metadata"]["name"] for p in revision_pods(kn, "bind") if ready(p)]
    before = {name: events_counted(kn, name) for name in instances}
    kn.create_namespace("race")
    # Two single-replica StatefulSets for each of three GPUs, created together.
    contenders = {f"race-{gpu}-{side}": f"0=node3:{gpu}\n" for gpu in (3,) for side in "ab"}
    contenders |= {f"race-{node}-{side}": f"0={node}:1\n" for node in ("node2", "node4") for side in "ab"}
    for name, annotation in contenders.items():
        kn.apply(statefulset("race", annotation, replicas=1, name=name))
    kn.wait_for(lambda: len([p for p in kn.pods("race") if p["spec"].get("nodeName")]) >= 3, 120, "three bound")
    # The adapter's events, answered 2xx: one per pod, summed over the instances (its kept-alive
    # connection leads to one of them; the other places from its own watch, so both race).
    def added() -> float:
        return sum(n - before[name].get((k, s), 0) for name in instances
                   for (k, s), n in events_counted(kn, name).items() if k == ADD and s.startswith("2"))
    kn.wait_for(lambda: added() >= len(contenders), 60, "the adapter's add events answered")
    pods = kn.pods("race")
    bound = [p for p in pods if p["spec"].get("nodeName")]
    assert len(pods) == 6 and len(bound) == 3
    # Each GPU to one of its two contenders: the bound pods' maps are the three GPUs, once each.
    held = sorted(contenders[p["metadata"]["name"].rsplit("-", 1)[0]] for p in bound)
    assert held == sorted(set(contenders.values())), f"a GPU given twice: {[p['metadata']['name'] for p in bound]}"
