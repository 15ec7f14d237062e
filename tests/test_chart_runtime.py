"""The chart without Knative (`runtime: deployments`) and its uninstall hook, in both runtimes.

- helm template: the deployments runtime renders no Knative object, and renders bind and mutate as
  Deployments behind Services with PodDisruptionBudgets, the webhook on the mutate Service
  (a service reference), mutate serving TLS itself with a certificate from cert-manager or from
  the chart (its CA in caBundle); the pods' knobs, probes and security settings; the schema
  refuses another runtime. The pre-delete hook (functions/bind/uninstall.py in bind's image) in
  both runtimes, its account granted exactly permissions.UNINSTALL and UNINSTALL_RECORDS.
- The API server (dry run, strict): every object of the deployments runtime, hooks included,
  with and without cert-manager. The knative runtime's hook is dry-run by tests/test_chart.py
  (test_server_accepts_every_rendered_object): there is no Knative here to run that runtime.
- On the local control plane with the four real nodes (LocalStack(in_cluster=True,
  functions=False)): `helm install --set runtime=deployments` from the locally built images,
  the seed StatefulSet placed by the release's bind, `helm upgrade` (bind and mutate roll; the
  seed's pods, bind's records and mutate's certificate stay), `helm uninstall` (nothing of the
  release left: no advertised resource on any node, no record, no webhook configuration, no
  ServiceAccount, no RBAC).
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from gpu_scheduler import permissions
from gpu_scheduler.quota import is_quota_resource
from gpu_scheduler.records import RECORD_SELECTOR
from schemas import REPO, manifest_errors
from test_chart import (CHART, CI_VALUES, POD_KNOBS, crds, find, helm, helm_error, manifests,  # noqa: F401 (fixtures)
                        server_dry_run, template)
from test_manifests import account_grants

sys.path.insert(0, str(REPO / "functions" / "bind"))
import uninstall  # noqa: E402

DEFAULT = str(CI_VALUES["default"])
DEPLOYMENTS = ("-f", DEFAULT, "--set", "runtime=deployments")
NS = manifests.NAMESPACE
FUNCTIONS = ("bind", "mutate")
HOOK_OBJECTS = {("ServiceAccount", "uninstall"), ("ClusterRole", "gpu-scheduler-uninstall"),
                ("ClusterRoleBinding", "gpu-scheduler-uninstall"), ("Role", "uninstall"), ("RoleBinding", "uninstall"),
                ("Job", "uninstall")}


def deployments(helm, *args: str, namespace: str = NS) -> list[dict]:
    return template(helm, *DEPLOYMENTS, *args, namespace=namespace)


def pod_spec(docs: list[dict], name: str) -> dict:
    return find(docs, "Deployment", name)["spec"]["template"]["spec"]


def container(docs: list[dict], name: str) -> dict:
    [only] = pod_spec(docs, name)["containers"]
    return only


def annotations(doc: dict) -> dict:
    return doc["metadata"].get("annotations") or {}


def is_hook(doc: dict) -> bool:
    return "helm.sh/hook" in annotations(doc)


# -- the schema ------------------------------------------------------------------------------
@pytest.mark.parametrize("setting, why", [
    ("runtime=other", "runtime"),
    ("runtime=Deployments", "runtime"),
    ("bind.replicas=0", "replicas"),
    ("mutate.replicas=0", "replicas"),
    ("webhook.certManager=sometimes", "certManager"),
    ("probes.exec=true", "probes"),  # the local stack's exec probes are gone: its kubelets reach pods
    ("uninstall.resource.limits.memory=1Gi", "resource"),
])
def test_schema_refuses(helm, setting, why):
    error = helm_error(helm, "-f", DEFAULT, "--set", setting)
    assert "values don't meet the specifications of the schema" in error and why in error, error


def test_lint(helm):
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *DEPLOYMENTS], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- what the deployments runtime renders ----------------------------------------------------
def test_no_knative_object(helm):
    for docs in (deployments(helm), deployments(helm, "--api-versions", "cert-manager.io/v1")):
        assert not [doc for doc in docs if "knative.dev" in doc["apiVersion"]]
        assert not [doc for doc in docs if doc["kind"] in ("ApiServerSource", "PingSource", "CronJob")]
        assert not [doc for doc in docs if doc["kind"] == "ServiceAccount" and doc["metadata"]["name"] == "pod-events"]
        assert "networking.knative.dev/visibility" not in json.dumps(docs)


def test_the_knative_runtime_is_the_default(helm):
    docs = template(helm, "-f", DEFAULT)
    assert {(d["kind"], d["apiVersion"]) for d in docs if d["metadata"]["name"] in FUNCTIONS and d["kind"] == "Service"} == {
        ("Service", "serving.knative.dev/v1")}
    assert not [doc for doc in docs if doc["kind"] in ("Deployment", "PodDisruptionBudget")]


def test_the_objects(helm):
    docs = deployments(helm)
    objects = {(d["kind"], d["metadata"]["name"]) for d in docs if not is_hook(d)}
    assert {("Deployment", "bind"), ("Deployment", "mutate"), ("Service", "bind"), ("Service", "mutate"),
            ("PodDisruptionBudget", "bind"), ("PodDisruptionBudget", "mutate"), ("Secret", "mutate-tls"),
            ("MutatingWebhookConfiguration", "gpu-scheduler")} <= objects
    for name in FUNCTIONS:
        deployment = find(docs, "Deployment", name)
        assert deployment["spec"]["replicas"] == 2, "several bind instances: their records decide between them"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"] == labels
        budget = find(docs, "PodDisruptionBudget", name)["spec"]
        assert budget == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}
        service = find(docs, "Service", name)["spec"]
        assert service["selector"] == labels and service["type"] == "ClusterIP"
        [port] = service["ports"]
        [container_port] = container(docs, name)["ports"]
        assert port["targetPort"] == container_port["name"]
        assert (port["port"], container_port["containerPort"]) == {"bind": (80, 8080), "mutate": (443, 8443)}[name]
        assert {"name": "PORT", "value": str(container_port["containerPort"])} in container(docs, name)["env"]
        assert pod_spec(docs, name)["serviceAccountName"] == name
    assert find(docs, "ServiceAccount", "bind") and find(docs, "ServiceAccount", "mutate")
    other = deployments(helm, "--set", "bind.replicas=3", "--set", "mutate.replicas=4")
    assert (find(other, "Deployment", "bind")["spec"]["replicas"], find(other, "Deployment", "mutate")["spec"]["replicas"]) == (3, 4)


def test_the_functions_settings_are_the_knative_revisions(helm):
    """The same image, environment and resources as the knative runtime's revisions (PORT added)."""
    knative = template(helm, "-f", DEFAULT)
    docs = deployments(helm)
    for name in FUNCTIONS:
        [revision] = find(knative, "Service", name)["spec"]["template"]["spec"]["containers"]
        mine = container(docs, name)
        assert (mine["image"], mine["imagePullPolicy"], mine["resources"], mine["securityContext"]) == (
            revision["image"], revision["imagePullPolicy"], revision["resources"], revision["securityContext"])
        assert [e for e in mine["env"] if e["name"] != "PORT"] == revision["env"]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_non_root_read_only(helm, name):
    docs = deployments(helm)
    spec = pod_spec(docs, name)
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    security = container(docs, name)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("name, scheme", [("bind", "HTTP"), ("mutate", "HTTPS")])
def test_probes(helm, name, scheme):
    """httpGet by the kubelet on the health paths."""
    mine = container(deployments(helm), name)
    port = mine["ports"][0]["name"]
    assert mine["readinessProbe"]["httpGet"] == {"path": "/health/readiness", "port": port, "scheme": scheme}
    assert mine["livenessProbe"]["httpGet"] == {"path": "/health/liveness", "port": port, "scheme": scheme}
    # mutate drains 15 s after a SIGTERM: readiness fails, and the endpoints drop it, well before.
    probe = mine["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"] < 15


