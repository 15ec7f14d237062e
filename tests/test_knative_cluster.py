"""The project on real Knative: Eventing and Serving (localcp/versions.env) installed on the four
real nodes from their own release configuration (localcp/knative.py), the chart installed on
them with runtime knative as a user installs it (LocalStack(knative=True), localcp/knative-values.yaml).

- Knative's components run as pods on the nodes; bind and mutate are Knative Services whose
  Configuration, Revision, PodAutoscaler, ServerlessService and Route are Ready, their revision
  pods run the real queue-proxy; Traefik's Knative provider (localcp/traefik.py) is the
  networking layer that makes the Routes Ready.
- The sources' sinks are bind's Route (sink.path knative-route, the chart's default); the
  captured events posted to it from a pod get bind's own answers; sink.path direct-service
  still delivers.
- bind at min-scale 0: it goes to zero; a pod, a burst of 100 and a gang created at zero are
  bound; a GPU freed while it sleeps wakes it; an event the adapter could not deliver is
  recovered by the next resync.
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
from datetime import datetime

import pytest

from bench import scale
from kubeapi.client import Kube
from kubeapi.kubeconfig import from_kubeconfig
from localcp import adapter, images, knative, traefik, versions
from localcp.cluster import KUBERNETES_VERSION, NODES
from localcp.stack import LocalStack
from tests.test_end_to_end import EXPECTED, statefulset
from tests.test_gang_cluster import gang_statefulset
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


def test_each_annotated_pod_is_admitted_by_mutates_revision_and_placed_by_bind_from_the_adapters_events(kn):
    added = total(kn, ADD)
    kn.create_namespace("seed")
    kn.apply(statefulset("seed"))
    pods = kn.wait_for(lambda: running(kn, "seed", 5), 180, "5 check pods Running")
    assert ({int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]): p["spec"]["nodeName"] for p in pods} ==
            {i: node for i, (node, _) in EXPECTED.items()})
    assert placement_from_logs(kn, "seed", pods) == EXPECTED  # CUDA_VISIBLE_DEVICES set by mutate
    # Admitted by mutate's revision pod (its log: the API server called its TLS listener).
    [mutate] = revision_pods(kn, "mutate")
    log = kn.cp.kubectl("logs", "-n", NS, mutate["metadata"]["name"], "-c", "mutate").stdout
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
        # The Route moves traffic to the new revision (Traefik's KIngress), but the API server
        # calls mutate's pods through the chart's ClusterIP Service (webhook.path direct-service),
        # which selects both revisions. The old one deleted (as Serving's revision GC does), its
        # pods drain and stop while pods are still being created.
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


# -- the front door: Traefik's Knative provider ---------------------------------------------------
ROUTE_URL = "http://{}.gpu-scheduler.svc.cluster.local"
EXAMPLES = knative.REPO / "examples"
CAPTURES = knative.REPO / "tests" / "fixtures" / "sample-events" / "knative-v0.50.0"


def test_traefik_runs_as_knatives_networking_layer_with_its_own_image_and_exact_grant(kn):
    [pod] = kn.pods(traefik.NAMESPACE)
    assert ready(pod) and pod["spec"]["nodeName"] in NODES
    assert pod["spec"]["containers"][0]["image"] == traefik.image_name()
    network = json.loads(kn.cp.get("/api/v1/namespaces/knative-serving/configmaps/config-network"))["data"]
    assert network["ingress-class"] == traefik.INGRESS_CLASS
    # What the provider reads and writes (pkg/provider/kubernetes/knative/client.go), and nothing more.
    account = "system:serviceaccount:traefik:traefik"
    kingress = "ingresses.networking.internal.knative.dev"

    def can(verb: str, resource: str, *more: str) -> str:
        return kn.cp.kubectl("auth", "can-i", verb, resource, *more, "-A", "--as", account, check=False).stdout.strip()
    assert [can("list", "services"), can("watch", "secrets"), can("watch", kingress),
            can("update", kingress, "--subresource=status")] == ["yes"] * 4
    assert [can("create", "services"), can("delete", kingress), can("list", "pods"), can("update", kingress)] == ["no"] * 4


@pytest.mark.parametrize("service", ["bind", "mutate"])
def test_the_routes_and_their_kingresses_are_ready_through_traefik(kn, service):
    [route] = [r for r in kn.knative_resources("routes.serving.knative.dev") if r["metadata"]["name"] == service]
    assert conditions(route)["Ready"]["status"] == "True", conditions(route)
    assert route["status"]["url"] == ROUTE_URL.format(service)  # cluster-local: the chart's visibility label
    [ingress] = [i for i in kn.knative_resources("ingresses.networking.internal.knative.dev")
                 if i["metadata"]["name"] == service]
    assert ingress["metadata"]["annotations"]["networking.knative.dev/ingress.class"] == traefik.INGRESS_CLASS
    assert conditions(ingress)["Ready"]["status"] == "True"
    [private] = ingress["status"]["privateLoadBalancer"]["ingress"]
    assert private["domainInternal"] == "privtraefik.traefik.svc.cluster.local"


def test_the_sources_sinks_are_binds_route(kn):
    for resource in ("apiserversources.sources.knative.dev", "pingsources.sources.knative.dev"):
        [source] = kn.knative_resources(resource)
        assert source["spec"]["sink"]["ref"]["kind"] == "Service" and \
            source["spec"]["sink"]["ref"]["apiVersion"] == "serving.knative.dev/v1"
        assert source["status"]["sinkUri"] == ROUTE_URL.format("bind"), source["status"]
    assert not kn.sink_service_exists()


def post_from_a_pod(kn, namespace: str, url: str, requests: list[tuple[dict, bytes]]) -> list[tuple[int, dict]]:
    """Each (headers, body) POSTed to `url` from a pod on node1 (the check image's python): through
    cluster DNS, the Route's ExternalName Service, Traefik and on. The answers, in order."""
    name = "poster"
    if not [p for p in kn.pods(namespace) if p["metadata"]["name"] == name]:
        kn.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                  "spec": {"nodeName": "node1", "terminationGracePeriodSeconds": 1,
                           "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True},
                           "containers": [{"name": "c", "image": images.image_name_in_manifest(),
                                           "imagePullPolicy": "Never", "command": ["python", "-c", "import time; time.sleep(10**6)"],
                                           "securityContext": {"allowPrivilegeEscalation": False,
                                                               "capabilities": {"drop": ["ALL"]}}}]}})
        kn.wait_for(lambda: running(kn, namespace, 1), 60, "the poster pod Running")
    script = ("import json, sys, urllib.request, urllib.error\n"
              "for headers, body in json.load(sys.stdin):\n"
              "    request = urllib.request.Request(sys.argv[1], data=body.encode(), headers=headers, method='POST')\n"
              "    try:\n"
              "        with urllib.request.urlopen(request, timeout=60) as r: status, text = r.status, r.read()\n"
              "    except urllib.error.HTTPError as e: status, text = e.code, e.read()\n"
              "    print(json.dumps([status, text.decode()]), flush=True)\n")
    done = kn.cp.kubectl("exec", "-i", "-n", namespace, name, "--", "python", "-c", script, url,
                         input=json.dumps([[h, b.decode()] for h, b in requests]), check=False)
    assert done.returncode == 0, done.stderr
    answers = []
    for line in done.stdout.splitlines():
        status, text = json.loads(line)
        answers.append((status, json.loads(text) if text.startswith("{") else {"text": text}))
    return answers


