"""localcp/coredns.py: the cluster DNS objects are kubeadm's CoreDNS addon (its RBAC, Deployment,
Service and Corefile), less the deviations its docstring gives (no `forward`, the pod's sysctl
and runAsNonRoot, our image), and the image is localcp/build-coredns.sh's binary run as the
official image's nonroot user; that binary has the plugins of the Corefile's directives compiled
in and no others. No cluster: kubeadm's own manifests and CoreDNS's plugin.cfg are read from the
Go module cache when the stack's build has downloaded them, the image is built when the binary is."""
from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from localcp import coredns, versions

IMAGE = "localhost/gpu-scheduler-coredns:v0.0.0-test"
GOMODCACHE = Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod")
KUBEADM_MANIFESTS = (GOMODCACHE / f"k8s.io/kubernetes@{versions.kubernetes()}"
                     / "cmd/kubeadm/app/phases/addons/dns/manifests.go")
COREDNS_MODULE = GOMODCACHE / f"github.com/coredns/coredns@{versions.coredns()}"
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "localcp" / "build-coredns.sh"
# Registered by packages that the Corefile's plugins import (kubernetes: metadata and transfer;
# cache: metadata), so `coredns -plugins` lists them; not directives (build-coredns.sh's IMPORTED).
IMPORTED = {"metadata", "transfer"}


def by_kind(objects: list[dict]) -> dict[str, dict]:
    found = {o["kind"]: o for o in objects}
    assert len(found) == len(objects)
    return found


@pytest.fixture
def objects() -> dict[str, dict]:
    return by_kind(coredns.manifests(IMAGE, "10.96.0.10", "cluster.local"))


def pod_spec(objects) -> dict:
    return objects["Deployment"]["spec"]["template"]["spec"]


def test_the_objects_are_kubeadms_six_in_the_order_to_create_them(objects):
    listed = coredns.manifests(IMAGE)
    assert [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in listed] == [
        ("ServiceAccount", "coredns", "kube-system"),
        ("ClusterRole", "system:coredns", None),
        ("ClusterRoleBinding", "system:coredns", None),
        ("ConfigMap", "coredns", "kube-system"),
        ("Deployment", "coredns", "kube-system"),
        ("Service", "kube-dns", "kube-system"),
    ]


