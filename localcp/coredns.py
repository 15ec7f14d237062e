"""Cluster DNS for the local stack by the real CoreDNS, as kubeadm installs it: the objects of
kubeadm's CoreDNS addon (k8s.io/kubernetes cmd/kubeadm/app/phases/addons/dns/manifests.go, at
the stack's release), with CoreDNS itself built from its Go module github.com/coredns/coredns
at the setting GPU_SCHEDULER_COREDNS (localcp/versions.env) by localcp/build-coredns.sh, and
put in a one-layer image here (coredns_image), as images.pause_image() does for the sandbox.

The binary is CoreDNS v1.15.0 with only the plugins of corefile() compiled in (PLUGINS: errors,
health, ready, kubernetes, prometheus, cache, loop, reload, loadbalance), as CoreDNS's
plugin.cfg allows: a main package of our own imports them and coremain and sets
dnsserver.Directives to plugin.cfg's order restricted to them. Why: build time and image size.
With all 62 plugins of plugin.cfg (the module's own main package) it built in 157 s to 78.8 MB;
with these 9 in 111 s (from an empty Go build cache, on 2 cores busy with a test run) to
54.7 MB, and the image's one uncompressed layer is the binary. `coredns -plugins` lists
metadata and transfer too: kubernetes and cache import their packages, which register them,
but they are not directives here.

- coredns_image(): the binary as /coredns in an OCI archive for `ctr images import`, run as
  65532:65532, the nonroot user of the official image.
- manifests(image_name, cluster_dns, domain): ServiceAccount kube-system/coredns, ClusterRole and
  ClusterRoleBinding system:coredns, ConfigMap kube-system/coredns (the Corefile), Deployment
  kube-system/coredns (k8s-app: kube-dns, 2 replicas) and Service kube-system/kube-dns at the
  cluster DNS address the kubelets' clusterDNS names.

Where they differ from kubeadm's, and why:
- The image: localhost/gpu-scheduler-coredns:<version>, built here and imported into each
  node's containerd (imagePullPolicy IfNotPresent, as kubeadm's, finds it there), instead of
  the upstream coredns/coredns image: the nodes pull nothing.
- The Corefile has no `forward . /etc/resolv.conf`: no upstream resolver is reachable from the
  pods on this machine (the nodes' kubelets run with resolvConf ""), so a forward could only time
  out. Names outside the cluster domain and its reverse zones fall off the end of the plugin
  chain and are answered SERVFAIL at once instead.
- The pod's securityContext adds runAsNonRoot and the sysctl net.ipv4.ip_unprivileged_port_start
  = 53 (see _POD_SECURITY_CONTEXT): the official image gives /coredns the file capability
  cap_net_bind_service (setcap), ours has no file capabilities, and the container runtime gives
  a non-root process no ambient NET_BIND_SERVICE, so the container's `capabilities: add:
  [NET_BIND_SERVICE]` (kept, as kubeadm's) alone would not let it bind port 53.
- The Service has no `resourceVersion: "0"`: kubeadm sets it only so that its own update of an
  existing Service is valid; these objects are created.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from . import images, versions

VERSION = versions.coredns()  # GPU_SCHEDULER_COREDNS; localcp/build-coredns.sh builds the same one
IMAGE_REPOSITORY = "localhost/gpu-scheduler-coredns"
IMAGE_CONFIG = {"Entrypoint": ["/coredns"], "User": "65532:65532"}  # the official image's nonroot user
NAMESPACE = "kube-system"
NAME = "coredns"  # the Deployment, ServiceAccount and ConfigMap (kubeadm's CoreDNSDeploymentName)
SERVICE_NAME = "kube-dns"
CLUSTER_ROLE = "system:coredns"
LABELS = {"k8s-app": "kube-dns"}
REPLICAS = 2  # kubeadm's coreDNSReplicas
CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"  # kubeadm's LabelNodeRoleControlPlane
DNS_PORT, METRICS_PORT, HEALTH_PORT, READY_PORT = 53, 9153, 8080, 8181

# kubeadm's ClusterRole system:coredns, rule for rule.
RULES = [
    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]

# Not in kubeadm's Deployment. Our /coredns has no file capability (the official image runs
# `setcap cap_net_bind_service=+ep /coredns`), and the container runtime gives a process that is
# not root no ambient NET_BIND_SERVICE: the container's `add: [NET_BIND_SERVICE]` puts it only in
# the bounding set, and execve of a file without capabilities leaves its effective set empty. So
# the pod opens ports from 53 up to unprivileged binds, in its own network namespace only: the
# sysctl is namespaced, one of the kubelet's "safe" sysctls, allowed without --allowed-unsafe-sysctls.
_POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": str(DNS_PORT)}],
}


def coredns_image() -> images.Image:
    """localcp/build-coredns.sh's binary as /coredns in a one-layer image, run as 65532:65532 like
    the official image; cached by a digest of the binary, its configuration and images.FORMAT."""
    if not BINARY.exists():
        raise FileNotFoundError(f"{BINARY}: CoreDNS {VERSION} is not built; run `bash localcp/build-coredns.sh`")
    binary_digest = images._sha256_file(BINARY)
    key = hashlib.sha256(json.dumps([images.FORMAT, binary_digest, IMAGE_CONFIG]).encode()).hexdigest()
    name = f"{IMAGE_REPOSITORY}:{VERSION}"
    target = images._cached("coredns", key)
    if target.exists():
        return images.Image(name, target)
    layer = images._layer([("/coredns", Path(BINARY), 0o755, None)])
    return images.write_oci_archive(target, name, [layer], dict(IMAGE_CONFIG))


def directives(text: str) -> list[str]:
    """The directives of the Corefile `text`, each once, in the order they first appear: the first
    word of each line directly inside a server block (not inside a directive's own block)."""
    found, depth = [], 0
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if depth == 1 and words and words[0] != "}":
            found.append(words[0])
        depth += line.count("{") - line.count("}")
    return list(dict.fromkeys(found))


def corefile(domain: str = "cluster.local") -> str:
    """kubeadm's Corefile for the cluster domain `domain`, without its `forward` block."""
    return f"""\
.:{DNS_PORT} {{
    errors
    health {{
       lameduck 5s
    }}
    ready
    kubernetes {domain} in-addr.arpa ip6.arpa {{
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }}
    prometheus :{METRICS_PORT}
    cache 30 {{
       disable success {domain}
       disable denial {domain}
    }}
    loop
    reload
    loadbalance
}}
"""


# The plugins compiled into BINARY: localcp/build-coredns.sh's PLUGINS, which are these (tests/test_coredns.py).
PLUGINS = tuple(directives(corefile()))
# localcp/build-coredns.sh's directory for VERSION and PLUGINS: its key is the first 12 hex digits
# of the SHA-256 of the plugins' names sorted, one a line.
PLUGINS_KEY = hashlib.sha256("".join(f"{name}\n" for name in sorted(PLUGINS)).encode()).hexdigest()[:12]
BINARY = images.CACHE / f"coredns-{VERSION}-{PLUGINS_KEY}" / "bin" / "coredns"


def _deployment(image_name: str) -> dict:
    container = {
        "name": "coredns",
        "image": image_name,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"memory": "170Mi"}, "requests": {"cpu": "100m", "memory": "70Mi"}},
        "args": ["-conf", "/etc/coredns/Corefile"],
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}],
        "ports": [
            {"containerPort": DNS_PORT, "name": "dns", "protocol": "UDP"},
            {"containerPort": DNS_PORT, "name": "dns-tcp", "protocol": "TCP"},
            {"containerPort": METRICS_PORT, "name": "metrics", "protocol": "TCP"},
            {"containerPort": HEALTH_PORT, "name": "liveness-probe", "protocol": "TCP"},
            {"containerPort": READY_PORT, "name": "readiness-probe", "protocol": "TCP"},
        ],
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "liveness-probe", "scheme": "HTTP"},
            "initialDelaySeconds": 60, "timeoutSeconds": 5, "successThreshold": 1, "failureThreshold": 5,
        },
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "readiness-probe", "scheme": "HTTP"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {
            "replicas": REPLICAS,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "selector": {"matchLabels": dict(LABELS)},
            "template": {
                "metadata": {"labels": dict(LABELS)},
                "spec": {
                    "priorityClassName": "system-cluster-critical",
                    "serviceAccountName": NAME,
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchExpressions": [
                                {"key": "k8s-app", "operator": "In", "values": ["kube-dns"]}]},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }]}},
                    "tolerations": [
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"},
                    ],
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "securityContext": json.loads(json.dumps(_POD_SECURITY_CONTEXT)),
                    "containers": [container],
                    "dnsPolicy": "Default",
                    "volumes": [{"name": "config-volume", "configMap": {
                        "name": NAME, "items": [{"key": "Corefile", "path": "Corefile"}]}}],
                },
            },
        },
    }