def captured_requests() -> dict[str, tuple[dict, bytes]]:
    """The real adapter's captures (as it sent them, less Host and Content-Length) and the ping
    example (the shipped PingSource's, as docs/try-it.md sends it)."""
    requests = {}
    for path in sorted(CAPTURES.glob("apiserversource-*.json")):
        capture = json.loads(path.read_text())
        requests[path.stem] = (capture["headers"], json.dumps(capture["body"]).encode())
    headers = dict(line.split(": ", 1) for line in (EXAMPLES / "ping.headers").read_text().splitlines())
    requests["ping"] = (headers, (EXAMPLES / "ping.json").read_bytes())
    return requests


def test_the_captured_events_posted_to_binds_route_from_a_pod_get_binds_own_answers(kn):
    """The design's HTTP test invocation with sample CloudEvents, through Knative's front door:
    each answer through the Route is the answer bind's own container gives the same request
    (posted to its pod's address, past Traefik, the activator and queue-proxy)."""
    kn.create_namespace("frontdoor")
    requests = captured_requests()
    through_route = post_from_a_pod(kn, "frontdoor", ROUTE_URL.format("bind"), list(requests.values()))
    [pod, *_] = [p for p in revision_pods(kn, "bind") if ready(p)]
    direct = post_from_a_pod(kn, "frontdoor", f"http://{pod['status']['podIP']}:8080", list(requests.values()))
    answers = dict(zip(requests, through_route))
    for name, (status, answer) in answers.items():
        print(f"  through the Route: {name}: {status} {json.dumps(answer)[:160]}")
    assert all(status == 200 for status, _ in through_route), answers
    assert [(s, a.get("result")) for s, a in through_route] == [(s, a.get("result")) for s, a in direct]
    assert answers["ping"][1]["result"] == "resynced"
    # The captures' pods lived in namespace `capture`, which this cluster does not have: bind says
    # so, and does not file it as a pod that is gone.
    for name, (_, answer) in answers.items():
        if name != "ping":
            assert answer["result"], (name, answer)


