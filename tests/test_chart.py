"""The Helm chart (chart/gpu-scheduler): `helm lint`, `helm template` with each values file of
chart/gpu-scheduler/ci/, every rendered object against its schema offline and accepted by the
real 1.34 API server holding the real Knative and cert-manager CRDs, RBAC equal to
gpu_scheduler.permissions, the values reaching the objects, the two webhook paths, and the files
rendered from the chart (knative/*.yaml, functions/*/func.yaml) not drifting from it.

helm is the one localcp/build-helm.sh builds (`make controlplane`); without it these are skipped.
"""
from __future__ import annotations

import base64
import http.client
import importlib.util
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import tomllib
import uuid

import pytest
import yaml

from gpu_scheduler import permissions
from localcp import pki
from localcp.cluster import free_port
from schemas import REPO, SCHEMAS, load_documents, manifest_errors
from test_manifests import account_grants

CHART = REPO / "chart" / "gpu-scheduler"
CI_VALUES = {path.name.removesuffix("-values.yaml"): path for path in sorted((CHART / "ci").glob("*-values.yaml"))}
_spec = importlib.util.spec_from_file_location("chart_manifests", REPO / "chart" / "manifests.py")
manifests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manifests)
# queue-proxy's ports (knative.dev/serving/pkg/networking) and the user container's 8080.
KNATIVE_PORTS = {8012, 8013, 8022, 8080, 8112, 9090, 9091}


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        return manifests.helm()
    except SystemExit as missing:
        pytest.skip(str(missing))


def template(helm, *args: str, namespace: str = manifests.NAMESPACE) -> list[dict]:
    """The objects `helm template` renders (helm fixture: the binary is there)."""
    return [doc for doc in yaml.safe_load_all(manifests.template(*args, namespace=namespace)) if doc]


def render(helm, values: str) -> list[dict]:
    return template(helm, "-f", str(CI_VALUES[values]))


def find(docs: list[dict], kind: str, name: str) -> dict:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def values_of(name: str) -> dict:
    return yaml.safe_load(CI_VALUES[name].read_text())


def install_namespace(docs: list[dict]) -> str:
    return find(docs, "Service", "bind")["metadata"]["namespace"]


def containers(docs: list[dict], ksvc: str) -> dict[str, dict]:
    return {c["name"]: c for c in find(docs, "Service", ksvc)["spec"]["template"]["spec"]["containers"]}


def test_the_values_files_cover_the_cases():
    assert set(CI_VALUES) == {"default", "nvidia", "direct-service", "custom"}


# -- helm lint and the schema ----------------------------------------------------------------
@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_lint(helm, values):
    result = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(CI_VALUES[values])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def helm_error(helm, *args: str) -> str:
    with pytest.raises(RuntimeError) as error:
        manifests.template(*args)
    return str(error.value)


@pytest.mark.parametrize("given, missing", [("bind", "mutate"), ("mutate", "bind")])
def test_images_are_required(helm, given, missing):
    error = helm_error(helm, "--set", f"{given}.image.repository=registry.example.com/{given}")
    assert f"{missing}.image.repository: the image built from Dockerfile.{missing}" in error


