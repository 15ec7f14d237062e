"""The stack's Knative networking layer and Knative's CLI, without a cluster: localcp/traefik.yaml
(Traefik's Knative provider: its exact grant, a non-root read-only container, the private
entrypoints cluster-local Routes need, nothing sent off the machine), localcp/build-traefik.sh
and localcp/build-kn.sh (where they build, the versions, what a build leaves when there is one).
On the cluster: tests/test_knative_cluster.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localcp import kn, traefik, versions
from tests.test_build_knative import interpreter

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("GPU_SCHEDULER_CACHE") or Path.home() / ".cache" / "gpu-scheduler")


def script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "localcp" / name), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def documents() -> dict[str, dict]:
    return {d["kind"]: d for d in traefik.manifests() if d["kind"] not in ("Service",)} | {
        f"Service/{d['metadata']['name']}": d for d in traefik.manifests() if d["kind"] == "Service"}


def test_the_grant_is_exactly_what_the_knative_provider_reads_and_writes():
    """pkg/provider/kubernetes/knative/client.go: informers on KIngresses, Services and Secrets (the
    TLS a KIngress names), and UpdateStatus on a KIngress; nothing else."""
    role = documents()["ClusterRole"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    reads = {"get", "list", "watch"}
    assert granted == {("", r, v) for r in ("services", "secrets") for v in reads} | \
        {("networking.internal.knative.dev", "ingresses", v) for v in reads} | \
        {("networking.internal.knative.dev", "ingresses/status", "update")}
    binding = documents()["ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "traefik", "namespace": traefik.NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_traefik_runs_non_root_read_only_without_capabilities():
    pod = documents()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == int(traefik.NONROOT)
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert container["image"] == traefik.image_name() and container["imagePullPolicy"] == "Never"
    assert all(port["containerPort"] > 1024 for port in container["ports"])  # no privilege to bind below


def flags() -> dict[str, str]:
    [container] = documents()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


def test_cluster_local_routes_get_the_private_entrypoints_and_service():
    """Without them Traefik drops a cluster-local KIngress's rules and still marks it Ready."""
    given = flags()
    assert given["experimental.knative"] == given["providers.knative"] == "true"
    assert given["providers.knative.privateEntrypoints"] == "privweb,privwebsecure"
    assert (given["providers.knative.privateService.name"], given["providers.knative.privateService.namespace"]) == \
        ("privtraefik", traefik.NAMESPACE)
    private = documents()["Service/privtraefik"]
    assert {p["targetPort"] for p in private["spec"]["ports"]} == {"privweb", "privwebsecure"}
    assert private["spec"]["selector"] == documents()["Deployment"]["spec"]["selector"]["matchLabels"]


def test_nothing_is_sent_off_the_machine_and_no_web_ui_is_asked_for():
    given = flags()
    assert given["global.checkNewVersion"] == "false" and given["global.sendAnonymousUsage"] == "false"
    assert not any(name == "api" or name.startswith("api.") for name in given)  # the module has no built UI


@pytest.mark.parametrize("name, setting, directory", [("build-traefik.sh", "GPU_SCHEDULER_TRAEFIK", "traefik"),
                                                       ("build-kn.sh", "GPU_SCHEDULER_KN", "kn"),
                                                       ("build-func.sh", "GPU_SCHEDULER_FUNC", "func")])
def test_path_follows_the_version_setting_and_a_malformed_one_is_refused(tmp_path, name, setting, directory):
    done = script(name, "--path", env={"GPU_SCHEDULER_CACHE": str(tmp_path), setting: "v9.9.9"})
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / f"{directory}-v9.9.9" / "bin" / directory)
    refused = script(name, env={"GPU_SCHEDULER_CACHE": str(tmp_path), setting: "latest"})
    assert refused.returncode == 2 and f"{setting}=latest: not a version" in refused.stderr
    assert not list(tmp_path.iterdir()), "nothing built for a refused version"


def test_the_pinned_versions_are_the_ones_that_build():
    assert versions.defaults()["GPU_SCHEDULER_TRAEFIK"] == "v3.6.12"  # v3.7: a nested module is not served
    assert versions.defaults()["GPU_SCHEDULER_KN"] == "v0.42.0"  # later: knative.dev/client/pkg is not served
    assert versions.defaults()["GPU_SCHEDULER_FUNC"] == "v0.44.0"  # func 1.16: later ones are not served


def test_the_built_traefik_is_static_and_says_its_version():
    if not traefik.built():
        pytest.skip("Traefik is not built (bash localcp/build-traefik.sh)")
    assert not interpreter(traefik.binary())
    out = subprocess.run([str(traefik.binary()), "version"], capture_output=True, text=True, check=True).stdout
    assert f"Version:      {traefik.version()}" in out


def test_the_built_kn_is_static_and_says_its_release():
    if not kn.binary().is_file():
        pytest.skip("kn is not built (bash localcp/build-kn.sh)")
    assert not interpreter(kn.binary())
    out = subprocess.run([str(kn.binary()), "version"], capture_output=True, text=True, check=True).stdout
    assert "Version:      v1.15.0" in out  # knative.dev/client v0.42.0 is kn 1.15


def test_traefiks_image_is_the_binary_as_ko_lays_it_out_non_root():
    if not traefik.built():
        pytest.skip("Traefik is not built (bash localcp/build-traefik.sh)")
    image = traefik.image()
    config = image.config()["config"]
    assert config["Entrypoint"] == ["/ko-app/traefik"] and config["User"] == traefik.NONROOT
