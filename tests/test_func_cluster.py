"""The design's own workflow on real Knative: `func deploy`, `func invoke` and `kn`
(LocalStack(knative=True, deployed_by_func=True); docs/install.md, "func").

- The chart installs everything but the two Knative Services, with functions/func-values.yaml, and
  `func deploy --build=false --push=false --image ...` (localcp/build-func.sh's func, v0.44.0) puts
  bind and mutate on Knative from functions/<name>/func.yaml; func waits for each to be Ready.
- The seed's five replicas run on their nodes with their devices, admitted by the func-deployed
  mutate (its TLS listener: webhook.path direct-service) and placed by the func-deployed bind.
- What func deploy wrote differs from what the chart renders only where func.yaml cannot say it or
  func adds its own (localcp/func.py, EXPLAINED); anything else is drift and fails here.
- `func invoke`, from a pod where bind's Route resolves, with the captured CloudEvents: a pending
  pinned pod's add event wakes bind from zero (redeployed by func at min-scale 0, the event
  source gone) and gets it bound; a ping gets the resync answer.
- kn lists the services, revisions, routes and the PingSource; the ApiServerSource is kubectl's
  (kn v0.42.0 panics on its selector: localcp/kn.py).
- Bad input: a func.yaml the chart refuses is refused before anything is deployed, naming the
  line (chart/func_yaml.py); func deploy against a cluster without Knative, and into a namespace
  without the chart's accounts: the error a user sees.
"""
from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from localcp import func, kn as kn_cli, knative, versions
from localcp.cluster import KUBERNETES_VERSION, ControlPlane
from localcp.stack import LocalStack
from tests.test_end_to_end import EXPECTED, statefulset
from tests.test_knative_cluster import (ADD, CAPTURES, NS, PING, ROUTE_URL, conditions, ready, revision_pods,
                                        total)
from tests.test_nodes import placement_from_logs, running

pytestmark = [pytest.mark.controlplane, pytest.mark.skipif(
    not versions.knative_supported(KUBERNETES_VERSION),
    reason=f"Knative v0.50.0 needs Kubernetes 1.{versions.KNATIVE_FIRST_MINOR} or newer; the stack's is {KUBERNETES_VERSION}")]
FUNCTIONS = ("bind", "mutate")


@pytest.fixture(scope="module")
def fn():
    func.ensure_built()
    kn_cli.ensure_built()
    with LocalStack(knative=True, deployed_by_func=True) as running_stack:
        yield running_stack
    assert not running_stack.nodes.leftovers(), running_stack.nodes.leftovers()


# -- func deploy ----------------------------------------------------------------------------------
def test_func_deploy_made_both_knative_services_ready_and_the_chart_made_none(fn):
    print(f"  func deploy: {', '.join(f'{n} {s:.1f} s' for n, s in fn.func_seconds.items())} (each to Ready)")
    assert set(fn.func_seconds) == set(FUNCTIONS)
    for service in fn.knative_resources("services.serving.knative.dev"):
        assert conditions(service)["Ready"]["status"] == "True", service["metadata"]["name"]
        # func's, not helm's: the release has no Knative Service of its own.
        assert service["metadata"]["labels"]["function.knative.dev/name"] == service["metadata"]["name"]
        assert "app.kubernetes.io/managed-by" not in service["metadata"]["labels"]
    assert sorted(s["metadata"]["name"] for s in fn.knative_resources("services.serving.knative.dev")) == sorted(FUNCTIONS)
    manifest = yaml.safe_load_all(fn.helm("get", "manifest", "gpu-scheduler", "--namespace", NS).stdout)
    assert not [d["metadata"]["name"] for d in manifest if d and d["apiVersion"].startswith("serving.knative.dev/")]
    # func recorded what it deployed in the copy it deployed from (never in the repository's file).
    for name in FUNCTIONS:
        recorded = (fn.cp.workdir / "func" / name / "func.yaml").read_text()
        assert re.search(r"^deploy:\n(  .*\n)*  namespace: gpu-scheduler$", recorded, re.M), recorded
        assert "deploy:" in (func.FUNCTIONS / name / "func.yaml").read_text()
        assert "  namespace:" not in (func.FUNCTIONS / name / "func.yaml").read_text()


