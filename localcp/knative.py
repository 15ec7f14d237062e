"""Knative Eventing and Serving on the local stack, installed from their own release configuration.

localcp/build-knative.sh builds each project's commands from its Go module at the version of
localcp/versions.env and copies its release configuration (config/core, and Serving's networking
and caching CRDs) into the cache. Here:
- knative_images(): one OCI archive holding an image per command, each the static binary as ko lays it
  out (/ko-app/<cmd>, KO_DATA_PATH, nonroot 65532, as upstream's ko images on a static base), so
  that the nodes import them all with one `ctr images import`;
- manifests(): the release configuration with every `ko://knative.dev/<project>/cmd/<cmd>`
  reference (Deployments' images, Eventing's APISERVER_RA_IMAGE and AUTH_PROXY_IMAGE, Serving's
  queue-sidecar-image and queue-proxy's caching Image) rewritten to those images. Nothing else is
  changed: the images are what this machine requires (no registry serves Knative's);
- install(): the CRDs first (the configuration's caching Image needs its CRD), then the rest;
  ready when every Deployment that runs is Available and both projects' webhooks have filled
  their configurations (rules and caBundle): before that, the API server cannot admit a
  Knative object.
What cannot run here is a networking layer (Kourier, Istio, Contour, Gateway API: not served, and
no Envoy), so nothing reconciles a KIngress and a Route stays IngressNotConfigured.
"""
from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import images
from .cluster import REPO, ControlPlane, ProcessFailed

BUILD_SCRIPT = REPO / "localcp" / "build-knative.sh"
NAMESPACES = ("knative-eventing", "knative-serving")
NONROOT = "65532"  # ko's default user, and the static base's nonroot
KO_DATA = "/var/run/ko"


@dataclass(frozen=True)
class Project:
    name: str  # eventing, serving
    directory: Path  # $CACHE/knative-<name>-<version>: bin/, config/

    @property
    def version(self) -> str:
        return self.directory.name.rsplit("-", 1)[1]

    def commands(self) -> list[str]:
        return sorted(p.name for p in (self.directory / "bin").iterdir()) if (self.directory / "bin").is_dir() else []

    def image_name(self, command: str) -> str:
        return f"localhost/knative/{self.name}-{command.replace('_', '-')}:{self.version}"

    def reference(self, command: str) -> str:
        return f"ko://knative.dev/{self.name}/cmd/{command}"


@functools.cache  # the settings do not change within a process; asked for on every image name
def projects() -> tuple[Project, Project]:
    """Eventing's and Serving's cache directories (built or not), as build-knative.sh names them."""
    eventing, serving = subprocess.run(["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True,
                                       check=True).stdout.split()
    return Project("eventing", Path(eventing)), Project("serving", Path(serving))


def built() -> bool:
    return all(p.commands() and (p.directory / "config").is_dir() for p in projects())


def ensure_built() -> None:
    if not built():
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)


# -- images --------------------------------------------------------------------------------------
# A home that does not exist: client-go then finds no ~/.kube/config and takes the in-cluster
# configuration (a home it cannot read is an error instead). The layers' files are root's.
BASE_FILES = [
    ("/etc", None, 0o755, None),
    ("/etc/passwd", f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/nonexistent:/sbin/nologin\n".encode(), 0o644, None),
    ("/etc/group", f"root:x:0:\nnonroot:x:{NONROOT}:\n".encode(), 0o644, None),
    ("/tmp", None, 0o1777, None),
    ("/var", None, 0o755, None), ("/var/run", None, 0o755, None), (KO_DATA, None, 0o755, None),
    ("/ko-app", None, 0o755, None),
]


def knative_images() -> list[images.Image]:
    """Every built command of both projects as an image, in one archive (cached by the binaries)."""
    commands = [(project, command) for project in projects() for command in project.commands()]
    if not commands:
        raise ProcessFailed("Knative is not built: bash localcp/build-knative.sh")
    key = hashlib.sha256(json.dumps([images.FORMAT, images._architecture()] + [
        [project.image_name(command), (project.directory / "bin" / command).stat().st_size,
         (project.directory / "bin" / command).stat().st_mtime_ns] for project, command in commands]).encode()).hexdigest()
    target = images.IMAGES / f"knative-{key[:20]}.tar"
    configs = {project.image_name(command): {
        "Entrypoint": [f"/ko-app/{command}"], "User": NONROOT, "WorkingDir": "/",
        "Env": [f"PATH=/ko-app:{images.DEFAULT_PATH}", f"KO_DATA_PATH={KO_DATA}", "HOME=/nonexistent"]}
        for project, command in commands}
    if target.exists():
        return [images.Image(name, target, unpack=False) for name in configs]
    base = images._layer(BASE_FILES)
    images.IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=images.IMAGES) as tmp:
        layers = {}
        for project, command in commands:
            layer = Path(tmp) / f"{project.name}-{command}.tar"
            with open(layer, "wb") as out:
                images._write_layer(out, [(f"/ko-app/{command}", project.directory / "bin" / command, 0o755, None)])
            layers[project.image_name(command)] = [base, layer]
        built = images.write_oci_archive_of(target, {name: (layers[name], config) for name, config in configs.items()})
    # Each node runs a few of the twelve: each unpacks only those (CRI does it at first use).
    return [images.Image(image.name, image.archive, unpack=False) for image in built]