def test_mutate_serves_tls_with_the_chart_certificate(helm, tmp_path):
    """No cert-manager: a CA and a certificate for mutate.<namespace>.svc, generated into the
    Secret mutate serves from; the webhook calls the Service mutate and trusts that CA."""
    docs = deployments(helm, namespace="gpu-tls")
    secret = find(docs, "Secret", "mutate-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    webhook = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    assert webhook["clientConfig"] == {"caBundle": secret["data"]["ca.crt"],
                                       "service": {"namespace": "gpu-tls", "name": "mutate", "port": 443, "path": "/"}}
    assert "cert-manager.io/inject-ca-from" not in annotations(find(docs, "MutatingWebhookConfiguration", "gpu-scheduler"))
    for key in ("tls.crt", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    names = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt")],
                           capture_output=True, text=True, check=True).stdout
    assert "DNS:mutate.gpu-tls.svc" in names
    mine = container(docs, "mutate")
    [mount] = mine["volumeMounts"]
    assert pod_spec(docs, "mutate")["volumes"] == [{"name": mount["name"], "secret": {"secretName": "mutate-tls"}}]
    assert mine["command"] == ["gunicorn"]
    assert f"--certfile={mount['mountPath']}/tls.crt" in mine["args"] and f"--keyfile={mount['mountPath']}/tls.key" in mine["args"]
    assert "--config=python:serving.gunicorn_config" in mine["args"], "the image's server settings (keep-alive, drain)"