@pytest.mark.parametrize("setting, why", [
    ("deviceEnvMode=DRA", "deviceEnvMode"),
    ("dra.deviceRules=gpu-{index}", "deviceRules"),  # JSON, an object
    ("dra.deviceClass=Not_A_Class", "deviceClass"),
    ("deviceEnvMode=CUDA", "deviceEnvMode"),
    ("mutate.scale.min=0", "min"),
    ("webhook.path=ingress", "path"),
    ("webhook.failurePolicy=Sometimes", "failurePolicy"),
    ("webhook.timeoutSeconds=31", "timeoutSeconds"),
    ("resync.schedule=every minute", "schedule"),
    ("logLevel=verbose", "logLevel"),
    ("bnd.threads=4", "bnd"),
    ("webhook.directService.targetPort=8112", "targetPort"),
    ("namespace.name=Not_A_Name", "name"),
    # the pods' knobs: a misspelled one, or a misspelled field inside one, is refused, not ignored
    ("bind.nodeSelectr.pool=system", "nodeSelectr"),
    ("mutate.imagePullSecret[0].name=regcred", "imagePullSecret"),
    ("bind.imagePullSecrets[0]=regcred", "imagePullSecrets"),  # [{name: regcred}]
    ("mutate.tolerations[0].efect=NoSchedule", "efect"),
    ("bind.tolerations[0].operator=Equals", "operator"),
    ("bind.affinity.nodeAfinity.x=y", "nodeAfinity"),
    ("mutate.affinity.nodeAffinity.requiredDuringScheduling.x=y", "requiredDuringScheduling"),
    ("bind.priorityClassName=High_Priority", "priorityClassName"),
    ("mutate.podAnnotation.a=b", "podAnnotation"),
    ("bind.resources.limit.memory=1Gi", "limit"),
])
def test_schema_refuses(helm, setting, why):
    error = helm_error(helm, "-f", str(CI_VALUES["default"]), "--set", setting)
    assert "values don't meet the specifications of the schema" in error and why in error, error


def test_scale_bounds_in_order(helm):
    error = helm_error(helm, "-f", str(CI_VALUES["default"]), "--set", "bind.scale.min=4")
    assert "bind.scale: min 4 is above max 3" in error


# -- every rendered object, offline ----------------------------------------------------------
@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_rendered_objects_validate(helm, values):
    """Core kinds strictly for 1.34, custom resources against their CRDs with unknown fields as
    errors, also where the CRD preserves them."""
    for doc in render(helm, values):
        errors = manifest_errors(doc, strict_preserved=True)
        assert not errors, f"{values}: {doc['kind']} {doc['metadata']['name']}:\n" + "\n".join(errors)


@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_rbac_is_permissions(helm, values):
    docs = render(helm, values)
    namespace = install_namespace(docs)
    quota = values_of(values).get("quota", {}).get("enabled", True)
    bind = permissions.BIND if quota else permissions.BIND - permissions.BIND_QUOTA
    assert account_grants("bind", docs, namespace) == {"cluster": bind, namespace: permissions.BIND_RECORDS}
    assert account_grants("pod-events", docs, namespace) == {"cluster": permissions.EVENT_SOURCE}
    assert account_grants("mutate", docs, namespace) == ({"cluster": permissions.MUTATE} if quota else {})
    assert find(docs, "ServiceAccount", "mutate").get("automountServiceAccountToken", True) is quota, (
        "mutate's pods get a token only when they make API calls")
    for ksvc, account in (("bind", "bind"), ("mutate", "mutate")):
        assert find(docs, "Service", ksvc)["spec"]["template"]["spec"]["serviceAccountName"] == account
    assert find(docs, "ApiServerSource", "pod-events")["spec"]["serviceAccountName"] == "pod-events"
    for doc in docs:
        if doc["kind"] in ("Role", "RoleBinding") or "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == namespace, "everything namespaced is in one namespace"