def test_the_kube_dns_service_is_at_the_given_address_with_the_three_ports():
    service = by_kind(coredns.manifests(IMAGE, cluster_dns="10.97.0.53"))["Service"]
    assert service["spec"]["clusterIP"] == "10.97.0.53"
    assert service["spec"]["selector"] == {"k8s-app": "kube-dns"}
    assert [(p["name"], p["port"], p["protocol"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("dns", 53, "UDP", 53), ("dns-tcp", 53, "TCP", 53), ("metrics", 9153, "TCP", 9153)]
    assert service["metadata"]["labels"] == {"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true",
                                             "kubernetes.io/name": "CoreDNS"}
    assert service["metadata"]["annotations"] == {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}


def test_the_deployment_probes_are_http_on_8080_health_and_8181_ready(objects):
    container, = pod_spec(objects)["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness, readiness = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert (ports[liveness["port"]], liveness["path"], liveness["scheme"]) == (8080, "/health", "HTTP")
    assert (ports[readiness["port"]], readiness["path"], readiness["scheme"]) == (8181, "/ready", "HTTP")
    assert {(p["containerPort"], p["protocol"]) for p in container["ports"]} >= {(53, "UDP"), (53, "TCP"), (9153, "TCP")}


def test_the_deployment_runs_the_image_given_as_kubeadms_does(objects):
    deployment = objects["Deployment"]
    spec = pod_spec(objects)
    container, = spec["containers"]
    assert deployment["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert deployment["spec"]["template"]["metadata"]["labels"] == {"k8s-app": "kube-dns"}
    assert deployment["spec"]["replicas"] == 2
    assert (container["image"], container["imagePullPolicy"]) == (IMAGE, "IfNotPresent")
    assert container["args"] == ["-conf", "/etc/coredns/Corefile"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}
    assert (spec["priorityClassName"], spec["dnsPolicy"], spec["serviceAccountName"]) == (
        "system-cluster-critical", "Default", "coredns")
    assert {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["volumes"][0]["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]


def test_the_pod_opens_port_53_to_its_nonroot_user_by_a_namespaced_sysctl(objects):
    assert pod_spec(objects)["securityContext"] == {
        "runAsNonRoot": True, "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}]}


def test_the_corefile_serves_the_cluster_domain_and_forwards_nothing():
    corefile = by_kind(coredns.manifests(IMAGE, domain="example.test"))["ConfigMap"]["data"]["Corefile"]
    kubernetes = re.search(r"^ *kubernetes ([^{\n]*) \{\n(.*?)\n *\}", corefile, re.M | re.S)
    assert kubernetes.group(1) == "example.test in-addr.arpa ip6.arpa"
    assert [line.strip() for line in kubernetes.group(2).splitlines()] == [
        "pods insecure", "fallthrough in-addr.arpa ip6.arpa", "ttl 30"]
    assert "forward" not in corefile
    assert corefile.startswith(".:53 {")
    assert "disable success example.test" in corefile and "prometheus :9153" in corefile
    assert corefile.count("{") == corefile.count("}")


def test_the_rbac_is_kubeadms(objects):
    assert objects["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "system:coredns"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]


def test_each_call_returns_objects_of_its_own(objects):
    pod_spec(objects)["securityContext"]["sysctls"].clear()
    objects["ClusterRole"]["rules"].clear()
    again = by_kind(coredns.manifests(IMAGE))
    assert pod_spec(again)["securityContext"]["sysctls"] and again["ClusterRole"]["rules"]


# -- against kubeadm's own manifests ---------------------------------------------------------------
def kubeadm_objects(domain: str, dns_ip: str, image: str) -> dict[str, dict]:
    """kubeadm's manifests.go templates rendered as kubeadm renders them for these values."""
    source = KUBEADM_MANIFESTS.read_text()
    values = {"DNSIP": dns_ip, "DeploymentName": "coredns", "Replicas": "2", "Image": image,
              "ControlPlaneTaintKey": "node-role.kubernetes.io/control-plane", "DNSDomain": domain}
    found = {}
    for template in re.findall(r"= `\n(.*?)`", source, re.S):
        text = re.sub(r"\s*\{\{- (if \.DNSDomain|end) \}\}", "", template)  # {{- trims the space before
        text = re.sub(r"\{\{ \.(\w+) \}\}", lambda m: values[m.group(1)], text)
        assert "{{" not in text, text
        obj = yaml.safe_load(text)
        found[obj["kind"]] = obj
    return found


@pytest.mark.skipif(not KUBEADM_MANIFESTS.exists(), reason=f"{KUBEADM_MANIFESTS} is not in the Go module cache")
def test_the_objects_are_kubeadms_less_the_documented_deviations():
    ours = by_kind(coredns.manifests(IMAGE, "10.96.0.10", "cluster.local"))
    theirs = kubeadm_objects("cluster.local", "10.96.0.10", IMAGE)
    assert set(ours) == set(theirs)
    # Deviations: no forward block; the pod's securityContext; the Service's resourceVersion "0".
    without_forward = re.sub(r"\n *forward \. /etc/resolv\.conf \{\n.*?\n *\}", "",
                             theirs["ConfigMap"]["data"]["Corefile"], flags=re.S)
    assert "forward" not in without_forward
    assert ours["ConfigMap"]["data"]["Corefile"] == without_forward
    del ours["ConfigMap"]["data"], theirs["ConfigMap"]["data"]
    del pod_spec(ours)["securityContext"]
    assert theirs["Service"]["metadata"].pop("resourceVersion") == "0"
    assert ours == theirs


# -- the binary's plugins: the Corefile's directives ------------------------------------------------
def corefile_directives(text: str) -> set[str]:
    """The directive names of a Corefile of one server block: the first word of each line of the
    block once the directives' own blocks are taken out."""
    body = re.fullmatch(r"[^\s{]+ \{\n(.*)\}\n", text, re.S).group(1)
    while re.search(r"\{[^{}]*\}", body):
        body = re.sub(r"\{[^{}]*\}", "", body)
    return {line.split()[0] for line in body.splitlines() if line.strip()}


def build_script(*args: str) -> str:
    return subprocess.run(["bash", str(BUILD_SCRIPT), *args], check=True, capture_output=True, text=True).stdout


def test_the_build_compiles_in_the_directives_the_corefile_uses_and_no_others():
    used = corefile_directives(coredns.corefile())
    assert {"kubernetes", "health", "ready", "prometheus"} <= used and "forward" not in used
    assert corefile_directives(coredns.corefile("example.test")) == used
    built = build_script("--plugins").split()
    assert len(built) == len(set(built)) and set(built) == used
    assert set(coredns.PLUGINS) == used and len(coredns.PLUGINS) == len(used)


def test_directives_are_the_server_blocks_own_lines_not_those_inside_a_directives_block():
    text = ".:53 {\n    errors\n    health {\n       lameduck 5s\n    }\n    cache 30 {\n" \
           "       disable success x # comment\n    }\n    errors\n    # log\n}\n"
    assert coredns.directives(text) == ["errors", "health", "cache"]


@pytest.mark.skipif(not COREDNS_MODULE.exists(), reason=f"{COREDNS_MODULE} is not in the Go module cache")
def test_the_generated_main_package_imports_them_and_runs_them_in_upstreams_order():
    main_go = build_script("--main-go", str(COREDNS_MODULE / "plugin.cfg"))
    upstream = (COREDNS_MODULE / "core/dnsserver/zdirectives.go").read_text()
    upstream_order = re.findall(r'^\t"(\w+)",$', re.search(r"var Directives = \[\]string\{\n(.*?)\n\}",
                                                         upstream, re.S).group(1), re.M)
    used = corefile_directives(coredns.corefile())
    ours = re.findall(r'^\t"(\w+)",$', re.search(r"var directives = \[\]string\{\n(.*?)\n\}",
                                                 main_go, re.S).group(1), re.M)
    assert ours == [name for name in upstream_order if name in used]
    packages = dict(line.split(":", 1) for line in (COREDNS_MODULE / "plugin.cfg").read_text().splitlines()
                    if line.strip() and not line.startswith("#"))
    assert sorted(re.findall(r'^\t_ "([^"]+)"$', main_go, re.M)) == sorted(
        f"github.com/coredns/coredns/plugin/{packages[name]}" for name in used)
    assert "func init() {\n\tdnsserver.Directives = directives\n}" in main_go
    assert "coremain.Run()" in main_go and "core/plugin\"" not in main_go  # not upstream's all-plugin bundle


@pytest.mark.skipif(not coredns.BINARY.exists(), reason="CoreDNS is not built (bash localcp/build-coredns.sh)")
def test_the_built_binary_has_those_plugins_and_the_ones_they_import():
    listed = subprocess.run([str(coredns.BINARY), "-plugins"], check=True, capture_output=True, text=True).stdout
    assert set(listed.split()) == corefile_directives(coredns.corefile()) | IMPORTED


# -- the image -------------------------------------------------------------------------------------
def test_the_image_needs_the_binary_built_first(monkeypatch, tmp_path):
    monkeypatch.setattr(coredns, "BINARY", tmp_path / "coredns-v1.15.0" / "bin" / "coredns")
    with pytest.raises(FileNotFoundError, match=r"bash localcp/build-coredns\.sh"):
        coredns.coredns_image()


def test_the_binary_is_where_the_build_script_puts_it():
    assert build_script("--path").strip() == str(coredns.BINARY)
    assert coredns.BINARY.parts[-3:] == (f"coredns-{versions.coredns()}-{coredns.PLUGINS_KEY}", "bin", "coredns")
    assert re.fullmatch(r"[0-9a-f]{12}", coredns.PLUGINS_KEY)
    assert coredns.VERSION == versions.coredns()
    assert versions.defaults()["GPU_SCHEDULER_COREDNS"] == "v1.15.0"


@pytest.mark.skipif(not coredns.BINARY.exists(), reason="CoreDNS is not built (bash localcp/build-coredns.sh)")
def test_the_image_is_the_binary_run_as_the_official_images_nonroot_user():
    image = coredns.coredns_image()
    assert image.name == f"localhost/gpu-scheduler-coredns:{coredns.VERSION}"
    config = image.config()["config"]
    assert (config["Entrypoint"], config["User"]) == (["/coredns"], "65532:65532")
    layer, = image.layers()
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        member, = tar.getmembers()
        assert (member.name, member.mode, member.size) == ("coredns", 0o755, coredns.BINARY.stat().st_size)
    assert coredns.coredns_image().archive == image.archive  # cached