def test_the_seed_runs_on_its_nodes_with_its_devices_through_the_func_deployed_functions(fn):
    added = total(fn, ADD)
    fn.create_namespace("seed")
    fn.apply(statefulset("seed"))
    pods = fn.wait_for(lambda: running(fn, "seed", 5), 180, "5 check pods Running")
    assert ({int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]): p["spec"]["nodeName"] for p in pods} ==
            {i: node for i, (node, _) in EXPECTED.items()})
    assert placement_from_logs(fn, "seed", pods) == EXPECTED  # CUDA_VISIBLE_DEVICES set by mutate
    # Admitted by func's mutate, on its TLS listener (one container: func names it user-container).
    [mutate] = revision_pods(fn, "mutate")
    assert [c["name"] for c in mutate["spec"]["containers"]] == ["user-container", "queue-proxy"]
    log = fn.cp.kubectl("logs", "-n", NS, mutate["metadata"]["name"], "-c", "user-container").stdout
    admitted = {json.loads(line).get("pod") for line in log.splitlines() if line.startswith("{")}
    assert {f"seed/{p['metadata']['name']}" for p in pods} <= admitted
    assert total(fn, ADD) - added >= 5  # placed from the real adapter's events, through bind's Route


@pytest.mark.parametrize("name", FUNCTIONS)
def test_what_func_deploy_wrote_differs_from_the_chart_only_where_func_yaml_cannot_say_it(fn, name):
    deployed = json.loads(fn.cp.get(f"/apis/serving.knative.dev/v1/namespaces/{NS}/services/{name}"))
    rendered = fn.chart_knative_service(name)
    found = func.differences(deployed, rendered)
    for path, ours, theirs, why in found:
        print(f"  {name}: {path}: func {json.dumps(ours)} / chart {json.dumps(theirs)}: {why or 'DRIFT'}")
    drift = [(path, ours, theirs) for path, ours, theirs, why in found if why is None]
    assert not drift, f"func.yaml and the chart drifted apart (make manifests): {drift}"
    # What matters is the same on both: image, env, probes, resources, account, scale, volumes.
    same = {path for path in ("container.image", "container.resources", "container.readinessProbe",
                              "container.livenessProbe", "container.volumeMounts", "pod.volumes",
                              "pod.serviceAccountName", "annotations.autoscaling.knative.dev/min-scale",
                              "annotations.autoscaling.knative.dev/max-scale", "container.env.DEVICE_ENV_MODE",
                              "container.securityContext.runAsNonRoot", "container.securityContext.seccompProfile")}
    assert not same & {path for path, *_ in found}


# -- func invoke ----------------------------------------------------------------------------------
def invoke(fn, *args: str) -> str:
    """func invoke, in a pod of namespace `invoke`, of bind at its Route (func describe's URL)."""
    if not fn.pods("invoke") and "invoke" not in fn.cp.kubectl("get", "namespaces", "-o", "name").stdout:
        fn.create_namespace("invoke")
    described = func.func(fn.cp, "describe", "--path", str(fn.cp.workdir / "func" / "bind"), "--output", "json")
    url = json.loads(described.stdout)["Route"]
    assert url == ROUTE_URL.format("bind")
    done = func.invoke_from_a_pod(fn.cp, "invoke", "bind", "--target", url, *args)
    assert done.returncode == 0, done.stdout
    return done.stdout


def answer(printed: str) -> dict:
    """bind's answer in what func invoke printed: the reply event's data."""
    assert "type: dev.gpu-scheduler.bind.reply" in printed, printed
    return json.loads(printed[printed.index("Data,") + len("Data,"):])


def test_func_invoke_with_the_ping_gets_the_resync_answer(fn):
    pings = total(fn, PING)
    data = (knative.REPO / "examples" / "ping.json").read_text()
    printed = invoke(fn, "--type", PING, "--source", f"/apis/v1/namespaces/{NS}/pingsources/resync",
                     "--id", "func-invoke-ping", "--data", data)
    print(f"  func invoke (ping): {printed.strip()}")
    assert answer(printed)["result"] == "resynced"
    assert total(fn, PING) > pings


def bind_pods(fn) -> list[dict]:
    """bind's revision pods, terminating ones included (one answers while queue-proxy drains)."""
    return fn.pods(NS, "serving.knative.dev/service=bind")