def test_sink_path_direct_service_still_delivers_for_clusters_without_a_networking_layer(kn):
    """The chart's other sink path: the sources' sinks are the ClusterIP Service on bind's revision
    pods, and a pod created then is placed from its event; then back to the Route."""
    chart = str(knative.REPO / "chart" / "gpu-scheduler")
    kn.helm("upgrade", "gpu-scheduler", chart, "--namespace", NS, "--reuse-values", "--set", "sink.path=direct-service")
    try:
        kn.wait_for(lambda: all(s["status"].get("sinkUri") == f"http://bind-events.{NS}.svc.cluster.local"
                                for r in ("apiserversources.sources.knative.dev", "pingsources.sources.knative.dev")
                                for s in kn.knative_resources(r)), 120, "both sinks on bind-events", interval=1)
        kn.wait_for(lambda: kn.ready_endpoints("bind-events"), 60, "bind-events with a ready endpoint", interval=1)
        added = total(kn, ADD)
        kn.create_namespace("direct")
        kn.apply(statefulset("direct", "0=node4:0\n", replicas=1))
        [pod] = kn.wait_bound("direct", 1, timeout=120)
        assert pod["spec"]["nodeName"] == "node4"
        kn.wait_for(lambda: total(kn, ADD) > added, 60, "its add event answered through bind-events")
    finally:
        kn.helm("upgrade", "gpu-scheduler", chart, "--namespace", NS, "--reuse-values", "--set", "sink.path=knative-route")
    kn.wait_for(lambda: all(s["status"].get("sinkUri") == ROUTE_URL.format("bind")
                            for r in ("apiserversources.sources.knative.dev", "pingsources.sources.knative.dev")
                            for s in kn.knative_resources(r)), 120, "both sinks back on the Route", interval=1)


def test_each_namespace_created_rolls_the_adapter_deployment_as_eventing_writes_it(kn):
    """The adapter's churn explained: Eventing v0.50.0's reconciler writes every namespace the
    source's selector matches (namespaceSelector {}: all) into the adapter's K_SOURCE_CONFIG
    (pkg/reconciler/apiserversource/apiserversource.go, resources/receive_adapter.go), so each
    namespace created changes its pod template: a new ReplicaSet. Eventing's, not ours; the
    adapter still runs one cluster-wide watch, and the resync covers what a rollout drops."""
    def adapter() -> dict:
        [deployment] = [d for d in kn.knative_resources("deployments") if d["metadata"]["name"].startswith("apiserversource-")]
        return deployment

    def listed(deployment: dict) -> list[str]:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return json.loads(env["K_SOURCE_CONFIG"])["namespaces"]
    before = adapter()
    kn.create_namespace("churn")
    # Wait on the state that says it, not on any new generation: the reconciler may still be writing
    # the namespace an earlier case created when this one begins (CI saw a bump without `churn`).
    after = kn.wait_for(lambda: "churn" in listed(d := adapter()) and d, 60, "`churn` in the adapter's Deployment")
    assert "churn" not in listed(before)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert json.loads([e for e in after["spec"]["template"]["spec"]["containers"][0]["env"]
                       if e["name"] == "K_SOURCE_CONFIG"][0]["value"])["allNamespaces"] is True


# -- bind at zero (bind.scale.min 0) --------------------------------------------------------------
# Each case begins with no bind pod at all, terminating ones included (a terminating revision pod
# keeps answering while queue-proxy drains). The resync is set to once a year here so that no ping
# wakes bind at a moment a case does not choose; the lost-event case sets it to every minute.
YEARLY = "0 0 1 1 *"


def bind_pods(stack) -> list[dict]:
    return stack.pods(NS, "serving.knative.dev/service=bind")