def binary_image(name: str, binary: Path, env: tuple[str, ...] = ("HOME=/nonexistent",)) -> images.Image:
    """One static binary (Traefik, func) as an image on Knative's images' base, laid out as ko lays
    it out (/ko-app/<binary>, run as NONROOT), in an archive of its own cached by the binary."""
    stat = binary.stat()
    key = hashlib.sha256(json.dumps([images.FORMAT, images._architecture(), "knative-base", name, stat.st_size,
                                     stat.st_mtime_ns, list(env)]).encode()).hexdigest()
    target = images.IMAGES / f"{binary.name}-{key[:20]}.tar"
    if target.exists():
        return images.Image(name, target)
    config = {"Entrypoint": [f"/ko-app/{binary.name}"], "User": NONROOT, "WorkingDir": "/",
              "Env": [f"PATH=/ko-app:{images.DEFAULT_PATH}", *env]}
    images.IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=images.IMAGES) as tmp:
        layer = Path(tmp) / f"{binary.name}.layer"
        with open(layer, "wb") as out:
            images._write_layer(out, [(f"/ko-app/{binary.name}", binary, 0o755, None)])
        return images.write_oci_archive(target, name, [images._layer(BASE_FILES), layer], config)


# -- the release configuration -------------------------------------------------------------------
KIND_ORDER = ("Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role",
              "ClusterRoleBinding", "RoleBinding", "ConfigMap", "Secret", "Service")


def _rewrite(value, references: dict[str, str]):
    if isinstance(value, dict):
        return {k: _rewrite(v, references) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, references) for v in value]
    if isinstance(value, str) and value.startswith("ko://"):
        if value not in references:
            raise ProcessFailed(f"{value}: the release configuration names a command build-knative.sh did not build")
        return references[value]
    return value


def manifests() -> list[dict]:
    """Both projects' release configuration, images rewritten, CRDs first (then kubectl's order)."""
    references = {p.reference(c): p.image_name(c) for p in projects() for c in p.commands()}
    docs = []
    for project in projects():
        for path in sorted((project.directory / "config").rglob("*.yaml")):
            docs += [_rewrite(doc, references) for doc in yaml.safe_load_all(path.read_text()) if doc]
    rank = {kind: i for i, kind in enumerate(KIND_ORDER)}
    return sorted(docs, key=lambda d: rank.get(d["kind"], len(KIND_ORDER)))


def install(cp: ControlPlane, timeout: float = 180) -> float:
    """Knative on the stack, ready (see the module's docstring); the seconds it took."""
    began = time.monotonic()
    docs = manifests()
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    stream = lambda ds: "\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in ds)  # noqa: E731
    cp.kubectl("apply", "--server-side", "-f", "-", input=stream(crds))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               *(f"crd/{d['metadata']['name']}" for d in crds))
    cp.kubectl("apply", "--server-side", "-f", "-", input=stream(rest))
    deadline = time.monotonic() + timeout
    while (missing := not_ready(cp)):
        if time.monotonic() > deadline:
            pods = cp.kubectl("get", "pods", "-o", "wide", "-n", NAMESPACES[0], check=False).stdout + \
                cp.kubectl("get", "pods", "-o", "wide", "-n", NAMESPACES[1], check=False).stdout
            raise ProcessFailed(f"Knative not ready after {timeout:g}s: {'; '.join(missing)}\n{pods}{crashed(cp)}")
        time.sleep(1)
    return time.monotonic() - began


def crashed(cp: ControlPlane, lines: int = 15) -> str:
    """The last log lines of each Knative container that has restarted: why it is not ready."""
    text = ""
    for namespace in NAMESPACES:
        for pod in json.loads(cp.get(f"/api/v1/namespaces/{namespace}/pods"))["items"]:
            for status in pod.get("status", {}).get("containerStatuses", []):
                if status.get("restartCount"):
                    log = cp.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "-c", status["name"],
                                     "--previous", f"--tail={lines}", check=False)
                    text += f"\n{namespace}/{pod['metadata']['name']} {status['name']}:\n{log.stdout}{log.stderr}"
    return text


def not_ready(cp: ControlPlane) -> list[str]:
    """What of Knative is not ready yet: Deployments not Available, webhook configurations not
    filled by their webhook (no rules or no caBundle)."""
    missing = []
    for namespace in NAMESPACES:
        for deployment in json.loads(cp.get(f"/apis/apps/v1/namespaces/{namespace}/deployments"))["items"]:
            if not deployment["spec"].get("replicas", 1):
                continue  # pingsource-mt-adapter: scaled up by the controller once a PingSource exists
            conditions = {c["type"]: c["status"] for c in deployment.get("status", {}).get("conditions", [])}
            if conditions.get("Available") != "True" or deployment["status"].get("updatedReplicas", 0) < deployment["spec"].get("replicas", 1):
                missing.append(f"deployment {namespace}/{deployment['metadata']['name']}")
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for configuration in json.loads(cp.get(f"/apis/admissionregistration.k8s.io/v1/{kind}"))["items"]:
            if not configuration["metadata"]["name"].endswith("knative.dev"):
                continue
            for webhook in configuration.get("webhooks") or []:
                if not webhook.get("rules") and "sinkbindings" not in webhook["name"] or not webhook["clientConfig"].get("caBundle"):
                    missing.append(f"{kind[:-1]} {configuration['metadata']['name']}")
                    break
    return missing