# -- values reach the objects ----------------------------------------------------------------
def env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_custom_values_reach_the_objects(helm):
    docs, values = render(helm, "custom"), values_of("custom")
    namespace = values["namespace"]["name"]
    assert find(docs, "Namespace", namespace)
    assert {doc["metadata"]["namespace"] for doc in docs if "namespace" in doc["metadata"]} == {namespace}
    for name in ("bind", "mutate"):
        service, image = find(docs, "Service", name), values[name]["image"]
        container = containers(docs, name)[name]
        assert container["image"] == f"{image['repository']}:{image['tag']}"
        annotations = service["spec"]["template"]["metadata"]["annotations"]
        assert (annotations["autoscaling.knative.dev/min-scale"], annotations["autoscaling.knative.dev/max-scale"]) == (
            str(values[name]["scale"]["min"]), str(values[name]["scale"]["max"]))
        assert env(container)["LOG_LEVEL"] == "DEBUG"
        assert env(container)["THREADS"] == str(values[name]["threads"])
    assert containers(docs, "bind")["bind"]["resources"] == values["bind"]["resources"]
    assert containers(docs, "bind")["bind"]["imagePullPolicy"] == "Always"
    assert env(containers(docs, "bind")["bind"])["SINK_AUDIENCE"] == "gpu-scheduler-bind"
    assert env(containers(docs, "bind")["bind"])["RESYNC_CONCURRENCY"] == "4"
    assert env(containers(docs, "mutate")["mutate"])["DEVICE_ENV_MODE"] == "dra"
    bind_env = env(containers(docs, "bind")["bind"])
    assert (bind_env["GPU_SCHEDULER_DRA"], bind_env["GPU_SCHEDULER_DRA_DEVICE_CLASS"]) == ("true", "gpu.example.com")
    assert json.loads(bind_env["GPU_SCHEDULER_DRA_DEVICE_RULES"]) == json.loads(values["dra"]["deviceRules"])
    assert find(docs, "Service", "bind")["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/image-id"]
    ping = find(docs, "PingSource", "resync")["spec"]
    assert (ping["schedule"], ping["timezone"]) == ("*/5 * * * *", "Europe/Berlin")
    for kind, name in (("ApiServerSource", "pod-events"), ("PingSource", "resync")):
        sink = find(docs, kind, name)["spec"]["sink"]
        assert sink["CACerts"].strip() == values["sink"]["caCerts"].strip()
        assert sink["ref"] == {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "bind", "namespace": namespace}
    [webhook] = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"]
    assert (webhook["failurePolicy"], webhook["timeoutSeconds"]) == ("Ignore", 3)
    [expression] = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["values"] == [*values["webhook"]["excludedNamespaces"], namespace]
    certificate = find(docs, "Certificate", "gpu-mutate")
    assert certificate["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corporate-ca"}
    assert not [doc for doc in docs if doc["kind"] == "Issuer"], "a given issuer: no CA of our own"


# The knobs of each function's pods: in its Knative Service's revision template, and nowhere else.
POD_KNOBS = {
    "imagePullSecrets": [{"name": "team-registry"}],
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"node.example.com/pool": "system"},
    "tolerations": [{"key": "node.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node.example.com/pool", "operator": "In", "values": ["system"]}]}]}}},
}
FUNCTIONS = ("bind", "mutate")


def revision(docs: list[dict], ksvc: str) -> dict:
    """The revision template of Knative Service `ksvc`: its pods' metadata and spec."""
    return find(docs, "Service", ksvc)["spec"]["template"]


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("knob", sorted(POD_KNOBS))
def test_each_pod_knob_reaches_its_functions_pods_only(helm, function, knob):
    """`<function>.<knob>` set alone: the function's revision template has it as given, the other
    function's has nothing of it."""
    docs = template(helm, "-f", str(CI_VALUES["default"]), "--set-json", f"{function}.{knob}={json.dumps(POD_KNOBS[knob])}")
    [other] = set(FUNCTIONS) - {function}
    assert revision(docs, function)["spec"][knob] == POD_KNOBS[knob]
    assert knob not in revision(docs, other)["spec"]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_pod_annotations_and_resources_reach_every_container_of_the_function(helm, function):
    resources = {"requests": {"cpu": "200m", "memory": "100Mi"}, "limits": {"memory": "1Gi"}}
    docs = template(helm, "-f", str(CI_VALUES["direct-service"]), "--set-json", f"{function}.resources={json.dumps(resources)}",
                    "--set", f"{function}.podAnnotations.example\\.com/team=gpu")
    [other] = set(FUNCTIONS) - {function}
    assert revision(docs, function)["metadata"]["annotations"]["example.com/team"] == "gpu"
    assert "example.com/team" not in revision(docs, other)["metadata"]["annotations"]
    assert [c["resources"] for c in containers(docs, function).values()] == [resources] * len(containers(docs, function))
    assert resources not in [c["resources"] for c in containers(docs, other).values()]


