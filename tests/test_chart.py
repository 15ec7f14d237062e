"""The Helm chart (chart/gpu-scheduler): `helm lint`, `helm template` with each values file of
chart/gpu-scheduler/ci/, every rendered object against its schema offline and accepted by the
real API server holding the real Knative and cert-manager CRDs, RBAC equal to
gpu_scheduler.permissions, the values reaching the objects (the pods' knobs exactly where set),
the two webhook paths, the `helm test` hook (its command run as its account on the real API
server), one version (pyproject.toml's) in the chart and on every object, and the files rendered
from the chart (knative/*.yaml, functions/*/func.yaml) not drifting from it.

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
from localcp import images, pki
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
@pytest.mark.parametrize("values", ["chart-defaults", *sorted(CI_VALUES)])
def test_lint(helm, values):
    """`helm lint --strict` with the chart's own defaults (lint does not fail on the required
    images) and with each values file of ci/."""
    files = [] if values == "chart-defaults" else ["-f", str(CI_VALUES[values])]
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *files], capture_output=True, text=True, timeout=120)
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
    ("bind.scale.window=5", "window"),  # a duration: 6s to 1h
    ("bind.scale.window=2h", "window"),
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
    ("test.enabeld=false", "enabeld"),
    ("test.node=Not_A_Node", "node"),
    ("test.nodeSelectr.pool=system", "nodeSelectr"),
])
def test_schema_refuses(helm, setting, why):
    error = helm_error(helm, "-f", str(CI_VALUES["default"]), "--set", setting)
    assert "values don't meet the specifications of the schema" in error and why in error, error


def test_scale_bounds_in_order(helm):
    error = helm_error(helm, "-f", str(CI_VALUES["default"]), "--set", "bind.scale.min=4")
    assert "bind.scale: min 4 is above max 3" in error


def test_bind_at_zero_needs_the_route_and_names_the_fix(helm):
    """min-scale 0 with sink.path direct-service: at zero that Service has no endpoint, so every
    event would be lost and nothing would wake bind. Refused, naming both settings and the fix."""
    error = helm_error(helm, "-f", str(CI_VALUES["custom"]), "--set", "bind.scale.min=0")
    assert "bind.scale.min 0 needs sink.path knative-route" in error and "sink.path=knative-route" in error, error


def resync_schedule(docs: list[dict]) -> str:
    return find(docs, "PingSource", "resync")["spec"]["schedule"]


def test_the_resync_schedule_follows_bind_scale_unless_set(helm):
    """Empty (the default): every minute while bind keeps a pod, every 5 minutes at min-scale 0 (a
    ping a minute would keep bind awake for good); a schedule set is kept as set."""
    default = CI_VALUES["default"]
    assert resync_schedule(template(helm, "-f", str(default))) == "* * * * *"
    assert resync_schedule(template(helm, "-f", str(default), "--set", "bind.scale.min=0")) == "*/5 * * * *"
    assert resync_schedule(template(helm, "-f", str(default), "--set", "bind.scale.min=0",
                                    "--set", "resync.schedule=*/2 * * * *")) == "*/2 * * * *"


def test_bind_scale_window_reaches_the_revision_only_when_set(helm):
    annotations = revision(template(helm, "-f", str(CI_VALUES["default"])), "bind")["metadata"]["annotations"]
    assert "autoscaling.knative.dev/window" not in annotations  # Knative's own default (60s)
    docs = template(helm, "-f", str(CI_VALUES["default"]), "--set", "bind.scale.min=0", "--set", "bind.scale.window=10s")
    annotations = revision(docs, "bind")["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "0"
    assert annotations["autoscaling.knative.dev/window"] == "10s"


@pytest.mark.parametrize("runtime", ["knative", "deployments"])
def test_dra_mode_without_dra_is_refused_naming_both_values(helm, runtime):
    """bind refuses DEVICE_ENV_MODE dra with GPU_SCHEDULER_DRA=false at start; the chart says so first."""
    error = helm_error(helm, "-f", str(CI_VALUES["default"]), "--set", f"runtime={runtime}",
                       "--set", "deviceEnvMode=dra", "--set", "dra.enabled=false")
    assert "deviceEnvMode dra needs dra.enabled true" in error and "deviceEnvMode cuda or nvidia" in error, error


# -- every rendered object, offline ----------------------------------------------------------
@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_rendered_objects_validate(helm, values):
    """Core kinds strictly for 1.33, 1.34 (kind's) and 1.37, custom resources against their CRDs
    with unknown fields as errors, also where the CRD preserves them."""
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
    assert account_grants("mutate", docs, namespace) == (
        {"cluster": permissions.MUTATE if quota else permissions.MUTATE - permissions.MUTATE_QUOTA})
    assert find(docs, "ServiceAccount", "mutate").get("automountServiceAccountToken", True) is True, (
        "mutate reads JobSets, with or without quotas")
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
    assert bind_env["DEVICE_ENV_MODE"] == "dra"
    assert (bind_env["GPU_SCHEDULER_DRA"], bind_env["GPU_SCHEDULER_DRA_DEVICE_CLASS"]) == ("true", "gpu.example.com")
    assert json.loads(bind_env["GPU_SCHEDULER_DRA_DEVICE_RULES"]) == json.loads(values["dra"]["deviceRules"])
    assert find(docs, "Service", "bind")["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/image-id"]
    ping = find(docs, "PingSource", "resync")["spec"]
    assert (ping["schedule"], ping["timezone"]) == ("*/5 * * * *", "Europe/Berlin")
    for kind, name in (("ApiServerSource", "pod-events"), ("PingSource", "resync")):
        sink = find(docs, kind, name)["spec"]["sink"]
        assert sink["CACerts"].strip() == values["sink"]["caCerts"].strip()
        assert sink["ref"] == {"apiVersion": "v1", "kind": "Service", "name": "gpu-bind-events", "namespace": namespace}
    webhook = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"][0]  # the pods' (the templates' follow, quotas on)
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
    """mutate writes the mode's environment; bind reads it too (in dra, not ready without DRA's API)."""
    docs = render(helm, values)
    for name in ("mutate", "bind"):
        for container in containers(docs, name).values():
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
    webhook = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    assert webhook["failurePolicy"] == "Fail"


# -- the two webhook paths -------------------------------------------------------------------
def test_knative_route_path(helm):
    docs = render(helm, "default")
    configuration = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")
    webhook = configuration["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    assert webhook["clientConfig"] == {"service": {"namespace": manifests.NAMESPACE, "name": "mutate", "port": 443, "path": "/"}}
    assert configuration["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "cert-manager/knative-selfsigned-ca",
                                                        "argocd.argoproj.io/sync-wave": "1"}
    assert list(containers(docs, "mutate")) == ["mutate"]
    assert not [doc for doc in docs if doc["kind"] in ("Certificate", "Issuer") or doc["apiVersion"] == "v1" and doc["kind"] == "Service"]


@pytest.mark.parametrize("values", ["direct-service", "custom"])
def test_direct_service_path(helm, values):
    """The API server calls a ClusterIP Service on mutate's revision pods, whose one container
    also serves the certificate for <service>.<namespace>.svc on a second listener (TLS);
    cert-manager injects that certificate's CA."""
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
    webhook = configuration["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    assert webhook["clientConfig"]["service"] == {"namespace": namespace, "name": name, "port": 443, "path": "/"}
    assert configuration["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{namespace}/{name}",
                                                        "argocd.argoproj.io/sync-wave": "1"}
    certificate = find(docs, "Certificate", name)
    assert certificate["spec"]["dnsNames"] == [f"{name}.{namespace}.svc"], "the name the API server checks"
    pod = find(docs, "Service", "mutate")["spec"]["template"]["spec"]
    # One container, which func.yaml can declare too (functions/mutate/func.yaml): the TLS port is
    # a second listener of the same server, undeclared (Knative allows one port: queue-proxy's).
    [mutate] = pod["containers"]
    assert mutate["ports"] == [{"containerPort": 8080}]
    variables = env(mutate)
    assert variables["WEBHOOK_TLS_PORT"] == str(port)
    # Ready means both listeners: they are one server's, so its HTTP readiness answers for both.
    assert mutate["readinessProbe"] == {"httpGet": {"path": "/health/readiness"}}
    [mount] = mutate["volumeMounts"]
    [volume] = pod["volumes"]
    assert volume == {"name": mount["name"], "secret": {"secretName": certificate["spec"]["secretName"]}}
    assert mount["readOnly"] is True and variables["WEBHOOK_TLS_DIR"] == mount["mountPath"]
    assert mount["name"] == f"secret-{certificate['spec']['secretName']}", "the name func deploy gives it"


def test_direct_service_own_ca_signs_only_the_webhook(helm):
    docs = render(helm, "direct-service")
    issuers = {doc["metadata"]["name"]: doc["spec"] for doc in docs if doc["kind"] == "Issuer"}
    ca = find(docs, "Certificate", "mutate-webhook-ca")["spec"]
    assert ca["isCA"] is True and issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    leaf = find(docs, "Certificate", "mutate-webhook")["spec"]
    assert issuers[leaf["issuerRef"]["name"]] == {"ca": {"secretName": ca["secretName"]}}
    signed_by_ca = [doc for doc in docs if doc["kind"] == "Certificate" and doc["spec"]["issuerRef"]["name"] == leaf["issuerRef"]["name"]]
    assert signed_by_ca == [find(docs, "Certificate", "mutate-webhook")]


def test_direct_service_without_cert_manager_serves_a_certificate_of_the_charts_own_ca(helm, tmp_path):
    """webhook.certManager false (or auto on a cluster without cert-manager, as on the local
    stack's Knative): no cert-manager object; the chart's CA signs mutate's certificate for
    <service>.<namespace>.svc, into the Secret the webhook-tls container mounts, and is the
    webhook's caBundle (nothing to inject)."""
    docs = template(helm, "-f", str(CI_VALUES["direct-service"]), "--set", "webhook.certManager=false")
    namespace = install_namespace(docs)
    assert not [doc for doc in docs if doc["apiVersion"].startswith("cert-manager.io/")]
    secret = find(docs, "Secret", "mutate-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    [volume] = find(docs, "Service", "mutate")["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "mutate-webhook-tls"
    configuration = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")
    assert "cert-manager.io/inject-ca-from" not in configuration["metadata"]["annotations"]
    assert {w["clientConfig"]["caBundle"] for w in configuration["webhooks"]} == {secret["data"]["ca.crt"]}
    for name in ("ca.crt", "tls.crt"):
        (tmp_path / name).write_bytes(base64.b64decode(secret["data"][name]))
    host = f"mutate-webhook.{namespace}.svc"
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname", host,
                               str(tmp_path / "tls.crt")], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_direct_service_issuer_without_cert_manager_is_refused(helm):
    error = helm_error(helm, "-f", str(CI_VALUES["custom"]), "--set", "webhook.certManager=false")
    assert "webhook.directService.issuerRef" in error and "webhook.certManager" in error


@pytest.mark.parametrize("values", ["default", "custom"])
def test_sink_path(helm, values):
    """sink.path knative-route (default): the sources send to the Knative Service bind (its
    Route). direct-service: to a ClusterIP Service on every revision's pods, their queue-proxy's
    port, for a cluster without a cluster-local gateway."""
    docs = render(helm, values)
    namespace = install_namespace(docs)
    sinks = [find(docs, kind, name)["spec"]["sink"] for kind, name in (("ApiServerSource", "pod-events"), ("PingSource", "resync"))]
    direct = values_of(values).get("sink", {}).get("path") == "direct-service"
    if not direct:
        assert {json.dumps(s["ref"]) for s in sinks} == {json.dumps(
            {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "bind", "namespace": namespace})}
        assert not [d for d in docs if d["kind"] == "Service" and d["apiVersion"] == "v1" and "bind" in d["metadata"]["name"]]
        return
    name = values_of(values)["sink"]["directService"]["serviceName"]
    assert {json.dumps(s["ref"]) for s in sinks} == {json.dumps(
        {"apiVersion": "v1", "kind": "Service", "name": name, "namespace": namespace})}
    service = find(docs, "Service", name)
    assert service["apiVersion"] == "v1" and service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {"serving.knative.dev/service": "bind"}, "every revision's pods"
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": 8012}], "queue-proxy's HTTP port"


class ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 that checks the certificate for `host`: as the API server dials a
    Service's IP and checks <service>.<namespace>.svc."""

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def test_direct_service_container_serves_the_webhook_over_tls(helm, tmp_path):
    """mutate's container as rendered (the image's entry point, its env, with WEBHOOK_TLS_DIR
    pointing at a certificate for the Service's name), run here from the repository root (the
    image's /app holds functions/mutate at the same path): a client that checks that name, as
    the API server does, gets mutate's answer on the TLS port, while queue-proxy's port stays
    plain HTTP. The ports are swapped for free ones."""
    docs = render(helm, "direct-service")
    mutate = containers(docs, "mutate")["mutate"]
    name = f"mutate-webhook.{install_namespace(docs)}.svc"
    ca = pki.make_ca(tmp_path, "ca")
    key, crt = pki.make_cert(tmp_path, "mutate-webhook", ca, f"/CN={name}", sans=(f"DNS:{name}",))
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    (tls_dir / "tls.crt").write_bytes(crt.read_bytes())
    (tls_dir / "tls.key").write_bytes(key.read_bytes())
    http_port, tls_port = free_port(), free_port()
    variables = {**env(mutate), "PORT": str(http_port), "WEBHOOK_TLS_PORT": str(tls_port), "WEBHOOK_TLS_DIR": str(tls_dir)}
    entrypoint = images.read_dockerfile(REPO / "Dockerfile.mutate").entrypoint
    server = subprocess.Popen([sys.executable, "-m", *entrypoint], cwd=REPO, stdout=subprocess.PIPE,
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
            connection = ServiceConnection(name, tls_port, context=context, timeout=5)
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
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert any("CUDA_VISIBLE_DEVICES" in json.dumps(op) for op in patch)
        plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
        plain.request("GET", "/health/readiness")
        assert plain.getresponse().status == 200, "queue-proxy's port: plain HTTP, as before"
        plain.close()
        # Another name (queue-proxy's system-internal one, say) fails the check.
        with pytest.raises(ssl.SSLCertVerificationError):
            ServiceConnection("kn-user-gpu-scheduler", tls_port, context=context, timeout=5).connect()
    finally:
        server.terminate()
        server.communicate(timeout=10)


def test_the_webhook_tls_listener_without_its_certificate_refuses_to_start_naming_the_fix(tmp_path):
    """WEBHOOK_TLS_PORT set and no Secret mounted (a func.yaml deployed before the chart made the
    Secret, say): the server exits at once with what to mount, instead of failing every handshake."""
    entrypoint = images.read_dockerfile(REPO / "Dockerfile.mutate").entrypoint
    done = subprocess.run([sys.executable, "-m", *entrypoint], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PORT": str(free_port()),
                               "WEBHOOK_TLS_PORT": str(free_port()), "WEBHOOK_TLS_DIR": str(tmp_path / "absent")})
    assert done.returncode != 0
    assert "mount the webhook's kubernetes.io/tls Secret" in done.stderr and "Traceback" not in done.stderr


# -- helm test -------------------------------------------------------------------------------
# The plugin's reads (permissions.PLUGIN), bind's records among them: those only in the install
# namespace, where bind keeps them.
PLUGIN_RECORDS = frozenset(p for p in permissions.PLUGIN if p[0] == "coordination.k8s.io")
READS = {"get", "list", "watch"}
SCRIPT = next(iter(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]))
TEST_OBJECTS = {("ServiceAccount", "plan-test"), ("ClusterRole", "gpu-scheduler-plan-test"),
                ("ClusterRoleBinding", "gpu-scheduler-plan-test"), ("Role", "plan-test"), ("RoleBinding", "plan-test"),
                ("Pod", "plan-test")}