def wait_at_zero(stack, timeout: float = 300) -> float:
    """No bind pod at all; the seconds that took."""
    began = time.monotonic()
    stack.wait_for(lambda: not bind_pods(stack), timeout, "bind at zero (no pod, terminating ones included)", interval=1)
    return time.monotonic() - began


def bound_at(stack, namespace: str, name: str) -> float:
    """When the pod's PodScheduled condition turned True (the Binding), as a Unix time."""
    pod = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00")).timestamp()


def created_at(pod: dict) -> float:
    return datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()


def on_nodes_without_kubelets(manifest: dict) -> dict:
    """The StatefulSet's pods tolerate the taint of the nodes without kubelets (only ours go there)."""
    manifest["spec"]["template"]["spec"].setdefault("tolerations", []).append(scale.NO_KUBELET_TOLERATION)
    return manifest


@pytest.fixture(scope="module")
def zero(kn):
    """bind at min-scale 0 with a 6 s window (Knative's least) and the resync yearly; 120 nodes
    without kubelets, kept Ready by their Leases and tainted so that only the pods meant for them
    go there (bench/scale.py), for pods that need not run."""
    kn.helm("upgrade", "gpu-scheduler", str(knative.REPO / "chart" / "gpu-scheduler"), "--namespace", NS,
            "--reuse-values", "--set", "bind.scale.min=0", "--set", "bind.scale.window=6s",
            "--set", f"resync.schedule={YEARLY}")
    kn.wait_for(lambda: not kn.knative_not_ready(), 180, "the release ready at min-scale 0", interval=1)
    api = Kube(from_kubeconfig(str(kn.cp.kubeconfig)))
    leases = scale.add_nodes(kn, api, [f"zero-{i:03d}" for i in range(120)], taint=scale.NO_KUBELET_TAINT)
    kn.create_namespace("zero")
    yield
    leases.stop()


def test_bind_at_min_scale_0_goes_to_zero_when_idle_and_its_route_stays_ready(kn, zero):
    seconds = wait_at_zero(kn)
    print(f"bind at zero {seconds:.0f} s after the release was ready at min-scale 0 (window 6 s, then"
          " Knative's scale-to-zero grace period and queue-proxy's drain)")
    [configuration] = [c for c in kn.knative_resources("configurations.serving.knative.dev")
                       if c["metadata"]["name"] == "bind"]
    [autoscaler] = [p for p in kn.knative_resources("podautoscalers.autoscaling.internal.knative.dev")
                    if p["metadata"]["name"] == configuration["status"]["latestReadyRevisionName"]]
    # Knative's way of saying "at zero": desired and actual scale 0, Ready False for NoTraffic.
    assert (autoscaler["status"].get("desiredScale"), autoscaler["status"].get("actualScale", 0)) == (0, 0)
    assert conditions(autoscaler)["Ready"]["reason"] == "NoTraffic"
    assert not kn.knative_not_ready()  # the Routes and KIngresses Ready: the front door stays open


def test_at_zero_a_pod_a_burst_of_100_and_a_gang_created_during_the_cold_start_are_all_bound(kn, zero):
    """One pinned pod created at zero wakes bind (its add event, held by the activator while bind
    starts); a 100-replica StatefulSet and a 4-member gang created right after it, while bind is
    still starting, are bound in full: nothing sent during the cold start is lost."""
    wait_at_zero(kn)
    kn.apply(on_nodes_without_kubelets(statefulset("zero", "0=zero-100:0\n", replicas=1, name="first")))
    burst = statefulset("zero", "".join(f"{i}=zero-{i:03d}:0\n" for i in range(100)), replicas=100, name="burst")
    burst["spec"]["podManagementPolicy"] = "Parallel"
    kn.apply(on_nodes_without_kubelets(burst))
    kn.apply(on_nodes_without_kubelets(gang_statefulset("zero", "gang", [f"zero-{101 + i}:0" for i in range(4)])))
    [first] = kn.wait_bound("zero", 1, "app=first", timeout=120)
    assert first["spec"]["nodeName"] == "zero-100"
    waited = bound_at(kn, "zero", first["metadata"]["name"]) - created_at(first)
    print(f"first pod created at zero bound {waited:.2f} s after its creation")
    pods = kn.wait_bound("zero", 100, "app=burst", timeout=240)
    assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods} == {
        f"burst-{i}": f"zero-{i:03d}" for i in range(100)}
    gang = kn.wait_bound("zero", 4, "app=gang", timeout=120)
    assert sorted(p["spec"]["nodeName"] for p in gang) == [f"zero-{101 + i}" for i in range(4)]


