"""localcp/knative.py without a cluster: the release configuration it installs is upstream's with
only the ko:// image references rewritten, each to an image it builds; the images are the static
binaries as ko lays them out, non-root. Needs Knative built (make controlplane); skipped otherwise.
Installed and run on the real nodes: tests/test_knative_cluster.py."""
from __future__ import annotations

import io
import json
import tarfile

import pytest
import yaml

from localcp import knative

pytestmark = pytest.mark.skipif(not knative.built(), reason="Knative is not built: bash localcp/build-knative.sh")


def strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, str):
        yield value


def upstream() -> list[dict]:
    return [doc for project in knative.projects() for path in sorted((project.directory / "config").rglob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_every_ko_reference_is_rewritten_to_a_built_image_and_nothing_else_changes():
    names = {image.name for image in knative.knative_images()}
    installed = knative.manifests()
    assert not [s for doc in installed for s in strings(doc) if s.startswith("ko://")]
    key = lambda d: (d["apiVersion"], d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])  # noqa: E731
    originals = {key(d): d for d in upstream()}
    assert len(originals) == len(installed)
    references = {p.reference(c): p.image_name(c) for p in knative.projects() for c in p.commands()}
    for doc in installed:
        original = originals[key(doc)]
        rewritten = json.loads(json.dumps(original), object_hook=None)
        text = json.dumps(rewritten)
        for reference, name in references.items():
            text = text.replace(json.dumps(reference), json.dumps(name))
        assert json.loads(text) == doc, key(doc)
    used = {s for doc in installed for s in strings(doc) if s.startswith("localhost/knative/")}
    assert used <= names
    # Every Deployment's image, the adapters' (env) and queue-proxy's (config-deployment) among them.
    deployments = [d for d in installed if d["kind"] == "Deployment"]
    assert {c["image"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]} <= names
    [config_deployment] = [d for d in installed if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "config-deployment"]
    assert config_deployment["data"]["queue-sidecar-image"] == knative.projects()[1].image_name("queue")


def test_the_crds_come_first():
    kinds = [d["kind"] for d in knative.manifests()]
    last_crd = max(i for i, k in enumerate(kinds) if k == "CustomResourceDefinition")
    assert "Image" not in kinds[:last_crd] and "Deployment" not in kinds[:last_crd]


def test_the_images_are_the_static_binaries_as_ko_lays_them_out_non_root():
    built = knative.knative_images()
    assert len({image.archive for image in built}) == 1, "one archive: one import per node"
    for image in built:
        config = image.config()["config"]
        [entrypoint] = config["Entrypoint"]
        assert entrypoint.startswith("/ko-app/") and config["User"] == knative.NONROOT
        assert f"KO_DATA_PATH={knative.KO_DATA}" in config["Env"]
        base, binary = image.layers()
        with tarfile.open(fileobj=io.BytesIO(binary)) as layer:
            [member] = layer.getmembers()
            assert "/" + member.name == entrypoint and member.mode & 0o111
            assert layer.extractfile(member).read(4) == b"\x7fELF"
        with tarfile.open(fileobj=io.BytesIO(base)) as layer:
            passwd = layer.extractfile("etc/passwd").read().decode()
            assert f":{knative.NONROOT}:{knative.NONROOT}:" in passwd
            assert layer.getmember("tmp").mode == 0o1777
