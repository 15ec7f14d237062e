"""localcp/build-knative.sh and the Knative settings of localcp/versions.env: where the build puts
Knative Eventing and Serving (one directory per project and version, under GPU_SCHEDULER_CACHE),
the versions it builds (the settings, overridden by the environment, refused when malformed), and,
when they are built, what is there: the static binaries the release configuration's ko:// images
name, and that configuration (config/core, with the ConfigMaps upstream keeps as symlinks, and
serving's networking and caching CRDs). No build, no cluster: `--path` and a refused version
exit before anything is built."""
from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest
import yaml

from localcp import versions

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "localcp" / "build-knative.sh"
CACHE = Path(os.environ.get("GPU_SCHEDULER_CACHE") or Path.home() / ".cache" / "gpu-scheduler")
COMMANDS = {"eventing": ["controller", "webhook", "apiserver_receive_adapter", "mtping", "jobsink", "requestreply",
                         "auth_proxy"],
            "serving": ["controller", "webhook", "activator", "autoscaler", "queue"]}


def build_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def built(project: str) -> Path:
    return CACHE / f"knative-{project}-{versions.knative(project)}"


def is_built(project: str) -> bool:
    return (built(project) / "config").is_dir() and all(
        (built(project) / "bin" / name).exists() for name in COMMANDS[project])


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# -- the settings ------------------------------------------------------------------------------------
def test_the_default_versions_are_v0_50_0(monkeypatch):
    for name in versions.KNATIVE_SETTINGS.values():
        monkeypatch.delenv(name, raising=False)
    assert versions.defaults()["GPU_SCHEDULER_KNATIVE_EVENTING"] == "v0.50.0"
    assert versions.defaults()["GPU_SCHEDULER_KNATIVE_SERVING"] == "v0.50.0"
    assert (versions.knative("eventing"), versions.knative("serving")) == ("v0.50.0", "v0.50.0")


def test_the_environment_overrides_a_version(monkeypatch):
    monkeypatch.setenv("GPU_SCHEDULER_KNATIVE_SERVING", "v0.49.2")
    monkeypatch.setenv("GPU_SCHEDULER_KNATIVE_EVENTING", "")  # empty: the default
    assert versions.knative("serving") == "v0.49.2"
    assert versions.knative("eventing") == versions.defaults()["GPU_SCHEDULER_KNATIVE_EVENTING"]


@pytest.mark.parametrize("value", ["0.50.0", "v0.50", "v0.50.0-rc1", "latest", "knative-v1.20.0"])
def test_a_malformed_version_is_refused(monkeypatch, value):
    monkeypatch.setenv("GPU_SCHEDULER_KNATIVE_EVENTING", value)
    with pytest.raises(ValueError, match=r"GPU_SCHEDULER_KNATIVE_EVENTING=.*vX\.Y\.Z"):
        versions.knative("eventing")


def test_an_unknown_project_is_no_setting():
    with pytest.raises(KeyError):
        versions.knative("functions")