def manifests(image_name: str, cluster_dns: str = "10.96.0.10", domain: str = "cluster.local") -> list[dict]:
    """The objects of kubeadm's CoreDNS addon, in the order to create them, for the image
    `image_name` (coredns_image().name), the Service address `cluster_dns` (the kubelets'
    clusterDNS) and the cluster domain `domain`."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": CLUSTER_ROLE}, "rules": json.loads(json.dumps(RULES))},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": CLUSTER_ROLE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "data": {"Corefile": corefile(domain)}},
        _deployment(image_name),
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {
             "name": SERVICE_NAME, "namespace": NAMESPACE,
             "labels": {**LABELS, "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
             "annotations": {"prometheus.io/port": str(METRICS_PORT), "prometheus.io/scrape": "true"},
         },
         "spec": {
             "clusterIP": cluster_dns,
             "ports": [
                 {"name": "dns", "port": DNS_PORT, "protocol": "UDP", "targetPort": DNS_PORT},
                 {"name": "dns-tcp", "port": DNS_PORT, "protocol": "TCP", "targetPort": DNS_PORT},
                 {"name": "metrics", "port": METRICS_PORT, "protocol": "TCP", "targetPort": METRICS_PORT},
             ],
             "selector": dict(LABELS),
         }},
    ]