def plan_test_objects(docs: list[dict]) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in docs if "plan-test" in doc["metadata"]["name"]}


def expanded_env(container: dict, node: str) -> dict[str, str]:
    """The container's environment as the kubelet gives it, the node the pod runs on being
    `node`: $(VAR) of an earlier variable replaced, as in a pod."""
    env: dict[str, str] = {}
    for variable in container["env"]:
        if "valueFrom" in variable:
            assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, variable
            env[variable["name"]] = node
        else:
            env[variable["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], variable["value"])
    return env


@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_helm_test_is_a_hook_pod_that_runs_plan_cluster(helm, values):
    docs = render(helm, values)
    namespace = install_namespace(docs)
    assert plan_test_objects(docs) == TEST_OBJECTS
    hooks = [doc for doc in docs if (doc["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    assert hooks == [find(docs, "Pod", "plan-test")], "the Pod is the one test hook; its account and RBAC belong to the release"
    pod = hooks[0]
    assert pod["metadata"]["namespace"] == namespace
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # Kept (for `helm test --logs`, which reads it after the hooks ran) until the next test replaces it.
    assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    spec = pod["spec"]
    assert (spec["serviceAccountName"], spec["restartPolicy"]) == ("plan-test", "Never")
    [container] = spec["containers"]
    # bind's image, which holds the plugin (Dockerfile.bind), and its pull policy.
    assert container["image"] == containers(docs, "bind")["bind"]["image"]
    assert container["imagePullPolicy"] == containers(docs, "bind")["bind"]["imagePullPolicy"]
    # Non-root, read-only, nothing more: as the functions' containers.
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == containers(docs, "bind")["bind"]["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["command"] == ["/bin/sh", "-c"]
    assert f"| {SCRIPT} plan --cluster -f -" in container["args"][0], "the console script pyproject.toml installs"
    env = expanded_env(container, "node3")
    settings = values_of(values)
    assert env["GPU_SCHEDULER_NAMESPACE"] == namespace, "bind's records: where the chart puts them"
    assert env["GPU_SCHEDULER_QUOTA"] == str(settings.get("quota", {}).get("enabled", True)).lower()
    assert env["GPU_SCHEDULER_DRA_DEVICE_CLASS"] == settings.get("dra", {}).get("deviceClass", "gpu.nvidia.com")
    assert env.get("GPU_SCHEDULER_DRA_DEVICE_RULES", "") == settings.get("dra", {}).get("deviceRules", "")
    manifest = yaml.safe_load(env["PLAN_MANIFEST"])
    assert manifest["metadata"]["namespace"] == namespace
    annotations = manifest["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"gpu-scheduling-map": "0=node3:0", "gpu-scheduler/device-env": settings.get("deviceEnvMode", "cuda")}


def test_helm_tests_manifest_is_one_the_plugin_plans(helm):
    """The manifest the test's pod plans, with its node put in: the plugin reads it and places
    replica 0 on that node's device 0 (offline here: no --cluster)."""
    import io

    from kubectl_gpu_scheduler.cli import main

    [container] = find(render(helm, "default"), "Pod", "plan-test")["spec"]["containers"]
    out, err = io.StringIO(), io.StringIO()
    code = main(["plan", "-f", "-", "-o", "json"], stdin=io.BytesIO(expanded_env(container, "node2")["PLAN_MANIFEST"].encode()),
                stdout=out, stderr=err)
    assert (code, err.getvalue()) == (0, "")
    [workload] = json.loads(out.getvalue())["workloads"]
    assert [(p["pod"], p["node"]) for p in workload["pods"]] == [("plan-test-0", "node2")]


@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_helm_tests_account_reads_exactly_what_the_plugin_needs(helm, values):
    """permissions.PLUGIN, no more and no less, all of it reads; bind's records in the install
    namespace only."""
    docs = render(helm, values)
    namespace = install_namespace(docs)
    grants = account_grants("plan-test", docs, namespace)
    assert grants == {"cluster": permissions.PLUGIN - PLUGIN_RECORDS, namespace: PLUGIN_RECORDS}
    assert {verb for where in grants.values() for _, _, verb in where} <= READS
    assert PLUGIN_RECORDS, "permissions.PLUGIN reads bind's records"


def test_helm_test_can_be_turned_off(helm):
    docs = template(helm, "-f", str(CI_VALUES["default"]), "--set", "test.enabled=false")
    assert not plan_test_objects(docs)
    assert not [doc for doc in docs if (doc["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]


def test_helm_test_settings(helm):
    """test.image, test.node and the test's own knobs; without them, bind's pull secrets and
    placement (where bind's image is pulled and bind runs), and no priority class of bind's."""
    default = find(render(helm, "default"), "Pod", "plan-test")["spec"]
    assert not set(POD_KNOBS) & set(default), "nothing when nothing is set"
    custom_docs, custom = render(helm, "custom"), values_of("custom")
    inherited = find(custom_docs, "Pod", "plan-test")["spec"]
    assert {knob: inherited.get(knob) for knob in POD_KNOBS} == {
        **{knob: custom["bind"][knob] for knob in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity")},
        "priorityClassName": None}
    own = {"imagePullSecrets": [{"name": "test-registry"}], "nodeSelector": {"pool": "tests"}, "priorityClassName": "low",
           "tolerations": [{"operator": "Exists"}], "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
           "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}, "podAnnotations": {"team": "gpu"}}
    docs = template(helm, "-f", str(CI_VALUES["custom"]), "--set", "test.image.repository=registry.example.com/tools/plan",
                    "--set", "test.image.pullPolicy=Always", "--set", "test.node=gpu-node-7",
                    *(arg for knob, value in own.items() for arg in ("--set-json", f"test.{knob}={json.dumps(value)}")))
    pod = find(docs, "Pod", "plan-test")
    [container] = pod["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (f"registry.example.com/tools/plan:{VERSION}", "Always")
    assert {v["name"]: v for v in container["env"]}["PLAN_NODE"] == {"name": "PLAN_NODE", "value": "gpu-node-7"}
    assert "0=gpu-node-7:0" in expanded_env(container, "elsewhere")["PLAN_MANIFEST"]
    assert {knob: pod["spec"][knob] for knob in POD_KNOBS} == {knob: own[knob] for knob in POD_KNOBS}
    assert container["resources"] == own["resources"]
    assert pod["metadata"]["annotations"]["team"] == "gpu" and pod["metadata"]["annotations"]["helm.sh/hook"] == "test"


@pytest.fixture
def plugin_on_path(tmp_path) -> str:
    """A PATH whose kubectl-gpu_scheduler is this checkout's plugin (what bind's image installs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / SCRIPT
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m kubectl_gpu_scheduler \"$@\"\n")
    script.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def test_helm_tests_command_needs_a_cluster(helm, plugin_on_path, tmp_path):
    """The pod's own command, run here: with no API server to answer it fails, saying so."""
    [container] = find(render(helm, "default"), "Pod", "plan-test")["spec"]["containers"]
    env = {**expanded_env(container, "node1"), "PATH": plugin_on_path, "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
           "KUBECONFIG": str(tmp_path / "none")}
    result = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the plugin could not answer (exit 2)" in result.stdout and "kubeconfig" in result.stderr


def test_helm_test_passes_as_its_account_on_a_real_api_server(helm, crds, controlplane, plugin_on_path, tmp_path):
    """The test's account and RBAC as rendered, on the real API server; its pod's command run here
    with that account's token: the plugin answers (node1 of the control plane, device 0). Without
    the Role on bind's records it cannot, and the test fails."""
    namespace = f"plan-{uuid.uuid4().hex[:8]}"
    docs = template(helm, "-f", str(CI_VALUES["default"]), namespace=namespace)
    rbac = [doc for doc in docs if (doc["kind"], doc["metadata"]["name"]) in TEST_OBJECTS and doc["kind"] != "Pod"]
    # Another release name: the ClusterRole and its binding are this test's own.
    for doc in rbac:
        doc["metadata"]["name"] = doc["metadata"]["name"].replace("gpu-scheduler-plan-test", f"{namespace}-plan-test")
        if "roleRef" in doc:
            doc["roleRef"]["name"] = doc["roleRef"]["name"].replace("gpu-scheduler-plan-test", f"{namespace}-plan-test")
    kubectl = crds
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True, timeout=60)
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all(rbac))
    try:
        subprocess.run([*kubectl, "apply", "-f", str(path)], check=True, capture_output=True, timeout=60)
        token = controlplane.cp.service_account_token(namespace, "plan-test")
        config = tmp_path / "config"
        config.write_text(controlplane.cp.kubeconfig_text(user={"token": token}))
        [container] = find(docs, "Pod", "plan-test")["spec"]["containers"]
        env = {**expanded_env(container, "node1"), "PATH": plugin_on_path, "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
               "KUBECONFIG": str(config)}
        command = [*container["command"], *container["args"]]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "the plugin answered from the cluster" in result.stdout and "plan-test-0" in result.stdout
        assert "error" not in result.stderr, result.stderr
        subprocess.run([*kubectl, "-n", namespace, "delete", "rolebinding", "plan-test"], check=True, capture_output=True,
                       timeout=60)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and "the plugin could not answer" in result.stdout, result.stdout + result.stderr
        assert "leases" in result.stderr and "403" in result.stderr, result.stderr
    finally:
        subprocess.run([*kubectl, "delete", "--ignore-not-found", "-f", str(path)], capture_output=True, timeout=60)
        subprocess.run([*kubectl, "delete", "namespace", namespace, "--wait=false"], capture_output=True, timeout=60)


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


def server_dry_run(kubectl: list[str], docs: list[dict], path) -> None:
    """`kubectl apply --dry-run=server --validate=strict` of `docs`: every one accepted."""
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    result = subprocess.run([*kubectl, "apply", "--dry-run=server", "--validate=strict", "-f", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.stdout.count("(server dry run)") == len(docs), result.stdout


@pytest.mark.controlplane
@pytest.mark.parametrize("values", sorted(CI_VALUES))
def test_server_accepts_every_rendered_object(helm, crds, values, tmp_path):
    """`kubectl apply --dry-run=server --validate=strict`: defaulting, validation (unknown
    fields are errors, in custom resources too) and admission, nothing persisted. The hooks (the
    helm test Pod) after the release's objects, as helm runs them: by then their ServiceAccount
    exists (admission checks it), so it is created for them here."""
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    docs = template(helm, "-f", str(CI_VALUES[values]), namespace=namespace)
    hooks = [doc for doc in docs if "helm.sh/hook" in (doc["metadata"].get("annotations") or {})]
    # The objects' namespace: the release's unless the values name one (then created if asked).
    namespaces = {doc["metadata"]["namespace"] for doc in docs if "namespace" in doc["metadata"]}
    for name in namespaces:
        subprocess.run([*crds, "create", "namespace", name], capture_output=True, timeout=60)
    try:
        server_dry_run(crds, [doc for doc in docs if doc not in hooks], tmp_path / "release.yaml")
        for hook in hooks:
            if hook["kind"] == "Pod":
                subprocess.run([*crds, "-n", hook["metadata"]["namespace"], "create", "serviceaccount",
                                hook["spec"]["serviceAccountName"]], check=True, capture_output=True, timeout=60)
        server_dry_run(crds, hooks, tmp_path / "hooks.yaml")
        kinds = {doc["kind"] for doc in docs}
        assert {"Service", "ApiServerSource", "PingSource", "MutatingWebhookConfiguration", "Role", "ClusterRole", "Pod"} <= kinds
        # the helm test Pod, and the uninstall hook (tests/test_chart_runtime.py)
        assert sorted((doc["kind"], doc["metadata"]["name"]) for doc in hooks) == sorted(
            [("Pod", "plan-test"), *UNINSTALL_HOOKS(manifests.RELEASE)])
    finally:
        for name in namespaces:
            subprocess.run([*crds, "delete", "namespace", name, "--wait=false"], capture_output=True, timeout=60)


def UNINSTALL_HOOKS(release: str) -> list[tuple[str, str]]:
    return [("ServiceAccount", "uninstall"), ("ClusterRole", f"{release}-uninstall"), ("ClusterRoleBinding", f"{release}-uninstall"),
            ("Role", "uninstall"), ("RoleBinding", "uninstall"), ("Job", "uninstall")]


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
