"""Argo CD (argocd/): the AppProject, the seed Application and the ApplicationSet.

- Each Application is rendered as Argo CD's repo server renders it (reposerver/repository's
  helmTemplate in argo-cd v3.2.0): real helm, `helm template <path> --name-template <release>
  --namespace <destination> --kube-version <cluster> --set/--set-string <parameters> --values
  <valueFiles, relative to the chart's path and inside the repository> --values <values,
  valuesObject> --include-crds`; a directory source is its files that match `include`. The
  ApplicationSet's template is expanded for each cluster of argocd/clusters/ and for a cluster
  without a file (only `{{.name}}`, `{{.nameNormalized}}` and `{{.server}}`, checked: no other
  template expression may be left). A field of a source this emulation does not know fails.
- Every object has its sync wave, in the order namespace and RBAC, mutate and its webhook, bind
  and its sources, the check workload.
- The AppProject allows exactly the kinds the Applications render (no more: least privilege, no
  fewer: a kind the chart gains fails here), their repository and their destinations.
- The stack's real API server (its version: localcp/versions.env) holding Argo CD v3.2.0's CRDs (localcp/fetch-argocd-crds.sh, from its
  Go module) accepts every Argo CD object with `--dry-run=server --validate=strict`, the
  ApplicationSet's generated Applications included, and refuses a misspelled field; it accepts
  every object each Application renders, with the Knative and cert-manager CRDs installed.
"""
from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from localcp.cluster import KUBERNETES_VERSION
from schemas import REPO, load_documents
from test_chart import crds, helm, manifests  # noqa: F401  (fixtures: helm, the Knative and cert-manager CRDs)

ARGOCD = REPO / "argocd"
MANIFESTS = {name: ARGOCD / f"{name}.yaml" for name in ("project", "application", "applicationset")}
CLUSTERS = ARGOCD / "clusters"
# What Argo CD passes as --kube-version: the destination cluster's version (here the stack's).
KUBE_VERSION = KUBERNETES_VERSION.lstrip("v")
WAVE = "argocd.argoproj.io/sync-wave"
# The order of the issue: namespace and RBAC, then mutate and its webhook, then bind and the
# sources, then the check workload.
WAVES = {
    "0": {("", "Namespace"), ("", "ServiceAccount"), ("rbac.authorization.k8s.io", "ClusterRole"),
          ("rbac.authorization.k8s.io", "ClusterRoleBinding"), ("rbac.authorization.k8s.io", "Role"),
          ("rbac.authorization.k8s.io", "RoleBinding")},
    "1": {("serving.knative.dev", "Service", "mutate"), ("", "Service"), ("cert-manager.io", "Certificate"),
          ("cert-manager.io", "Issuer"), ("admissionregistration.k8s.io", "MutatingWebhookConfiguration")},
    "2": {("serving.knative.dev", "Service", "bind"), ("sources.knative.dev", "ApiServerSource"),
          ("sources.knative.dev", "PingSource"),
          # sink.path direct-service: bind's Service, with bind (the names of the chart's default and of ci/custom-values.yaml)
          ("", "Service", "bind-events"), ("", "Service", "gpu-bind-events")},
    "3": {("apps", "StatefulSet")},
}
# Fields of a source the emulation below knows; any other fails the test rather than be ignored.
HELM_FIELDS = {"releaseName", "valueFiles", "ignoreMissingValueFiles", "parameters", "values", "valuesObject"}
SOURCE_FIELDS = {"repoURL", "targetRevision", "path", "helm", "directory"}
DIRECTORY_FIELDS = {"include"}


def document(name: str) -> dict:
    [doc] = load_documents(MANIFESTS[name])
    return doc


def group_kind(doc: dict) -> tuple[str, str]:
    return doc["apiVersion"].rpartition("/")[0], doc["kind"]


# -- the Applications, as Argo CD makes them -------------------------------------------------
def cluster_names() -> list[str]:
    return sorted(path.stem for path in CLUSTERS.glob("*.yaml"))


