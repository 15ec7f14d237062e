"""bind and mutate as pods on the real nodes, as Knative would run them (LocalStack(in_cluster=True)).

The lighter of the two ways the stack runs the functions in the cluster (the other is on real
Knative: LocalStack(knative=True), localcp/knative.py): a Deployment and a Service stand in for
each Knative Service, for the tests of the images, accounts and probes, which need no Knative. The
Deployment's pod template is the Knative Service's revision template as shipped
(knative/<name>-service.yaml: image, ServiceAccount, env, securityContext with runAsNonRoot and
readOnlyRootFilesystem, resources), with what Knative's controller adds to a revision's pod (PORT,
no service links) and what differs here, each for a reason:
- One replica: the Knative Services' min-scale; nothing scales them.
- runAsUser and runAsGroup: the image's numeric USER (65532:65532), as check/statefulset.yaml
  sets them. Without them the kubelet passes containerd only the image's uid, and the process
  runs with group 0 (root's group): seen here with knative/*-service.yaml as shipped.
- The probes are the shipped httpGet ones, on /health/readiness and /health/liveness, run by the
  kubelet from its node's namespace (localcp/network.py), with the port (and for mutate the HTTPS
  scheme) that Knative's controller fills in for a revision's container, and a period and
  threshold of our own: Knative's queue-proxy probes far more often than a kubelet's default 10 s.
- mutate serves TLS itself: gunicorn, the server functions-framework runs, with a certificate
  for mutate.gpu-scheduler.svc from a Secret. In Knative, Kourier terminates TLS
  (cluster-local-domain-tls) and the container serves plain HTTP on PORT.
The Services: bind port 80 and mutate port 443 (what knative/webhook.yaml names) to PORT.
"""
from __future__ import annotations

import base64
import copy
from pathlib import Path

import yaml

from . import images
from .cluster import REPO

NAMESPACE = "gpu-scheduler"
PORT = 8080  # Knative's PORT for a revision's container (the images' default too)
SERVICE_PORTS = {"bind": 80, "mutate": 443}
TLS_SECRET = "mutate-tls"
TLS_DIR = "/tls"


def knative_service(name: str) -> dict:
    return yaml.safe_load((REPO / "knative" / f"{name}-service.yaml").read_text())


def deployment(name: str) -> dict:
    """The Deployment standing in for knative/<name>-service.yaml (see the module's docstring)."""
    service = knative_service(name)
    template = copy.deepcopy(service["spec"]["template"])
    pod = template["spec"]
    [container] = pod["containers"]
    tls = name == "mutate"
    container["env"] = [*container.get("env", []), {"name": "PORT", "value": str(PORT)}]
    container["ports"] = [{"containerPort": PORT, "name": "https" if tls else "http"}]
    for probe, period in (("readinessProbe", 5), ("livenessProbe", 10)):
        container[probe] = {"httpGet": {**container[probe]["httpGet"], "port": PORT, "scheme": "HTTPS" if tls else "HTTP"},
                            "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": 3}
    pod["enableServiceLinks"] = False  # as Knative sets it
    user, group = images.read_dockerfile(images.FUNCTIONS[name][0]).user.split(":")
    pod["securityContext"] = {**pod.get("securityContext", {}), "runAsUser": int(user), "runAsGroup": int(group)}
    if tls:
        # The image's entry point (gunicorn with serving/gunicorn_config.py: WORKERS,
        # THREADS and PORT from the shipped env) plus the certificate.
        entrypoint = images.read_dockerfile(images.FUNCTIONS[name][0]).entrypoint
        container["command"] = [*entrypoint[:-1], "--certfile", f"{TLS_DIR}/tls.crt",
                                "--keyfile", f"{TLS_DIR}/tls.key", entrypoint[-1]]
        container["volumeMounts"] = [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}]
        pod["volumes"] = [{"name": "tls", "secret": {"secretName": TLS_SECRET}}]
    labels = {"app": name}
    template["metadata"] = {"labels": labels, "annotations": template.get("metadata", {}).get("annotations", {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels,
                         "annotations": {"gpu-scheduler.local/stands-in-for": f"knative/{name}-service.yaml"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}}


def service(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": {"app": name},
                     "ports": [{"port": SERVICE_PORTS[name], "targetPort": PORT, "protocol": "TCP"}]}}


def tls_secret(key: Path, crt: Path) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": TLS_SECRET, "namespace": NAMESPACE},
            "data": {"tls.crt": base64.b64encode(crt.read_bytes()).decode(),
                     "tls.key": base64.b64encode(key.read_bytes()).decode()}}

