"""The KinD + Knative deployment, checked offline: every manifest against its published schema
(unknown fields are errors), RBAC against gpu_scheduler.permissions, the Dockerfiles, the scripts,
and the names that tie the pieces together. Each validator is also shown to catch a typo.
knative/*.yaml and functions/*/func.yaml are rendered from the chart (`make manifests`);
tests/test_chart.py checks the chart itself with other values, and that they do not drift.

What needs a real cluster (DNS from the API server, TLS through Kourier, event delivery) is
checked by `make verify` instead; see docs/kind.md.
"""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import gpu_scheduler
from gpu_scheduler import permissions
from schemas import (
    REPO, SCHEMAS, SUPPORTED_MINORS, core_errors, custom_resource_errors, func_errors, granted, kind_node_image,
    kubernetes_version, load_documents, manifest_errors, metadata_errors,
)

KNATIVE = REPO / "knative"
KIND = REPO / "kind"
NAMESPACE = "gpu-scheduler"
YAML_FILES = sorted([*KNATIVE.glob("*.yaml"), *KIND.rglob("*.yaml"), *(REPO / "check").glob("*.yaml"),
                     *(REPO / "functions").glob("*/func.yaml")])
# Kubernetes objects; kind/cluster.yaml (kind's own config) and the kubeadm patch are checked apart.
NOT_OBJECTS = {KIND / "cluster.yaml", KIND / "patches" / "kube-apiserver+strategic.yaml", KIND / "values.yaml",
               REPO / "functions" / "bind" / "func.yaml", REPO / "functions" / "mutate" / "func.yaml"}
MANIFESTS = [path for path in YAML_FILES if path not in NOT_OBJECTS]
FUNCTIONS = ("bind", "mutate")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def objects(*paths: Path) -> list[dict]:
    return [doc for path in (paths or MANIFESTS) for doc in load_documents(path)]