@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_pod_knobs_render_exactly_what_is_set(helm, values):
    """Each values file's knobs, as given, where it sets them; nothing where it does not (the
    defaults are empty): a revision template holds no key the values did not ask for."""
    docs, settings = render(helm, values), values_of(values)
    for function in FUNCTIONS:
        given = settings.get(function, {})
        spec = revision(docs, function)["spec"]
        assert {knob: spec[knob] for knob in POD_KNOBS if knob in spec} == {
            knob: given[knob] for knob in POD_KNOBS if knob in given}, function
        assert set(spec) - set(POD_KNOBS) <= {"serviceAccountName", "containers", "volumes"}, function
        annotations = revision(docs, function)["metadata"]["annotations"]
        assert {k: v for k, v in annotations.items() if not k.startswith("autoscaling.knative.dev/")} == (
            given.get("podAnnotations") or {}), function
    assert any(knob in settings.get(f, {}) for f in FUNCTIONS for knob in POD_KNOBS) == (values == "custom"), (
        "custom-values.yaml sets the knobs (linted and dry-run on the API server); the others leave the defaults")


@pytest.mark.parametrize("values, quota", [("default", "true"), ("nvidia", "false")])
def test_quota_setting_reaches_mutate_and_bind(helm, values, quota):
    docs = render(helm, values)
    assert env(containers(docs, "bind")["bind"])["GPU_SCHEDULER_QUOTA"] == quota
    for container in containers(docs, "mutate").values():
        assert env(container)["GPU_SCHEDULER_QUOTA"] == quota


@pytest.mark.parametrize("values, mode", [("default", "cuda"), ("nvidia", "nvidia")])
def test_device_env_mode(helm, values, mode):
    for container in containers(render(helm, values), "mutate").values():
        assert env(container)["DEVICE_ENV_MODE"] == mode


def test_defaults(helm):
    docs = render(helm, "default")
    assert install_namespace(docs) == manifests.NAMESPACE, "the release's namespace (helm --namespace)"
    assert not [doc for doc in docs if doc["kind"] == "Namespace"]
    assert containers(docs, "bind")["bind"]["image"] == f"registry.example.com/gpu-scheduler/bind:{VERSION}", "the appVersion"
    assert find(docs, "PingSource", "resync")["spec"]["schedule"] == "* * * * *"
    assert "CACerts" not in find(docs, "PingSource", "resync")["spec"]["sink"]
    bind_env = env(containers(docs, "bind")["bind"])
    assert (bind_env["GPU_SCHEDULER_DRA"], bind_env["GPU_SCHEDULER_DRA_DEVICE_CLASS"]) == ("true", "gpu.nvidia.com")
    assert "GPU_SCHEDULER_DRA_DEVICE_RULES" not in bind_env, "bind's defaults"
    [webhook] = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"]
    assert webhook["failurePolicy"] == "Fail"


# -- the two webhook paths -------------------------------------------------------------------
def test_knative_route_path(helm):
    docs = render(helm, "default")
    configuration = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")
    [webhook] = configuration["webhooks"]
    assert webhook["clientConfig"] == {"service": {"namespace": manifests.NAMESPACE, "name": "mutate", "port": 443, "path": "/"}}
    assert configuration["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "cert-manager/knative-selfsigned-ca",
                                                        "argocd.argoproj.io/sync-wave": "1"}
    assert list(containers(docs, "mutate")) == ["mutate"]
    assert not [doc for doc in docs if doc["kind"] in ("Certificate", "Issuer") or doc["apiVersion"] == "v1" and doc["kind"] == "Service"]