def test_func_invoke_of_a_pending_pinned_pods_add_event_wakes_bind_from_zero_and_gets_it_bound(fn):
    """bind watches pods itself while it runs, so an event is what wakes it at zero: bind redeployed
    by func at min-scale 0 (func.yaml edited: scale.min 0), the ApiServerSource gone
    and the resync a year away, a pinned pod stays Pending with no bind pod at all; func invoke of
    its add event (the capture's attributes, the live pod as data) through the Route wakes bind,
    which binds it. Then bind is deployed again from functions/bind/func.yaml, the source restored."""
    capture = json.loads((CAPTURES / "apiserversource-add-gpu-scheduler-check-0.json").read_text())
    original = (func.FUNCTIONS / "bind" / "func.yaml").read_text()
    # No window: func writes deploy.annotations on the Service too, where Knative refuses autoscaling
    # keys (chart/func_yaml.py refuses them): Knative's default 60 s, then its 30 s grace period.
    at_zero = original.replace("      min: 1\n", "      min: 0\n", 1)
    fn.cp.kubectl("delete", "apiserversources.sources.knative.dev", "pod-events", "-n", NS)
    fn.cp.kubectl("patch", "pingsources.sources.knative.dev", "resync", "-n", NS, "--type", "merge",
                  "-p", json.dumps({"spec": {"schedule": "0 0 1 1 *"}}))
    try:
        func.deploy(fn.cp, "bind", "kind.local/gpu-scheduler-bind:dev", func_yaml=at_zero, copy="bind-zero")
        began = time.monotonic()
        fn.wait_for(lambda: not [p for p in fn.pods(NS) if p["metadata"]["name"].startswith("apiserversource-")]
                    and not bind_pods(fn), 240, "no adapter pod and bind at zero (no pod at all)", interval=1)
        print(f"  bind at zero {time.monotonic() - began:.0f} s after func deploy at min-scale 0")
        fn.create_namespace("invoked")
        fn.apply(statefulset("invoked", "0=node2:0\n", replicas=1))  # free: the seed holds node2's GPU 2 only
        [pod] = fn.wait_for(lambda: fn.pods("invoked") or None, 60, "the replica created (admitted by mutate)")
        assert not pod["spec"].get("nodeName") and not bind_pods(fn), "nothing can place it: bind has no pod"
        printed = invoke(fn, "--type", capture["headers"]["Ce-Type"], "--source", capture["headers"]["Ce-Source"],
                         "--id", "func-invoke-add", "--data", json.dumps(pod))
        print(f"  func invoke (add, bind at zero): {printed.strip()}")
        assert answer(printed)["pod"] == f"invoked/{pod['metadata']['name']}"
        [bound] = fn.wait_bound("invoked", 1, timeout=60)
        assert bound["spec"]["nodeName"] == "node2"
    finally:
        func.deploy(fn.cp, "bind", "kind.local/gpu-scheduler-bind:dev")  # functions/bind/func.yaml again: min 1
        chart = str(knative.REPO / "chart" / "gpu-scheduler")
        fn.helm("upgrade", "gpu-scheduler", chart, "--namespace", NS, "--reuse-values")  # the source and schedule back
        fn.wait_for(lambda: not fn.knative_not_ready(), 180, "the ApiServerSource back and Ready", interval=1)


def test_func_invoke_sends_each_capture_but_its_extensions_and_bind_answers_each(fn):
    """func invoke sets id, source, type and the data (--data: --file base64-encodes a file's
    bytes, which bind refuses as JSON); the adapter's extensions (apiversion, kind, name, namespace),
    subject and time cannot be given, and bind reads none of them."""
    for path in sorted(CAPTURES.glob("apiserversource-*.json")):
        capture = json.loads(path.read_text())
        printed = invoke(fn, "--type", capture["headers"]["Ce-Type"], "--source", capture["headers"]["Ce-Source"],
                         "--id", capture["headers"]["Ce-Id"], "--data", json.dumps(capture["body"]))
        print(f"  func invoke ({path.stem}): {json.dumps(answer(printed))[:200]}")
        assert answer(printed)["result"], printed  # the capture's namespace is not here: bind says so