def test_a_pod_whose_gpu_is_freed_while_bind_sleeps_is_bound_when_the_holder_is_deleted(kn, zero):
    """The holder's deletion is a pod event of ours: it wakes bind, whose fresh start frees the
    deleted holder's device record and places the waiting pod."""
    kn.apply(on_nodes_without_kubelets(statefulset("zero", "0=zero-110:1\n", replicas=1, name="holder")))
    kn.wait_bound("zero", 1, "app=holder", timeout=120)
    kn.apply(on_nodes_without_kubelets(statefulset("zero", "0=zero-110:1\n", replicas=1, name="waiter")))

    def refused() -> bool:
        events = json.loads(kn.cp.get("/api/v1/namespaces/zero/events?fieldSelector=involvedObject.name=waiter-0"))["items"]
        return any(e["reason"] == "FailedScheduling" for e in events)
    kn.wait_for(refused, 120, "the waiter refused (its GPU held)", interval=1)
    wait_at_zero(kn)
    assert not kn.pods("zero", "app=waiter")[0]["spec"].get("nodeName")
    kn.cp.kubectl("scale", "statefulset", "holder", "-n", "zero", "--replicas=0")
    # No kubelet on zero-110 to confirm the deletion: removed as a node's kubelet would.
    kn.cp.kubectl("delete", "pod", "holder-0", "-n", "zero", "--grace-period=0", "--force", check=False)
    [waiter] = kn.wait_bound("zero", 1, "app=waiter", timeout=120)
    assert waiter["spec"]["nodeName"] == "zero-110"


def test_an_event_the_adapter_could_not_deliver_is_recovered_by_the_next_resync(kn, zero):
    """The front door down (Traefik scaled to 0) while a pod is created at zero: the adapter's
    event finds no one (it retries, then drops it), and nothing wakes bind. With the front door
    back, the pod waits for the next resync ping, which wakes bind; bind's start lists every
    pending pod of ours and places it. The bound on such a wait: one resync period plus a cold
    start (docs/install.md, "bind at zero")."""
    wait_at_zero(kn)
    kn.cp.kubectl("scale", "deployment", "traefik", "-n", traefik.NAMESPACE, "--replicas=0")
    chart = str(knative.REPO / "chart" / "gpu-scheduler")
    try:
        kn.wait_for(lambda: not kn.pods(traefik.NAMESPACE), 120, "Traefik gone", interval=1)
        kn.apply(on_nodes_without_kubelets(statefulset("zero", "0=zero-111:2\n", replicas=1, name="lost")))
        [adapter] = [p for p in kn.pods(NS) if p["metadata"]["name"].startswith("apiserversource-") and ready(p)]

        def dropped() -> bool:
            log = kn.cp.kubectl("logs", "-n", NS, adapter["metadata"]["name"], "--since=5m", check=False).stdout
            return any("lost-0" in line and ("failed" in line.lower() or "error" in line.lower())
                       for line in log.splitlines())
        kn.wait_for(dropped, 60, "the adapter's delivery of lost-0's event failed", interval=1)
    finally:
        kn.cp.kubectl("scale", "deployment", "traefik", "-n", traefik.NAMESPACE, "--replicas=1")
    kn.cp.kubectl("rollout", "status", "deployment/traefik", "-n", traefik.NAMESPACE, "--timeout=120s")
    assert not bind_pods(kn), "something woke bind: the case needs it asleep"
    assert not kn.pods("zero", "app=lost")[0]["spec"].get("nodeName")
    kn.helm("upgrade", "gpu-scheduler", chart, "--namespace", NS, "--reuse-values", "--set", "resync.schedule=* * * * *")
    try:
        [pod] = kn.wait_bound("zero", 1, "app=lost", timeout=150)
        assert pod["spec"]["nodeName"] == "zero-111"
        # The PingSource fires at second 0 of each minute (UTC); seen bound this long after it.
        print(f"lost event recovered: the pod bound {time.time() % 60:.1f} s after the minute's ping woke bind")
    finally:
        kn.helm("upgrade", "gpu-scheduler", chart, "--namespace", NS, "--reuse-values", "--set", f"resync.schedule={YEARLY}")