def expand(template: dict, params: dict[str, str]) -> dict:
    """The ApplicationSet's template for one cluster: its `{{.key}}` replaced (goTemplate)."""
    text = json.dumps(template)
    for key, value in params.items():
        text = text.replace("{{." + key + "}}", value)
    assert "{{" not in text, f"a template expression this test does not expand: {text}"
    return json.loads(text)


def applications() -> dict[str, dict]:
    """Every Application: the seed's, and the ApplicationSet's for each cluster with a values
    file of its own and for one without (its cluster Secret's name, nameNormalized, server)."""
    seed = document("application")
    apps = {seed["metadata"]["name"]: seed}
    appset = document("applicationset")
    for name in [*cluster_names(), "no-values-file"]:
        params = {"name": name, "nameNormalized": name, "server": f"https://{name}.clusters.example.com:6443"}
        app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
               **expand(appset["spec"]["template"], params)}
        app["metadata"]["namespace"] = appset["metadata"]["namespace"]
        apps[app["metadata"]["name"]] = app
    return apps


def sources(app: dict) -> list[dict]:
    return app["spec"].get("sources") or [app["spec"]["source"]]


def helm_template_args(app: dict, source: dict, workdir: Path) -> list[str]:
    """The arguments of Argo CD's `helm template` for a Helm source of `app`."""
    settings = source.get("helm", {})
    assert set(settings) <= HELM_FIELDS, f"helm fields not emulated: {set(settings) - HELM_FIELDS}"
    chart = REPO / source["path"]
    args = [str(chart), "--name-template", settings.get("releaseName") or app["metadata"]["name"],
            "--namespace", app["spec"]["destination"]["namespace"], "--kube-version", KUBE_VERSION]
    for parameter in settings.get("parameters", []):
        flag = "--set-string" if parameter.get("forceString") else "--set"
        args += [flag, f"{parameter['name']}={parameter['value']}"]
    for value_file in settings.get("valueFiles", []):
        path = (chart / value_file).resolve()
        assert path.is_relative_to(REPO), f"{value_file}: outside the repository, which Argo CD refuses"
        if not path.is_file():
            assert settings.get("ignoreMissingValueFiles"), f"{value_file}: no such file"
            continue
        args += ["--values", str(path)]
    extra = settings.get("valuesObject") or settings.get("values")
    if extra:
        path = workdir / f"values-{uuid.uuid4().hex}.yaml"
        path.write_text(extra if isinstance(extra, str) else yaml.safe_dump(extra))
        args += ["--values", str(path)]
    return [*args, "--include-crds"]


def value_files(app: dict) -> list[Path]:
    """The value files Argo CD passes for `app` (those that exist)."""
    found = []
    for source in sources(app):
        chart = REPO / source["path"]
        for value_file in source.get("helm", {}).get("valueFiles", []):
            if (chart / value_file).resolve().is_file():
                found.append((chart / value_file).resolve())
    return found