def find(kind: str, name: str, paths: tuple[Path, ...] = ()) -> dict:
    matches = [doc for doc in objects(*paths) if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def func_yaml(name: str) -> dict:
    return load_documents(REPO / "functions" / name / "func.yaml")[0]


def ksvc(name: str) -> dict:
    return find("Service", name, (KNATIVE / f"{name}-service.yaml",))


def kind_mk_variables() -> dict[str, str]:
    """The `VAR ?= value` settings of kind/kind.mk, with $(VAR) references expanded."""
    raw = dict(re.findall(r"^([A-Z_]+) \?= (.*)$", (KIND / "kind.mk").read_text(), re.M))
    expand = lambda value: re.sub(r"\$\(([A-Z_]+)\)", lambda m: expand(raw[m[1]]), value)
    return {name: expand(value) for name, value in raw.items()}


# -- parsing and schemas ---------------------------------------------------------------------
def test_schemas_are_there():
    assert (SCHEMAS / "README.md").is_file(), f"the published schemas are expected at {SCHEMAS}"


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_yaml_parses(path):
    documents = load_documents(path)
    assert documents, f"{rel(path)} holds no YAML document"
    assert all(isinstance(doc, dict) for doc in documents)


@pytest.mark.parametrize("path", MANIFESTS, ids=rel)
def test_manifest_validates(path):
    for doc in load_documents(path):
        errors = manifest_errors(doc)
        assert not errors, f"{rel(path)}: {doc['kind']} {doc['metadata']['name']}:\n" + "\n".join(errors)


@pytest.mark.parametrize("path", MANIFESTS, ids=rel)
def test_no_unlisted_field_even_where_the_schema_preserves_unknown_fields(path):
    """Stricter than the API server: where a CRD lists fields but also preserves unknown ones
    (ApiServerSource's spec does), a typo is kept and ignored, e.g. `mdoe: Resource` would make
    the source send Reference events, which bind does not handle."""
    for doc in load_documents(path):
        if doc["apiVersion"].partition("/")[0] in ("v1", "apps", "rbac.authorization.k8s.io",
                                                   "admissionregistration.k8s.io"):
            continue
        errors = custom_resource_errors(doc, strict_preserved=True)
        assert not errors, f"{rel(path)}: {doc['kind']} {doc['metadata']['name']}:\n" + "\n".join(errors)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_func_yaml_validates(name):
    errors = func_errors(func_yaml(name))
    assert not errors, f"functions/{name}/func.yaml:\n" + "\n".join(errors)


def test_every_manifest_kind_has_a_validator():
    kinds = {(doc["apiVersion"], doc["kind"]) for doc in objects()}
    assert {("sources.knative.dev/v1", "ApiServerSource"), ("sources.knative.dev/v1", "PingSource"),
            ("serving.knative.dev/v1", "Service"), ("cert-manager.io/v1", "Certificate"),
            ("cert-manager.io/v1", "ClusterIssuer"),
            ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")} <= kinds


# -- each validator catches a misspelled field ---------------------------------------------------
def rename(doc: dict, path: str, new_key: str) -> dict:
    """A copy of doc with the key at dotted `path` (list indices as numbers) renamed."""
    doc = copy.deepcopy(doc)
    *parents, key = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[new_key] = node.pop(key)
    return doc


def test_custom_resource_validator_catches_a_typo():
    source = find("ApiServerSource", "pod-events")
    assert not custom_resource_errors(source)
    typo = rename(source, "spec.resources.0.selector", "selectr")
    assert any("selectr" in error for error in custom_resource_errors(typo))


def test_preserved_spec_typo_needs_the_stricter_check():
    """spec.mode -> spec.mdoe: ApiServerSource's spec preserves unknown fields, so the published
    schema (and the API server) accept it; the stricter check catches it."""
    typo = rename(find("ApiServerSource", "pod-events"), "spec.mode", "mdoe")
    assert not custom_resource_errors(typo), "the rule changed: the plain schema now catches this"
    assert any("mdoe" in error for error in custom_resource_errors(typo, strict_preserved=True))


@pytest.mark.parametrize("kind, name, path, typo", [
    ("Service", "mutate", "spec.template.spec.containers.0.imagePullPolicy", "imagePulPolicy"),
    ("PingSource", "resync", "spec.schedule", "schedul"),
    ("Certificate", "knative-selfsigned-ca", "spec.isCA", "isCa"),
    ("ClusterIssuer", "knative-selfsigned-issuer", "spec.ca.secretName", "secretname"),
])
def test_custom_resource_validator_catches_typos_in_every_kind(kind, name, path, typo):
    doc = find(kind, name)
    assert not custom_resource_errors(doc)
    assert any(typo in error for error in custom_resource_errors(rename(doc, path, typo)))


def test_metadata_validator_catches_a_typo():
    doc = rename(find("MutatingWebhookConfiguration", "gpu-scheduler"), "metadata.annotations", "annotaions")
    assert any("annotaions" in error for error in metadata_errors(doc["metadata"]))
    assert any("annotaions" in error for error in custom_resource_errors(
        rename(find("PingSource", "resync"), "metadata.namespace", "annotaions")))


@pytest.mark.parametrize("kind, name, path, typo", [
    ("StatefulSet", "gpu-scheduler-check", "spec.template.spec.schedulerName", "schedulername"),
    ("MutatingWebhookConfiguration", "gpu-scheduler", "webhooks.0.matchConditions", "matchCondition"),
    ("ClusterRoleBinding", "gpu-scheduler-bind", "roleRef.apiGroup", "apigroup"),
    ("ServiceAccount", "pod-events", "metadata.namespace", "metadata.namespce"),
])
def test_core_validator_catches_a_typo(kind, name, path, typo):
    doc = find(kind, name)
    assert not core_errors(doc)
    assert core_errors(rename(doc, path, typo)), f"{typo} was accepted"


def test_func_validator_catches_a_typo():
    doc = func_yaml("mutate")
    assert not func_errors(doc)
    errors = func_errors(rename(doc, "deploy.serviceAccountName", "serviceAcountName"))
    assert any("serviceAcountName" in error for error in errors)


# -- the kind cluster ------------------------------------------------------------------------
def test_kind_cluster_has_named_workers_and_the_quickstart_port():
    config = load_documents(KIND / "cluster.yaml")[0]
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    roles = [node["role"] for node in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker", "worker", "worker"]
    names = []
    for node in config["nodes"][1:]:
        patches = [yaml.safe_load(patch) for patch in node["kubeadmConfigPatches"]]
        names += [p["nodeRegistration"]["name"] for p in patches if p["kind"] == "JoinConfiguration"]
    assert names == ["node1", "node2", "node3", "node4"]
    mappings = config["nodes"][0]["extraPortMappings"]
    assert [(m["containerPort"], m["hostPort"]) for m in mappings] == [(31080, 80)]
    assert any(doc["spec"]["ports"][0]["nodePort"] == 31080 for doc in objects(KIND / "kourier-nodeport.yaml"))


def test_kind_node_is_pinned_and_new_enough_for_the_manifests():
    assert "@sha256:" in kind_node_image()
    major, minor = map(int, kubernetes_version().split("."))
    assert (major, minor) >= (1, 30), "matchConditions in the webhook need Kubernetes >= 1.30 (GA)"


def test_apiserver_patch_gives_cluster_dns():
    patch = load_documents(KIND / "patches" / "kube-apiserver+strategic.yaml")[0]
    assert patch == {"spec": {"dnsPolicy": "ClusterFirstWithHostNet"}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kube-apiserver"},
           "spec": {"hostNetwork": True, "containers": [{"name": "kube-apiserver", "image": "x"}], **patch["spec"]}}
    assert not core_errors(pod)
    up = (KIND / "kind-up.sh").read_text()
    assert "kube-apiserver+strategic.yaml" in up and "--patches /kind/patches" in up


def test_check_map_names_only_kind_nodes():
    sts = find("StatefulSet", "gpu-scheduler-check")
    template = sts["spec"]["template"]
    assert template["spec"]["schedulerName"] == gpu_scheduler.SCHEDULER_NAME
    entries = template["metadata"]["annotations"][gpu_scheduler.ANNOTATION].split()
    assert {entry.split("=")[1].split(":")[0] for entry in entries} <= {"node1", "node2", "node3", "node4"}


# -- RBAC ------------------------------------------------------------------------------------
def account_grants(account: str, docs: list[dict] | None = None,
                   namespace: str = NAMESPACE) -> dict[str, set[tuple[str, str, str]]]:
    """What `docs` (knative/rbac.yaml by default) grant ServiceAccount <namespace>/<account>, by
    where it applies: "cluster" for ClusterRoleBindings, the namespace of each RoleBinding."""
    docs = objects(KNATIVE / "rbac.yaml") if docs is None else docs
    roles = {(doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]): doc
             for doc in docs if doc["kind"] in ("ClusterRole", "Role")}
    result: dict[str, set] = {}
    for binding in (doc for doc in docs if doc["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} in binding["subjects"]:
            where = binding["metadata"].get("namespace")
            role_kind = binding["roleRef"]["kind"]
            role = roles[(role_kind, where if role_kind == "Role" else None, binding["roleRef"]["name"])]
            result.setdefault(where or "cluster", set()).update(granted(role["rules"]))
    return result


def test_bind_is_granted_exactly_permissions_bind():
    """permissions.BIND everywhere (a ClusterRole), BIND_RECORDS in its own namespace (a Role)."""
    expected = {"cluster": permissions.BIND, NAMESPACE: permissions.BIND_RECORDS}
    assert account_grants(ksvc("bind")["spec"]["template"]["spec"]["serviceAccountName"]) == expected
    assert account_grants(func_yaml("bind")["deploy"]["serviceAccountName"]) == expected


def test_event_source_is_granted_exactly_permissions_event_source():
    source = find("ApiServerSource", "pod-events")
    assert account_grants(source["spec"]["serviceAccountName"]) == {"cluster": permissions.EVENT_SOURCE}


def test_mutate_is_granted_exactly_permissions_mutate():
    account = ksvc("mutate")["spec"]["template"]["spec"]["serviceAccountName"]
    assert account == func_yaml("mutate")["deploy"]["serviceAccountName"]
    assert account_grants(account) == {"cluster": permissions.MUTATE}


def test_rbac_binds_only_our_accounts_and_roles_only_in_our_namespace():
    """Every binding names a ServiceAccount that exists; Roles and RoleBindings (bind's records)
    only in gpu-scheduler's own namespace."""
    accounts = {doc["metadata"]["name"] for doc in objects() if doc["kind"] == "ServiceAccount"}
    for doc in objects():
        if doc["kind"] in ("Role", "RoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert all(s["namespace"] == NAMESPACE and s["name"] in accounts for s in doc["subjects"])


# -- cross-links -----------------------------------------------------------------------------
def test_apiserversource_watches_the_pods_mutate_labels():
    spec = find("ApiServerSource", "pod-events")["spec"]
    assert spec["mode"] == "Resource"
    assert spec["namespaceSelector"] == {}, "an empty selector: all namespaces"
    [resource] = spec["resources"]
    assert (resource["apiVersion"], resource["kind"]) == ("v1", "Pod")
    assert resource["selector"] == {"matchLabels": {gpu_scheduler.MANAGED_LABEL: gpu_scheduler.MANAGED_VALUE}}


@pytest.mark.parametrize("kind, name", [("ApiServerSource", "pod-events"), ("PingSource", "resync")])
def test_sinks_name_the_bind_service(kind, name):
    source = find(kind, name)
    assert source["metadata"]["namespace"] == NAMESPACE
    bind = ksvc("bind")
    assert source["spec"]["sink"] == {"ref": {"apiVersion": bind["apiVersion"], "kind": "Service",
                                              "name": bind["metadata"]["name"], "namespace": bind["metadata"]["namespace"]}}
    assert func_yaml("bind")["name"] == bind["metadata"]["name"]


def test_pingsource_runs_every_minute():
    assert find("PingSource", "resync")["spec"]["schedule"] == "* * * * *"


def test_webhook_calls_the_mutate_service():
    webhook_config = find("MutatingWebhookConfiguration", "gpu-scheduler")
    webhook = webhook_config["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    mutate = ksvc("mutate")
    assert webhook["clientConfig"]["service"] == {"namespace": mutate["metadata"]["namespace"],
                                                  "name": mutate["metadata"]["name"], "port": 443, "path": "/"}
    assert (func_yaml("mutate")["name"], func_yaml("mutate")["namespace"]) == ("mutate", NAMESPACE)
    assert "caBundle" not in webhook["clientConfig"], "cert-manager injects it"


def test_the_workload_objects_templates_are_admitted_with_the_pods_settings():
    """With quotas on, mutate also admits StatefulSets, Jobs, JobSets and LeaderWorkerSets whose
    templates carry a map (gpu_scheduler/templatecount.py), with the pods' webhook's settings."""
    pods, *templates = find("MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"]
    assert [(w["rules"][0]["apiGroups"], w["rules"][0]["resources"], w["rules"][0]["operations"]) for w in templates] == [
        ([group], [resource], ["CREATE", "UPDATE"]) for group, resource in (
            ("apps", "statefulsets"), ("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"))]
    for webhook in templates:
        assert {k: v for k, v in webhook.items() if k not in ("name", "rules", "matchConditions")} == {
            k: v for k, v in pods.items() if k not in ("name", "rules", "matchConditions")}
        [condition] = webhook["matchConditions"]
        assert f"'{gpu_scheduler.ANNOTATION}' in " in condition["expression"]


def test_webhook_rules_and_safety():
    webhook = find("MutatingWebhookConfiguration", "gpu-scheduler")["webhooks"][0]  # the pods' (the templates' follow, quotas on)
    assert webhook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                 "resources": ["pods"], "scope": "Namespaced"}]
    assert (webhook["failurePolicy"], webhook["sideEffects"], webhook["reinvocationPolicy"]) == ("Fail", "None", "IfNeeded")
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["timeoutSeconds"] <= 10
    [condition] = webhook["matchConditions"]
    assert f"'{gpu_scheduler.ANNOTATION}' in object.metadata.annotations" in condition["expression"]
    [expression] = webhook["namespaceSelector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/metadata.name", "NotIn")
    assert {"kube-system", "knative-serving", "knative-eventing", "kourier-system", "cert-manager",
            NAMESPACE} <= set(expression["values"])


def test_webhook_ca_comes_from_the_cluster_local_issuer():
    annotation = find("MutatingWebhookConfiguration", "gpu-scheduler")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = annotation.split("/")
    issuers = KIND / "cert-manager-issuers.yaml"
    ca = find("Certificate", name, (issuers,))
    assert ca["metadata"]["namespace"] == namespace == "cert-manager"
    assert ca["spec"]["isCA"] is True
    issuer = find("ClusterIssuer", "knative-selfsigned-issuer", (issuers,))
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    up = (KIND / "kind-up.sh").read_text()
    assert '"clusterLocalIssuerRef":"kind: ClusterIssuer\\nname: knative-selfsigned-issuer\\n"' in up
    assert '"cluster-local-domain-tls":"Enabled"' in up


@pytest.mark.parametrize("name", FUNCTIONS)
def test_func_yaml_and_knative_service_agree(name):
    fn, service = func_yaml(name), ksvc(name)
    template = service["spec"]["template"]
    [container] = template["spec"]["containers"]
    assert (fn["name"], fn["namespace"]) == (service["metadata"]["name"], service["metadata"]["namespace"])
    assert fn["image"] == container["image"]
    assert fn["deploy"]["serviceAccountName"] == template["spec"]["serviceAccountName"]
    # func.yaml is rendered for func users' webhook.path, direct-service (functions/func-values.yaml;
    # knative/ is kind's, knative-route): mutate serves the webhook's TLS itself, from its Secret.
    tls = [{"name": "WEBHOOK_TLS_PORT", "value": "8443"}, {"name": "WEBHOOK_TLS_DIR", "value": "/var/run/gpu-scheduler/tls"}]
    assert fn["run"]["envs"] == container["env"] + (tls if name == "mutate" else [])
    assert fn["run"].get("volumes") == ([{"secret": "mutate-webhook-tls", "path": "/var/run/gpu-scheduler/tls"}]
                                        if name == "mutate" else None)
    assert fn["deploy"]["healthEndpoints"] == {"liveness": container["livenessProbe"]["httpGet"]["path"],
                                               "readiness": container["readinessProbe"]["httpGet"]["path"]}
    labels = {label["key"]: label["value"] for label in fn["deploy"]["labels"]}
    assert labels == {"networking.knative.dev/visibility": "cluster-local"}
    assert service["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
    assert fn["deploy"]["options"]["resources"] == container["resources"]
    scale = fn["deploy"]["options"]["scale"]
    annotations = template["metadata"]["annotations"]
    assert (str(scale["min"]), str(scale["max"])) == (annotations["autoscaling.knative.dev/min-scale"],
                                                      annotations["autoscaling.knative.dev/max-scale"])


def test_mutate_never_scales_to_zero():
    assert func_yaml("mutate")["deploy"]["options"]["scale"]["min"] >= 1
    assert int(ksvc("mutate")["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"]) >= 1


# The functions' own variables, and functions-framework's server settings (THREADS, ...), which
# localcp/mutate_gunicorn.py reads too.
@pytest.mark.parametrize("name, variables", [
    ("bind", {"LOG_LEVEL", "RESYNC_CONCURRENCY", "THREADS", "GPU_SCHEDULER_QUOTA", "GPU_SCHEDULER_DRA",
              "GPU_SCHEDULER_DRA_DEVICE_CLASS", "DEVICE_ENV_MODE"}),
    ("mutate", {"LOG_LEVEL", "DEVICE_ENV_MODE", "GPU_SCHEDULER_QUOTA", "WORKERS", "THREADS",
                "WEBHOOK_TLS_PORT", "WEBHOOK_TLS_DIR"})])  # the last two: serving/gunicorn_config.py's
def test_functions_get_the_configuration_they_read(name, variables):
    assert {env["name"] for env in func_yaml(name)["run"]["envs"]} == variables
    served = (REPO / "serving" / "gunicorn_config.py").read_text()
    assert all(f'"{variable}"' in served for variable in variables if variable.startswith("WEBHOOK_TLS_"))
    source = (REPO / "functions" / name / "main.py").read_text()
    for path in func_yaml(name)["deploy"]["healthEndpoints"].values():
        assert path in source, f"functions/{name}/main.py does not serve {path}"


def test_image_names_match_what_kind_mk_builds():
    variables = kind_mk_variables()
    assert func_yaml("bind")["image"] == ksvc("bind")["spec"]["template"]["spec"]["containers"][0]["image"] == variables["BIND_IMAGE"]
    assert func_yaml("mutate")["image"] == ksvc("mutate")["spec"]["template"]["spec"]["containers"][0]["image"] == variables["MUTATE_IMAGE"]
    [check] = find("StatefulSet", "gpu-scheduler-check")["spec"]["template"]["spec"]["containers"]
    assert check["image"] == variables["CHECK_IMAGE"] == "kind.local/gpu-scheduler-check:latest"
    # kind/lib.sh's defaults (scripts run without make) are the same names.
    defaults = dict(re.findall(r'^([A-Z_]+)="\$\{\1:-([^}]*)\}"$', (KIND / "lib.sh").read_text(), re.M))
    for name in ("BIND_IMAGE", "MUTATE_IMAGE", "CHECK_IMAGE", "KIND_CLUSTER"):
        assert defaults[name] == variables[name], name
    assert yaml.safe_load((KIND / "cluster.yaml").read_text())["name"] == variables["KIND_CLUSTER"]
    # Tags other than :latest: the kubelet's default pull policy is then IfNotPresent.
    assert not variables["BIND_IMAGE"].endswith(":latest") and not variables["MUTATE_IMAGE"].endswith(":latest")


def test_knative_releases_match_the_validated_schemas():
    """kind-up installs the releases whose CRDs the tests validate against."""
    readme = (SCHEMAS / "README.md").read_text()
    defaults = dict(re.findall(r'^([A-Z_]+)="\$\{\1:-([^}]*)\}"$', (KIND / "lib.sh").read_text(), re.M))
    for variable in ("SERVING_VERSION", "EVENTING_VERSION", "CERT_MANAGER_VERSION"):
        assert defaults[variable] in readme, f"{variable}={defaults[variable]} is not the version in {SCHEMAS}/README.md"
    assert all(defaults[v].startswith("knative-v1.21.") for v in ("SERVING_VERSION", "KOURIER_VERSION", "EVENTING_VERSION"))


# -- Dockerfiles -----------------------------------------------------------------------------
def instructions(path: Path) -> list[tuple[str, str]]:
    lines = re.sub(r"\\\n", " ", path.read_text()).splitlines()
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in lines
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name", ["bind", "mutate", "check"])
def test_dockerfile_is_pinned_small_and_non_root(name):
    steps = instructions(REPO / f"Dockerfile.{name}")
    stages = {args.split()[-1] for op, args in steps if op == "FROM" and " AS " in args.upper()}
    bases = [args.split()[0] for op, args in steps if op == "FROM"]
    for base in bases:
        if base in stages:
            continue
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?@sha256:[0-9a-f]{64}", base), f"{base} is not a pinned slim Python 3.11"
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    users = [args for op, args in final if op == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} is not a numeric non-root user"
    text = (REPO / f"Dockerfile.{name}").read_text()
    assert "requirements-dev" not in text and "pytest" not in text


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_dockerfile_runs_the_function(name):
    steps = instructions(REPO / f"Dockerfile.{name}")
    [entrypoint] = [yaml.safe_load(args) for op, args in steps if op == "ENTRYPOINT"]
    # functions-framework's app under gunicorn with the settings long-lived clients need, which
    # functions-framework's CLI cannot be given (serving/gunicorn_config.py).
    assert entrypoint == ["gunicorn", "--config", "python:serving.gunicorn_config",
                          f'functions_framework:create_app(target="{name}", source="functions/{name}/main.py")']
    copies = [args for op, args in steps if op == "COPY"]
    assert f"functions/{name}/requirements.txt /tmp/requirements.txt" in copies
    assert "gpu_scheduler /src/gpu_scheduler" in copies, "the core package goes into the image"
    assert "serving /src/serving" in copies, "the HTTP serving pieces go into the image"
    assert f"functions/{name} /app/functions/{name}" in copies
    if name == "bind":
        assert "kubeapi /src/kubeapi" in copies, "bind's API client goes into its image"
        # The chart's `helm test` runs the kubectl plugin from bind's image (templates/tests/).
        assert "kubectl_gpu_scheduler /src/kubectl_gpu_scheduler" in copies, "the plugin goes into bind's image"


def test_dockerignore_sends_only_what_the_images_copy():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    assert {"!gpu_scheduler/", "!serving/", "!kubeapi/", "!kubectl_gpu_scheduler/", "!functions/", "!pyproject.toml",
            "!check/check.py"} <= set(patterns)


# -- scripts and make targets ----------------------------------------------------------------
SCRIPTS = sorted(path for path in KIND.glob("*.sh") if path.name != "lib.sh")


@pytest.mark.parametrize("path", SCRIPTS, ids=rel)
def test_script_is_strict_and_checks_prerequisites(path):
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert 'source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"' in text
    assert re.search(r"^\s*(?:\w+\)\s*)?require [a-z0-9 ]+", text, re.M), "no prerequisite check"
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_prerequisites_cover_every_tool():
    required = set()
    for path in SCRIPTS:
        for line in re.findall(r"^\s*(?:\w+\)\s*)?require ([a-z0-9 ]+?)\s*(?:;;)?$", path.read_text(), re.M):
            required |= set(line.split())
    assert {"docker", "kind", "kubectl", "kn", "helm"} <= required


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed")
def test_scripts_pass_shellcheck():
    subprocess.run(["shellcheck", "-x", *map(str, [*SCRIPTS, KIND / "lib.sh"])], check=True, cwd=REPO)


def test_kind_mk_has_the_targets():
    text = (KIND / "kind.mk").read_text()
    for target in ("up", "kind-up", "images", "deploy", "check", "verify", "down"):
        assert re.search(rf"^{target}:", text, re.M), target
        if target != "up":
            assert (KIND / f"{target}.sh").is_file()
    up = re.search(r"^up:\n((?:\t.*\n)+)", text, re.M)[1]
    assert re.findall(r"KIND_MAKE\) ([\w-]+)", up) == ["kind-up", "images", "deploy", "check", "verify"]


def test_core_objects_are_validated_for_the_oldest_and_newest_tested_minor():
    """SUPPORTED_MINORS follows the compatibility run's versions and the chart's kubeVersion."""
    from localcp.compat import VERSIONS
    from localcp.versions import minor

    tested = [f"1.{minor(v)}" for v in VERSIONS]
    assert SUPPORTED_MINORS == (tested[0], tested[-1])
    chart = yaml.safe_load((REPO / "chart" / "gpu-scheduler" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={tested[0]}.0-0"
    # A field the oldest minor lacks (spec.schedulingGroup, 1.36+) is an error there.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "x"}], "schedulingGroup": {"podGroupName": "g"}}}
    assert [e.split(":")[0] for e in core_errors(pod)] == ["Kubernetes 1.33", "Kubernetes 1.34"]
