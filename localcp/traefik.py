"""Traefik Proxy, the local stack's Knative networking layer: installed whenever Knative is.

localcp/build-traefik.sh builds github.com/traefik/traefik/v3 (its Knative provider) at the version
of localcp/versions.env into the cache. Here:
- image(): the static binary as an image (/ko-app/traefik) on Knative's images' base (nonroot
  65532: localcp/knative.py), imported on every node;
- manifests(): localcp/traefik.yaml (namespace, account, the provider's exact RBAC, the Deployment,
  the public and private Services) with the image named;
- install(): those applied, Traefik ready, then Knative's config-network told to give KIngresses
  to Traefik's class: the one change made to Knative's own configuration. Ready means every
  KIngress gets reconciled from then on; a Route is Ready once Traefik has marked its KIngress.

Any KIngress implementation would serve the chart's sink.path knative-route; Traefik is the one
that builds here (Kourier, Istio, Contour and net-gateway-api need Envoy or modules not served).
"""
from __future__ import annotations

import json
import time

import yaml

from . import images, knative
from .cluster import REPO, ControlPlane, ProcessFailed
from .goprogram import CachedProgram

MANIFEST = REPO / "localcp" / "traefik.yaml"
NAMESPACE = "traefik"
INGRESS_CLASS = "traefik.ingress.networking.knative.dev"
NONROOT = knative.NONROOT
IMAGE_PLACEHOLDER = "TRAEFIK_IMAGE"
PROGRAM = CachedProgram("traefik")
binary, version, built, ensure_built = PROGRAM.binary, PROGRAM.version, PROGRAM.built, PROGRAM.ensure_built


def image_name() -> str:
    return f"localhost/traefik:{version()}"


def image() -> images.Image:
    """The binary as an image on Knative's images' base (cached by the binary)."""
    return knative.binary_image(image_name(), PROGRAM.required())


def manifests() -> list[dict]:
    text = MANIFEST.read_text().replace(IMAGE_PLACEHOLDER, image_name())
    return [doc for doc in yaml.safe_load_all(text) if doc]


def install(cp: ControlPlane, timeout: float = 120) -> float:
    """Traefik applied and ready, then config-network's ingress class set to it; the seconds it took."""
    began = time.monotonic()
    cp.kubectl("apply", "--server-side", "-f", "-",
               input="\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in manifests()))
    done = cp.kubectl("rollout", "status", "-n", NAMESPACE, "deployment/traefik", f"--timeout={int(timeout)}s",
                      check=False)
    if done.returncode != 0:
        pods = cp.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        logs = cp.kubectl("logs", "-n", NAMESPACE, "deployment/traefik", "--tail=30", check=False)
        raise ProcessFailed(f"Traefik not ready after {timeout:g}s: {done.stderr.strip()}\n{pods}{logs.stdout}{logs.stderr}")
    set_ingress_class(cp, INGRESS_CLASS)
    return time.monotonic() - began


def set_ingress_class(cp: ControlPlane, ingress_class: str) -> None:
    """Knative's config-network: which KIngress class its Routes create (Serving's controller
    watches the ConfigMap; Routes made after this use it, and existing ones are reconciled)."""
    cp.kubectl("patch", "configmap", "config-network", "-n", "knative-serving", "--type", "merge",
               "-p", json.dumps({"data": {"ingress-class": ingress_class}}))