def render(helm_path: str, app: dict, workdir: Path) -> list[dict]:
    """Every object `app` deploys, from each of its sources."""
    docs = []
    for source in sources(app):
        assert set(source) <= SOURCE_FIELDS, f"source fields not emulated: {set(source) - SOURCE_FIELDS}"
        assert source["repoURL"] and source["targetRevision"]
        if "helm" in source:
            result = subprocess.run([helm_path, "template", *helm_template_args(app, source, workdir)],
                                    capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, f"{app['metadata']['name']}: helm template:\n{result.stderr}"
            docs += [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        else:
            directory = source.get("directory", {})
            assert set(directory) <= DIRECTORY_FIELDS, f"directory fields not emulated: {set(directory) - DIRECTORY_FIELDS}"
            paths = sorted(path for path in (REPO / source["path"]).iterdir()
                           if path.suffix in (".yaml", ".yml", ".json")
                           and fnmatch.fnmatch(path.name, directory.get("include", "*")))
            assert paths, f"{source['path']}: no manifests"
            docs += [doc for path in paths for doc in load_documents(path)]
    return docs


@pytest.fixture(scope="module")
def rendered(helm, tmp_path_factory) -> dict[str, list[dict]]:
    workdir = tmp_path_factory.mktemp("argocd")
    return {name: render(helm, app, workdir) for name, app in applications().items()}


# -- offline ---------------------------------------------------------------------------------
def test_the_argocd_folder():
    """The three manifests, the ApplicationSet's values (values.yaml, clusters/*.yaml), a README."""
    files = {path.relative_to(ARGOCD).as_posix() for path in ARGOCD.rglob("*") if path.is_file()}
    assert files == {"README.md", "values.yaml", *(f"{name}.yaml" for name in MANIFESTS),
                     *(f"clusters/{name}.yaml" for name in cluster_names())}
    assert {group_kind(document(name))[1] for name in MANIFESTS} == {"AppProject", "Application", "ApplicationSet"}
    assert cluster_names(), "an example of per-cluster values"
    for path in [ARGOCD / "values.yaml", *CLUSTERS.glob("*.yaml")]:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


def test_the_applications_pass_the_values_they_say(helm, rendered):
    apps = applications()
    seed = apps["gpu-scheduler"]
    assert value_files(seed) == [REPO / "kind" / "values.yaml"], "the seed's values: what `make deploy` uses"
    for name in cluster_names():
        assert value_files(apps[f"gpu-scheduler-{name}"]) == [ARGOCD / "values.yaml", CLUSTERS / f"{name}.yaml"]
    assert value_files(apps["gpu-scheduler-no-values-file"]) == [ARGOCD / "values.yaml"]
    # The values do reach the objects: the seed's images, and each cluster's webhook path.
    images = {c["image"] for doc in rendered["gpu-scheduler"] if doc["kind"] == "Service" and "knative" in doc["apiVersion"]
              for c in doc["spec"]["template"]["spec"]["containers"]}
    assert images == {"kind.local/gpu-scheduler-bind:dev", "kind.local/gpu-scheduler-mutate:dev"}
    for name in cluster_names():
        path = yaml.safe_load((CLUSTERS / f"{name}.yaml").read_text()).get("webhook", {}).get("path", "knative-route")
        has_service = any(group_kind(doc) == ("", "Service") for doc in rendered[f"gpu-scheduler-{name}"])
        assert has_service == (path == "direct-service"), name
    for name, docs in rendered.items():
        assert [doc["metadata"]["name"] for doc in docs if doc["kind"] == "Namespace"] == ["gpu-scheduler"], name
        # Argo CD runs no `helm test`: neither its hook nor its account are deployed.
        assert not [doc for doc in docs if "helm.sh/hook" in (doc["metadata"].get("annotations") or {})
                    or "plan-test" in doc["metadata"]["name"]], name


def expected_wave(doc: dict) -> str:
    group, kind = group_kind(doc)
    named = [wave for wave, members in WAVES.items() if (group, kind, doc["metadata"]["name"]) in members]
    [wave] = named or [wave for wave, members in WAVES.items() if (group, kind) in members]
    return wave


def test_sync_waves(rendered):
    """Every object has its wave; the seed deploys all four, in the issue's order."""
    for name, docs in rendered.items():
        for doc in docs:
            annotations = doc["metadata"].get("annotations") or {}
            assert annotations.get(WAVE) == expected_wave(doc), f"{name}: {doc['kind']} {doc['metadata']['name']}"
    assert {doc["metadata"]["annotations"][WAVE] for doc in rendered["gpu-scheduler"]} == set(WAVES)


@pytest.mark.parametrize("values", sorted(
    path.name for path in (REPO / "chart" / "gpu-scheduler" / "ci").glob("*-values.yaml")))
def test_every_chart_option_has_its_waves_and_is_allowed(helm, values):
    """Whatever values a cluster's file sets (the chart's tested examples): every object has
    its wave, and the project allows its kind."""
    allowed = project_kinds()
    docs = [doc for doc in yaml.safe_load_all(manifests.template(
        "-f", str(REPO / "chart" / "gpu-scheduler" / "ci" / values),
        "--set", "namespace.create=true", "--set", "test.enabled=false",
        "--set", "uninstall.enabled=false")) if doc]  # the Applications' parameters
    for doc in docs:
        assert doc["metadata"]["annotations"][WAVE] == expected_wave(doc), f"{doc['kind']} {doc['metadata']['name']}"
        assert group_kind(doc) in allowed["namespaced" if "namespace" in doc["metadata"] else "cluster"], doc["kind"]


def project_kinds() -> dict[str, set[tuple[str, str]]]:
    spec = document("project")["spec"]
    kinds = {scope: [(entry["group"], entry["kind"]) for entry in spec.get(field, [])]
             for scope, field in (("cluster", "clusterResourceWhitelist"), ("namespaced", "namespaceResourceWhitelist"))}
    for scope, listed in kinds.items():
        assert len(listed) == len(set(listed)), f"{scope}: listed twice"
    return {scope: set(listed) for scope, listed in kinds.items()}


def test_project_allows_exactly_the_rendered_kinds(rendered):
    """Least privilege: the whitelists are the kinds the Applications render, no more, no fewer."""
    deployed = {"cluster": set(), "namespaced": set()}
    for docs in rendered.values():
        for doc in docs:
            deployed["namespaced" if "namespace" in doc["metadata"] else "cluster"].add(group_kind(doc))
    assert project_kinds() == deployed
    spec = document("project")["spec"]
    assert not {"clusterResourceBlacklist", "namespaceResourceBlacklist"} & set(spec), "whitelists only"
    for entry in [*spec["clusterResourceWhitelist"], *spec["namespaceResourceWhitelist"]]:
        assert "*" not in entry["group"] + entry["kind"]


def allowed_destination(server: str, namespace: str) -> bool:
    return any(fnmatch.fnmatchcase(server, d["server"]) and fnmatch.fnmatchcase(namespace, d["namespace"])
               for d in document("project")["spec"]["destinations"])


def test_project_allows_the_sources_and_destinations(rendered):
    project = document("project")
    assert not any("*" in repo for repo in project["spec"]["sourceRepos"])
    for name, app in applications().items():
        assert app["spec"]["project"] == project["metadata"]["name"]
        assert app["metadata"]["namespace"] == project["metadata"]["namespace"] == "argocd"
        for source in sources(app):
            assert source["repoURL"] in project["spec"]["sourceRepos"], name
        server = app["spec"]["destination"]["server"]
        assert allowed_destination(server, app["spec"]["destination"]["namespace"]), name
        for doc in rendered[name]:
            if "namespace" in doc["metadata"]:
                assert allowed_destination(server, doc["metadata"]["namespace"]), f"{name}: {doc['kind']} {doc['metadata']['name']}"
    # The check workload's namespace (default) only on Argo CD's own cluster.
    assert not allowed_destination("https://gpu-east.clusters.example.com:6443", "default")


def test_cert_managers_ca_bundle_is_no_drift():
    for app in applications().values():
        assert {"group": "admissionregistration.k8s.io", "kind": "MutatingWebhookConfiguration",
                "jqPathExpressions": [".webhooks[]?.clientConfig.caBundle"]} in app["spec"]["ignoreDifferences"]
        assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"]


def test_applicationset_covers_every_registered_cluster():
    [generator] = document("applicationset")["spec"]["generators"]
    # The label every cluster Secret carries: all of them, and not the implicit local cluster.
    assert generator == {"clusters": {"selector": {"matchLabels": {"argocd.argoproj.io/secret-type": "cluster"}}}}


# -- the real API server with Argo CD's CRDs --------------------------------------------------
@pytest.fixture(scope="module")
def argocd_crds(controlplane) -> list[str]:
    """Argo CD v3.2.0's CRDs (from its Go module), installed and Established; kubectl."""
    fetch = subprocess.run(["bash", str(REPO / "localcp" / "fetch-argocd-crds.sh")],
                           capture_output=True, text=True, timeout=600)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    directory = Path(subprocess.run(["bash", str(REPO / "localcp" / "fetch-argocd-crds.sh"), "--path"],
                                    check=True, capture_output=True, text=True).stdout.strip())
    paths = sorted(directory.glob("*.yaml"))
    names = [doc["metadata"]["name"] for path in paths for doc in load_documents(path)]
    assert sorted(names) == ["applications.argoproj.io", "applicationsets.argoproj.io", "appprojects.argoproj.io"]
    kubectl = [controlplane.kubectl, "--kubeconfig", controlplane.kubeconfig]
    result = subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", *(f"--filename={p}" for p in paths)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl apply:\n{result.stdout}\n{result.stderr}"
    # Not `kubectl wait`: it fails at once on a CRD whose status has no conditions yet.
    deadline = time.monotonic() + 60
    while True:
        result = subprocess.run([*kubectl, "get", *(f"crd/{n}" for n in names), "-o",
                                 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Established")].status}{"\\n"}{end}'],
                                capture_output=True, text=True, timeout=60)
        if result.returncode == 0 and result.stdout.split() == ["True"] * len(names):
            break
        assert time.monotonic() < deadline, f"not Established within 60 s:\n{result.stdout}\n{result.stderr}"
        time.sleep(0.5)
    created = subprocess.run([*kubectl, "create", "namespace", "argocd"], capture_output=True, text=True, timeout=60)
    yield kubectl
    if created.returncode == 0:
        subprocess.run([*kubectl, "delete", "namespace", "argocd", "--wait=false"], capture_output=True, timeout=60)


def dry_run(kubectl: list[str], docs: list[dict], path: Path) -> subprocess.CompletedProcess:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return subprocess.run([*kubectl, "apply", "--dry-run=server", "--validate=strict", "-f", str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.controlplane
def test_server_accepts_the_argocd_manifests(argocd_crds, tmp_path):
    """The three files as shipped, and each Application the ApplicationSet generates."""
    docs = [document(name) for name in MANIFESTS]
    docs += [app for name, app in applications().items() if name != "gpu-scheduler"]
    result = dry_run(argocd_crds, docs, tmp_path / "argocd.yaml")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.stdout.count("(server dry run)") == len(docs), result.stdout
    assert "Warning" not in result.stderr, result.stderr
    for doc in docs:
        assert f"{doc['kind'].lower()}.argoproj.io/{doc['metadata']['name']} " in result.stdout, result.stdout


@pytest.mark.controlplane
@pytest.mark.parametrize("name, where, typo", [
    ("application", ("spec", "destination"), ("server", "serverr")),
    ("applicationset", ("spec", "template", "spec", "source", "helm"), ("valueFiles", "valuesFiles")),
    ("project", ("spec",), ("namespaceResourceWhitelist", "namespacedResourceWhitelist")),
])
def test_server_refuses_a_misspelled_field(argocd_crds, tmp_path, name, where, typo):
    """The strict dry run does check Argo CD's objects: one misspelled field is refused."""
    doc = copy.deepcopy(document(name))
    node = doc
    for key in where:
        node = node[key]
    right, wrong = typo
    node[wrong] = node.pop(right)
    result = dry_run(argocd_crds, [doc], tmp_path / "typo.yaml")
    assert result.returncode != 0 and f'unknown field "{".".join(where)}.{wrong}"' in result.stderr, (
        result.stdout + result.stderr)


@pytest.mark.controlplane
def test_server_accepts_what_each_application_renders(crds, rendered, tmp_path):
    """Every object each Application deploys, with the real Knative and cert-manager CRDs
    (tests/test_chart.py's fixture), strictly; the check StatefulSet as shipped."""
    kubectl = crds
    existing = subprocess.run([*kubectl, "get", "namespace", "gpu-scheduler"], capture_output=True, timeout=60)
    if existing.returncode != 0:
        subprocess.run([*kubectl, "create", "namespace", "gpu-scheduler"], check=True, capture_output=True, timeout=60)
    try:
        for name, docs in rendered.items():
            result = dry_run(kubectl, docs, tmp_path / f"{name}.yaml")
            assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
            assert result.stdout.count("(server dry run)") == len(docs), result.stdout
    finally:
        if existing.returncode != 0:
            subprocess.run([*kubectl, "delete", "namespace", "gpu-scheduler", "--wait=false"], capture_output=True, timeout=60)