@pytest.mark.parametrize("args", [("--api-versions", "cert-manager.io/v1"), ("--set", "webhook.certManager=true")],
                         ids=["auto-with-cert-manager", "true"])
def test_mutate_certificate_from_cert_manager(helm, args):
    docs = deployments(helm, *args)
    assert not [doc for doc in docs if doc["kind"] == "Secret"], "cert-manager writes the Secret"
    certificate = find(docs, "Certificate", "mutate")["spec"]
    assert certificate["secretName"] == "mutate-tls" and f"mutate.{NS}.svc" in certificate["dnsNames"]
    issuers = {doc["metadata"]["name"]: doc["spec"] for doc in docs if doc["kind"] == "Issuer"}
    ca = find(docs, "Certificate", "mutate-ca")["spec"]
    assert issuers[certificate["issuerRef"]["name"]] == {"ca": {"secretName": ca["secretName"]}}
    assert ca["isCA"] is True and issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    configuration = find(docs, "MutatingWebhookConfiguration", "gpu-scheduler")
    assert annotations(configuration)["cert-manager.io/inject-ca-from"] == f"{NS}/mutate"
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]


def test_cert_manager_false_wins_over_a_cluster_that_has_it(helm):
    docs = deployments(helm, "--api-versions", "cert-manager.io/v1", "--set", "webhook.certManager=false")
    assert find(docs, "Secret", "mutate-tls") and not [doc for doc in docs if doc["kind"] in ("Certificate", "Issuer")]


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("knob", sorted(POD_KNOBS))
def test_each_pod_knob_reaches_its_deployment_only(helm, function, knob):
    docs = deployments(helm, "--set-json", f"{function}.{knob}={json.dumps(POD_KNOBS[knob])}")
    [other] = set(FUNCTIONS) - {function}
    assert pod_spec(docs, function)[knob] == POD_KNOBS[knob]
    assert knob not in pod_spec(docs, other)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_pod_annotations_and_resources(helm, function):
    resources = {"requests": {"cpu": "200m", "memory": "100Mi"}, "limits": {"memory": "1Gi"}}
    docs = deployments(helm, "--set-json", f"{function}.resources={json.dumps(resources)}",
                       "--set", f"{function}.podAnnotations.example\\.com/team=gpu")
    [other] = set(FUNCTIONS) - {function}
    assert find(docs, "Deployment", function)["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "gpu"}
    assert "annotations" not in find(docs, "Deployment", other)["spec"]["template"]["metadata"]
    assert container(docs, function)["resources"] == resources != container(docs, other)["resources"]


def test_custom_values_with_deployments(helm):
    """ci/custom-values.yaml (another namespace, registry, knobs) in this runtime: everything valid."""
    docs = template(helm, "-f", str(CI_VALUES["custom"]), "--set", "runtime=deployments")
    custom = yaml.safe_load(CI_VALUES["custom"].read_text())
    for name in FUNCTIONS:
        spec = pod_spec(docs, name)
        assert {knob: spec[knob] for knob in POD_KNOBS if knob in spec} == {
            knob: custom[name][knob] for knob in POD_KNOBS if knob in custom[name]}
    assert {doc["metadata"]["namespace"] for doc in docs if "namespace" in doc["metadata"]} == {custom["namespace"]["name"]}
    for doc in docs:
        errors = manifest_errors(doc, strict_preserved=True)
        assert not errors, f"{doc['kind']} {doc['metadata']['name']}:\n" + "\n".join(errors)


# -- the uninstall hook, both runtimes -------------------------------------------------------
RUNTIMES = {"knative": ("-f", DEFAULT), "deployments": DEPLOYMENTS}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_the_uninstall_hook(helm, runtime):
    docs = template(helm, *RUNTIMES[runtime])
    hooks = [doc for doc in docs if annotations(doc).get("helm.sh/hook") == "pre-delete"]
    assert {(doc["kind"], doc["metadata"]["name"]) for doc in hooks} == HOOK_OBJECTS
    for hook in hooks:
        # Replaced by a next try, deleted once it succeeded: nothing of it lingers.
        assert set(annotations(hook)["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
    weights = {(doc["kind"], doc["metadata"]["name"]): int(annotations(doc)["helm.sh/hook-weight"]) for doc in hooks}
    assert max(w for key, w in weights.items() if key[0] != "Job") < weights[("Job", "uninstall")], "its account first"
    job = find(docs, "Job", "uninstall")
    assert job["metadata"]["namespace"] == NS
    spec = job["spec"]["template"]["spec"]
    assert (spec["serviceAccountName"], spec["restartPolicy"]) == ("uninstall", "Never")
    [mine] = spec["containers"]
    bind_image = (container(docs, "bind")["image"] if runtime == "deployments"
                  else find(docs, "Service", "bind")["spec"]["template"]["spec"]["containers"][0]["image"])
    assert mine["image"] == bind_image, "bind's image: it holds functions/bind/uninstall.py"
    assert mine["command"] == ["python", "functions/bind/uninstall.py", f"--namespace={NS}",
                               "--cluster-role-binding=gpu-scheduler-bind", "--role-binding=bind-records"]
    # the bindings it revokes are bind's own
    assert find(docs, "ClusterRoleBinding", "gpu-scheduler-bind")["subjects"][0]["name"] == "bind"
    assert find(docs, "RoleBinding", "bind-records")["subjects"][0]["name"] == "bind"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    assert mine["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_the_uninstall_account_is_granted_exactly_what_it_does(helm, runtime):
    """permissions.UNINSTALL cluster-wide and UNINSTALL_RECORDS in the namespace, no more and no
    less; the two bindings it deletes by name, bind's and no other."""
    docs = template(helm, *RUNTIMES[runtime])
    assert account_grants("uninstall", docs, NS) == {"cluster": permissions.UNINSTALL, NS: permissions.UNINSTALL_RECORDS}
    rules = find(docs, "ClusterRole", "gpu-scheduler-uninstall")["rules"] + find(docs, "Role", "uninstall")["rules"]
    named = {resource: rule.get("resourceNames") for rule in rules for resource in rule["resources"]}
    assert named == {"clusterrolebindings": ["gpu-scheduler-bind"], "rolebindings": ["bind-records"], "nodes": None,
                     "nodes/status": None, "leases": None}


def test_the_uninstall_calls_are_the_granted_ones():
    """What uninstall.py calls on kubeapi's client, by CALLS: exactly the two permission sets."""
    from kubeapi.client import CALLS
    source = (REPO / "functions" / "bind" / "uninstall.py").read_text()
    used = {need for method, need in CALLS.items() if f"api.{method}(" in source}
    assert used == permissions.UNINSTALL | permissions.UNINSTALL_RECORDS


def test_advertised_finds_only_our_resources():
    node = {"metadata": {"name": "n"}, "status": {
        "capacity": {"cpu": "4", "nvidia.com/gpu": "4", "gpu-scheduler.io/gpu": "100000",
                     "product.gpu-scheduler.io/Tesla-T4": "100000"},
        "allocatable": {"cpu": "4", "gpu-scheduler.io/gpu": "100000"}}}
    assert uninstall.advertised(node) == {"capacity": ["gpu-scheduler.io/gpu", "product.gpu-scheduler.io/Tesla-T4"],
                                          "allocatable": ["gpu-scheduler.io/gpu"]}
    assert uninstall.advertised({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "1"}}}) == {}
    assert uninstall.advertised({"metadata": {"name": "n"}}) == {}


# -- the API server --------------------------------------------------------------------------
@pytest.mark.controlplane
@pytest.mark.parametrize("args", [(), ("--api-versions", "cert-manager.io/v1")], ids=["chart-certificate", "cert-manager"])
def test_server_accepts_every_object(helm, crds, args, tmp_path):
    """`kubectl apply --dry-run=server --validate=strict` of the release's objects, then of its
    hooks (as helm runs them: the helm test Pod's account exists by then, so it is made here)."""
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    docs = deployments(helm, *args, namespace=namespace)
    hooks = [doc for doc in docs if is_hook(doc)]
    subprocess.run([*crds, "create", "namespace", namespace], check=True, capture_output=True, timeout=60)
    try:
        server_dry_run(crds, [doc for doc in docs if doc not in hooks], tmp_path / "release.yaml")
        subprocess.run([*crds, "-n", namespace, "create", "serviceaccount", "plan-test"], check=True, capture_output=True,
                       timeout=60)
        server_dry_run(crds, hooks, tmp_path / "hooks.yaml")
        assert {(doc["kind"], doc["metadata"]["name"]) for doc in hooks} == HOOK_OBJECTS | {("Pod", "plan-test")}
    finally:
        subprocess.run([*crds, "delete", "namespace", namespace, "--wait=false"], capture_output=True, timeout=60)


def test_the_uninstall_hook_can_be_turned_off(helm):
    """uninstall.enabled false (the Argo CD Applications: Argo CD runs no pre-delete hook)."""
    for runtime in RUNTIMES.values():
        docs = template(helm, *runtime, "--set", "uninstall.enabled=false")
        assert not [doc for doc in docs if annotations(doc).get("helm.sh/hook") == "pre-delete"]
        assert not [doc for doc in docs if "uninstall" in doc["metadata"]["name"]]