# -- kn -------------------------------------------------------------------------------------------
def test_kn_lists_the_services_revisions_routes_and_the_ping_source(fn):
    services = kn_cli.kn(fn.cp, "service", "list", "-n", NS).stdout
    print(services)
    for name in FUNCTIONS:
        assert re.search(rf"^{name}\s+{re.escape(ROUTE_URL.format(name))}\s+{name}-\d+\s+\S+\s+3 OK / 3\s+True", services, re.M), services
    revisions = kn_cli.kn(fn.cp, "revision", "list", "-n", NS).stdout
    assert re.search(r"^bind-\d+\s+bind\s+100%", revisions, re.M) and re.search(r"^mutate-\d+\s+mutate\s+100%", revisions, re.M), revisions
    routes = kn_cli.kn(fn.cp, "route", "list", "-n", NS).stdout
    assert all(re.search(rf"^{name}\s+{re.escape(ROUTE_URL.format(name))}\s+True", routes, re.M) for name in FUNCTIONS), routes
    pings = kn_cli.kn(fn.cp, "source", "ping", "list", "-n", NS).stdout
    assert re.search(r"^resync\s+\S+\s+.*ksvc:bind\s+.*True", pings, re.M), pings
    # kn source apiserver list panics on the chart's matchLabels selector (upstream): kubectl shows it.
    sources = fn.cp.kubectl("get", "apiserversources.sources.knative.dev", "-n", NS).stdout
    assert re.search(r"^pod-events\s+.*True", sources, re.M), sources


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, says", [
    (("      min: 1\n", "      min: 4\n"), "deploy.options.scale.min 4 is above max 3"),
    (("    value: cuda\n", "    value: gpu\n"), "DEVICE_ENV_MODE: 'gpu' is not one of cuda, nvidia, dra"),
])
def test_a_func_yaml_the_chart_refuses_is_refused_before_anything_is_deployed_naming_its_line(fn, edit, says):
    text = (func.FUNCTIONS / "bind" / "func.yaml").read_text()
    assert edit[0] in text
    edited = text.replace(edit[0], edit[1], 1)
    number = next(i for i, line in enumerate(edited.splitlines(), 1) if line == edit[1].rstrip("\n"))
    generation = json.loads(fn.cp.get(f"/apis/serving.knative.dev/v1/namespaces/{NS}/services/bind"))["metadata"]["generation"]
    with pytest.raises(func.FuncYamlRefused) as refused:
        func.deploy(fn.cp, "bind", "kind.local/gpu-scheduler-bind:dev", func_yaml=edited, copy="bind-refused")
    print(f"  refused: {refused.value}")
    assert f"func.yaml:{number}: {says}" in str(refused.value)
    after = json.loads(fn.cp.get(f"/apis/serving.knative.dev/v1/namespaces/{NS}/services/bind"))["metadata"]["generation"]
    assert after == generation, "nothing deployed"


def test_without_the_check_knative_refuses_a_max_below_min_without_a_line(fn):
    """What a user who skips chart/func_yaml.py meets: Knative's webhook refuses the update (no
    line of func.yaml), and the running revision stays."""
    edited = (func.FUNCTIONS / "bind" / "func.yaml").read_text().replace("      min: 1\n", "      min: 4\n", 1)
    directory = func.function_copy(fn.cp, "bind", edited, copy="bind-unchecked")
    done = func.func(fn.cp, "deploy", "--path", str(directory), "--build=false", "--push=false",
                     "--image", "kind.local/gpu-scheduler-bind:dev", check=False)
    said = done.stderr.strip() or done.stdout.strip()
    print(f"  func deploy says: {said}")
    assert done.returncode != 0 and "max-scale=3 is less than min-scale=4" in said


def test_func_deploy_without_the_charts_namespace_and_rbac_names_the_missing_account(fn):
    """func.yaml's namespace without the chart's install (its accounts): func names the account
    and deploys nothing; docs/install.md's fix: install the chart there first."""
    edited = (func.FUNCTIONS / "bind" / "func.yaml").read_text().replace("namespace: gpu-scheduler", "namespace: nowhere")
    done = func.func(fn.cp, "deploy", "--path", str(func.function_copy(fn.cp, "bind", edited, copy="bind-nowhere")), "--build=false",
                     "--push=false", "--image", "kind.local/gpu-scheduler-bind:dev", check=False)
    said = done.stderr.strip() or done.stdout.strip()
    print(f"  func deploy says: {said}")
    assert done.returncode != 0 and 'referenced ServiceAccount "bind" is not present in namespace "nowhere"' in said


def test_func_deploy_against_a_cluster_without_knative_says_so(fn, tmp_path):
    with ControlPlane() as bare:  # an API server with no Knative
        edited = (func.FUNCTIONS / "bind" / "func.yaml").read_text()
        done = func.func(fn.cp, "deploy", "--path", str(func.function_copy(fn.cp, "bind", edited, copy="bind-bare")), "--build=false",
                         "--push=false", "--image", "kind.local/gpu-scheduler-bind:dev", check=False,
                         kubeconfig=bare.kubeconfig)
    said = done.stderr.strip() or done.stdout.strip()
    print(f"  func deploy says: {said}")
    assert done.returncode != 0 and "no or newer Knative Serving API found" in said