@pytest.mark.parametrize("values", ["direct-service", "custom"])
def test_direct_service_path(helm, values):
    """The API server calls a ClusterIP Service on mutate's revision pods, whose webhook-tls
    container serves the certificate for <service>.<namespace>.svc; cert-manager injects that
    certificate's CA."""
    docs = render(helm, values)
    namespace = install_namespace(docs)
    settings = {"serviceName": "mutate-webhook", "targetPort": 8443, **values_of(values)["webhook"].get("directService", {})}
    name, port = settings["serviceName"], settings["targetPort"]
    service = find(docs, "Service", name)
    assert service["apiVersion"] == "v1" and service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {"serving.knative.dev/service": "mutate"}, "every revision's pods"
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": port}]
    assert port not in KNATIVE_PORTS
    configuration = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")
    [webhook] = configuration["webhooks"]
    assert webhook["clientConfig"]["service"] == {"namespace": namespace, "name": name, "port": 443, "path": "/"}
    assert configuration["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{namespace}/{name}",
                                                        "argocd.argoproj.io/sync-wave": "1"}
    certificate = find(docs, "Certificate", name)
    assert certificate["spec"]["dnsNames"] == [f"{name}.{namespace}.svc"], "the name the API server checks"
    pod = find(docs, "Service", "mutate")["spec"]["template"]["spec"]
    tls = containers(docs, "mutate")["webhook-tls"]
    assert "ports" not in tls, "Knative allows one port per pod: the user container's"
    assert [c["name"] for c in pod["containers"] if c.get("ports")] == ["mutate"]
    assert f"--bind=0.0.0.0:{port}" in tls["args"]
    probe = tls["readinessProbe"]
    assert "exec" in probe and not {"httpGet", "tcpSocket", "grpc"} & set(probe), "kept by Knative, run by the kubelet"
    assert probe["exec"]["command"][-1] == str(port) and "/health/readiness" in probe["exec"]["command"][2], (
        "mutate's readiness: it fails while mutate drains after a SIGTERM")
    # The drain (serving/gunicorn_config.py, DRAIN_SECONDS 15) outlasts the probe's failing.
    assert probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"] < 15
    [mount] = tls["volumeMounts"]
    [volume] = pod["volumes"]
    assert volume == {"name": mount["name"], "secret": {"secretName": certificate["spec"]["secretName"]}}
    assert f"--certfile={mount['mountPath']}/tls.crt" in tls["args"] and f"--keyfile={mount['mountPath']}/tls.key" in tls["args"]
    assert tls["image"] == containers(docs, "mutate")["mutate"]["image"]
    assert tls["env"] == containers(docs, "mutate")["mutate"]["env"], "the same settings as the function"
    assert tls["securityContext"] == containers(docs, "mutate")["mutate"]["securityContext"]


def test_direct_service_own_ca_signs_only_the_webhook(helm):
    docs = render(helm, "direct-service")
    issuers = {doc["metadata"]["name"]: doc["spec"] for doc in docs if doc["kind"] == "Issuer"}
    ca = find(docs, "Certificate", "mutate-webhook-ca")["spec"]
    assert ca["isCA"] is True and issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    leaf = find(docs, "Certificate", "mutate-webhook")["spec"]
    assert issuers[leaf["issuerRef"]["name"]] == {"ca": {"secretName": ca["secretName"]}}
    signed_by_ca = [doc for doc in docs if doc["kind"] == "Certificate" and doc["spec"]["issuerRef"]["name"] == leaf["issuerRef"]["name"]]
    assert signed_by_ca == [find(docs, "Certificate", "mutate-webhook")]


class ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 that checks the certificate for `host`: as the API server dials a
    Service's IP and checks <service>.<namespace>.svc."""

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def test_direct_service_container_serves_the_webhook_over_tls(helm, tmp_path):
    """The webhook-tls container's command, as rendered (its $(VAR)s from its env), run here from
    the repository root (the image's /app holds functions/mutate at the same path), with a
    certificate for the Service's name: a client that checks that name, as the API server does,
    gets mutate's answer. Its own gunicorn, so the port and the certificate paths are swapped."""
    docs = render(helm, "direct-service")
    tls = containers(docs, "mutate")["webhook-tls"]
    name = f"mutate-webhook.{install_namespace(docs)}.svc"
    ca = pki.make_ca(tmp_path, "ca")
    key, crt = pki.make_cert(tmp_path, "mutate-webhook", ca, f"/CN={name}", sans=(f"DNS:{name}",))
    variables, port = env(tls), free_port()
    args = [re.sub(r"\$\((\w+)\)", lambda m: variables[m[1]], arg) for arg in tls["args"]]
    args = [f"--bind=127.0.0.1:{port}" if a.startswith("--bind=") else f"--certfile={crt}" if a.startswith("--certfile=")
            else f"--keyfile={key}" if a.startswith("--keyfile=") else a for a in args]
    assert tls["command"] == ["gunicorn"]
    probe = [sys.executable if part == "python" else part for part in tls["readinessProbe"]["exec"]["command"][:-1]] + [str(port)]
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode != 0, "not ready before gunicorn listens"
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", *args], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,  # DRAIN_SECONDS 0: stopped at once at the end
                              env={**os.environ, **variables, "PYTHONPATH": str(REPO), "DRAIN_SECONDS": "0"})
    try:
        context = ssl.create_default_context(cafile=str(ca[1]))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-0", "namespace": "default", "annotations": {"gpu-scheduling-map": "0=node1:0,1"}},
               "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "main", "image": "busybox"}]}}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "object": pod}}
        deadline = time.monotonic() + 30
        while True:
            connection = ServiceConnection(name, port, context=context, timeout=5)
            try:
                connection.request("POST", "/", json.dumps(review), {"Content-Type": "application/json"})
                answer = json.loads(connection.getresponse().read())
                break
            except ConnectionRefusedError:
                assert server.poll() is None, server.stdout.read().decode()
                assert time.monotonic() < deadline, "gunicorn did not listen within 30 s"
                time.sleep(0.2)
            finally:
                connection.close()
        assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is True
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0, "ready once it listens"
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert any("CUDA_VISIBLE_DEVICES" in json.dumps(op) for op in patch)
        # Another name (queue-proxy's system-internal one, say) fails the check.
        with pytest.raises(ssl.SSLCertVerificationError):
            ServiceConnection("kn-user-gpu-scheduler", port, context=context, timeout=5).connect()
    finally:
        server.terminate()
        server.communicate(timeout=10)


# -- one version -----------------------------------------------------------------------------
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SEMVER = re.compile(r"v?\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?")


def test_the_chart_carries_pyprojects_version():
    """One version, pyproject.toml's: the chart's version and appVersion (the images' default tag,
    every object's app.kubernetes.io/version) are it."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), (
        f"Chart.yaml's version and appVersion must be pyproject.toml's {VERSION}")


def image_tags(node, path: tuple[str, ...] = ()) -> dict[str, str]:
    """Every image tag a values file sets, by where: {"bind.image.tag": "0.1.0", ...}."""
    tags = {}
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, dict) and "tag" in value:
                tags[".".join((*path, "image", "tag"))] = str(value["tag"])
            tags.update(image_tags(value, (*path, str(key))))
    return tags


@pytest.mark.parametrize("path", [CHART / "values.yaml", *CI_VALUES.values(), REPO / "argocd" / "values.yaml"],
                         ids=lambda path: str(path.relative_to(REPO)))
def test_image_tags_that_are_versions_are_pyprojects(path):
    """The chart's default tags are empty (the appVersion); a values file of this repository that
    pins a release's tag pins this one (a tag such as dev or 2026.11-rc1 is not a version)."""
    tags = image_tags(yaml.safe_load(path.read_text()))
    if path == CHART / "values.yaml":
        assert set(tags.values()) <= {""}, "the chart's default image tags: empty, so the appVersion"
    versions = {where: tag for where, tag in tags.items() if SEMVER.fullmatch(tag)}
    assert {where: tag.removeprefix("v") for where, tag in versions.items()} == dict.fromkeys(versions, VERSION)