# -- the script, building nothing ------------------------------------------------------------------
def test_path_prints_a_directory_per_project_under_the_cache(tmp_path):
    run = build_script("--path", env={"GPU_SCHEDULER_CACHE": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [str(tmp_path / f"knative-eventing-{versions.knative('eventing')}"),
                                       str(tmp_path / f"knative-serving-{versions.knative('serving')}")]
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_path_follows_the_version_settings(tmp_path):
    run = build_script("--path", env={"GPU_SCHEDULER_CACHE": str(tmp_path), "GPU_SCHEDULER_KNATIVE_EVENTING": "v0.49.1",
                                      "GPU_SCHEDULER_KNATIVE_SERVING": "v0.49.3"})
    assert run.stdout.splitlines() == [str(tmp_path / "knative-eventing-v0.49.1"), str(tmp_path / "knative-serving-v0.49.3")]


def test_the_script_refuses_a_malformed_version_before_building(tmp_path):
    run = build_script("--path", env={"GPU_SCHEDULER_CACHE": str(tmp_path), "GPU_SCHEDULER_KNATIVE_SERVING": "v0.51"})
    assert run.returncode == 2 and run.stdout == ""
    assert "GPU_SCHEDULER_KNATIVE_SERVING=v0.51: not a version of the form vX.Y.Z" in run.stderr
    run = build_script("serving", env={"GPU_SCHEDULER_CACHE": str(tmp_path), "GPU_SCHEDULER_KNATIVE_SERVING": "main"})
    assert run.returncode == 2 and list(tmp_path.iterdir()) == []


def test_the_script_refuses_an_unknown_project_before_building(tmp_path):
    run = build_script("functions", env={"GPU_SCHEDULER_CACHE": str(tmp_path)})
    assert run.returncode == 2 and "unknown project functions (eventing, serving)" in run.stdout
    assert list(tmp_path.iterdir()) == []


# -- what a build leaves (when there is one) ---------------------------------------------------------
def interpreter(path: Path) -> bool:
    """Whether the ELF64 executable at `path` names a dynamic loader (a PT_INTERP program header)."""
    with path.open("rb") as f:
        header = f.read(64)
        assert header[:5] == b"\x7fELF\x02"
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return any(struct.unpack_from("<I", table, i * phentsize)[0] == 3 for i in range(phnum))


@pytest.mark.parametrize("project", ["eventing", "serving"])
def test_the_binaries_are_static_and_are_what_the_deployments_images_name(project):
    if not is_built(project):
        pytest.skip(f"Knative {project} is not built (bash localcp/build-knative.sh)")
    for name in COMMANDS[project]:
        assert not interpreter(built(project) / "bin" / name), f"{name} is dynamically linked"
    images = set()
    for path in (built(project) / "config" / "core" / "deployments").glob("*.yaml"):
        for d in documents(path):
            if d["kind"] in ("Deployment", "StatefulSet"):
                images |= {c["image"] for c in d["spec"]["template"]["spec"]["containers"]}
    ours = {f"ko://knative.dev/{project}/cmd/{name}" for name in COMMANDS[project]}
    # Not built (yet): eventing's job sink and request-reply, which config/core deploys too.
    assert images - ours <= {"ko://knative.dev/eventing/cmd/jobsink", "ko://knative.dev/eventing/cmd/requestreply"}


def test_eventings_controller_finds_its_adapter_images_and_configmaps_in_the_configuration():
    if not is_built("eventing"):
        pytest.skip("Knative Eventing is not built (bash localcp/build-knative.sh)")
    config = built("eventing") / "config" / "core"
    controller, = documents(config / "deployments" / "controller.yaml")
    env = {e["name"]: e for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["APISERVER_RA_IMAGE"]["value"] == "ko://knative.dev/eventing/cmd/apiserver_receive_adapter"
    refs = [e["valueFrom"]["configMapKeyRef"] for e in env.values() if "configMapKeyRef" in e.get("valueFrom", {})]
    read = {ref["name"]: {r["key"] for r in refs if r["name"] == ref["name"]} for ref in refs}
    assert not any(ref.get("optional") for ref in refs)
    assert set(read) == {"eventing-integrations-images", "eventing-transformations-images"}
    for name, keys in read.items():  # not optional: the pod does not start without them
        configmap, = documents(config / "configmaps" / f"{name}.yaml")
        assert configmap["metadata"] == {**configmap["metadata"], "name": name, "namespace": "knative-eventing"}
        assert keys <= set(configmap["data"])
    crds = {d["metadata"]["name"] for p in (config / "resources").glob("*.yaml") for d in documents(p)}
    assert {"apiserversources.sources.knative.dev", "pingsources.sources.knative.dev"} <= crds


def test_servings_configuration_has_the_networking_and_caching_crds_its_go_mod_pins():
    if not is_built("serving"):
        pytest.skip("Knative Serving is not built (bash localcp/build-knative.sh)")
    config = built("serving") / "config"
    crds = {d["metadata"]["name"] for p in config.rglob("*.yaml") for d in documents(p)
            if d["kind"] == "CustomResourceDefinition"}
    assert {"certificates.networking.internal.knative.dev", "ingresses.networking.internal.knative.dev",
            "serverlessservices.networking.internal.knative.dev", "images.caching.internal.knative.dev",
            "services.serving.knative.dev", "revisions.serving.knative.dev"} <= crds
    modules = (config / "modules.txt").read_text()
    assert f"knative.dev/serving@{versions.knative('serving')} " in modules
    assert "knative.dev/networking@v0.0.0-" in modules and "knative.dev/caching@v0.0.0-" in modules