@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_every_object_has_the_recommended_labels(helm, values):
    docs = render(helm, values)
    assert docs
    for doc in docs:
        labels = doc["metadata"].get("labels") or {}
        assert {key: labels.get(key) for key in RECOMMENDED} == {
            "app.kubernetes.io/name": "gpu-scheduler", "app.kubernetes.io/instance": manifests.RELEASE,
            "app.kubernetes.io/version": VERSION, "app.kubernetes.io/managed-by": "Helm",
        }, f"{doc['kind']} {doc['metadata']['name']}"


RECOMMENDED = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by")


# -- one source of truth ---------------------------------------------------------------------
def test_generated_files_match_the_chart(helm):
    """knative/*.yaml and functions/*/func.yaml are the chart rendered with kind/values.yaml."""
    assert manifests.drift() == [], "run `make manifests`"


# -- a real API server with the real CRDs ----------------------------------------------------
@pytest.fixture(scope="module")
def crds(controlplane) -> list:
    """The Knative and cert-manager CRDs of the schema fixtures, installed and Established."""
    kubectl = [controlplane.kubectl, "--kubeconfig", controlplane.kubeconfig]
    paths = sorted(SCHEMAS.glob("*/*.yaml"))
    names = [doc["metadata"]["name"] for path in paths for doc in load_documents(path)
             if doc.get("kind") == "CustomResourceDefinition"]
    assert names, f"no CRDs under {SCHEMAS}"
    # Server-side: the largest CRDs do not fit client-side apply's last-applied annotation.
    subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", *(f"--filename={p}" for p in paths)],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names)],
                   check=True, capture_output=True, timeout=90)
    return kubectl


@pytest.mark.controlplane
@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_server_accepts_every_rendered_object(helm, crds, values, tmp_path):
    """`kubectl apply --dry-run=server --validate=strict`: defaulting, validation (unknown
    fields are errors, in custom resources too) and admission, nothing persisted."""
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    docs = template(helm, "-f", str(CI_VALUES[values]), namespace=namespace)
    # The objects' namespace: the release's unless the values name one (then created if asked).
    namespaces = {doc["metadata"]["namespace"] for doc in docs if "namespace" in doc["metadata"]}
    for name in namespaces:
        subprocess.run([*crds, "create", "namespace", name], capture_output=True, timeout=60)
    try:
        path = tmp_path / "rendered.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        result = subprocess.run([*crds, "apply", "--dry-run=server", "--validate=strict", "-f", str(path)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{values}:\n{result.stdout}\n{result.stderr}"
        assert result.stdout.count("(server dry run)") == len(docs), result.stdout
        kinds = {doc["kind"] for doc in docs}
        assert {"Service", "ApiServerSource", "PingSource", "MutatingWebhookConfiguration", "Role", "ClusterRole"} <= kinds
    finally:
        for name in namespaces:
            subprocess.run([*crds, "delete", "namespace", name, "--wait=false"], capture_output=True, timeout=60)


def test_server_refuses_a_typo(helm, crds, tmp_path):
    """The dry run does check custom resources: a misspelled field of a Certificate is refused."""
    certificate = find(template(helm, "-f", str(CI_VALUES["direct-service"]), namespace="default"),
                       "Certificate", "mutate-webhook")
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(certificate))
    result = subprocess.run([*crds, "apply", "--dry-run=server", "--validate=strict", "-f", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "dnsName" in result.stderr, result.stdout + result.stderr
