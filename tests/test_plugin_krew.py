"""The krew manifest (plugins/krew/gpu-scheduler.yaml) and its release step (plugins/krew/release.py):
krew's checks of a manifest (sigs.k8s.io/krew internal/index/validation, restated here: krew itself
is not installed on this machine), the version is the package's, and the archive's launcher runs
the installed package as kubectl runs a plugin that krew installed."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from localcp.cluster import BIN

KREW = REPO / "plugins" / "krew"
MANIFEST = KREW / "gpu-scheduler.yaml"
VERSION = metadata.version("gpu-scheduler")
WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
# krew's semver: a "v", then major.minor.patch, an optional pre-release and build.
SEMVER = re.compile(r"v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")


def krew_problems(manifest: dict, file_name: str) -> list[str]:
    """What krew's ValidatePlugin (and validatePlatform, validateFiles, validateSelector) refuse."""
    name, spec = Path(file_name).stem, manifest.get("spec") or {}
    problems = []
    if manifest.get("apiVersion") != "krew.googlecontainertools.github.com/v1alpha2":
        problems.append("apiVersion")
    if manifest.get("kind") != "Plugin":
        problems.append("kind")
    if not re.fullmatch(r"[\w-]+", name) or name.upper() in WINDOWS_RESERVED:
        problems.append("unsafe name")
    if (manifest.get("metadata") or {}).get("name") != name:
        problems.append("metadata.name is not the file's name")
    if not spec.get("shortDescription") or re.search(r"[\r\n]", spec["shortDescription"]):
        problems.append("shortDescription")
    if not SEMVER.fullmatch(str(spec.get("version"))):
        problems.append("version")
    if not spec.get("platforms"):
        problems.append("platforms")
    for platform in spec.get("platforms") or []:
        if not platform.get("uri"):
            problems.append("uri")
        if not re.fullmatch(r"[a-f0-9]{64}", str(platform.get("sha256"))):
            problems.append("sha256")
        if not platform.get("bin"):
            problems.append("bin")
        files = platform.get("files")
        if files is not None and (not files or not all(f.get("from") and f.get("to") for f in files)):
            problems.append("files")
        selector = platform.get("selector") or {}
        keys = [*(selector.get("matchLabels") or {}), *(e.get("key") for e in selector.get("matchExpressions") or [])]
        if not keys or set(keys) - {"os", "arch"}:
            problems.append("selector")
    return problems


def release(out: Path, base_url: str = "https://downloads.example/gpu-scheduler/v1") -> tuple[Path, dict]:
    done = subprocess.run([sys.executable, str(KREW / "release.py"), "--base-url", base_url, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    archive, manifest = (Path(line) for line in done.stdout.splitlines())
    return archive, yaml.safe_load(manifest.read_text())


def test_the_manifest_has_what_krew_requires_but_the_release_placeholders():
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert krew_problems(manifest, MANIFEST.name) == ["version", "sha256"], "only the placeholders are left to fill"
    [platform] = manifest["spec"]["platforms"]
    assert (platform["uri"], platform["sha256"]) == ("RELEASE_BASE_URL/kubectl-gpu_scheduler-vRELEASE_VERSION.tar.gz",
                                                     "RELEASE_ARCHIVE_SHA256")
    assert platform["bin"] == "kubectl-gpu_scheduler", "kubectl runs `gpu-scheduler` as kubectl-gpu_scheduler"


def test_the_template_names_no_version_the_release_fills_in_the_packages(tmp_path):
    """pyproject.toml is the one place the version is kept: the template has a placeholder, and the
    manifest the release writes has pyproject's version, in spec.version, the uri and the caveats."""
    text = MANIFEST.read_text()
    assert VERSION not in text and re.search(r"\d+\.\d+\.\d+", text) is None
    spec = yaml.safe_load(text)["spec"]
    assert spec["version"] == "vRELEASE_VERSION"
    assert "pip install \\\n    RELEASE_BASE_URL/gpu_scheduler-RELEASE_VERSION-py3-none-any.whl" in spec["caveats"]
    assert "pip" in spec["description"] and "Python package" in spec["description"]
    archive, manifest = release(tmp_path)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert manifest["spec"]["version"] == f"v{VERSION}" == f"v{pyproject}"
    assert archive.name == f"kubectl-gpu_scheduler-v{VERSION}.tar.gz"
    assert (f"pip install \\\n    https://downloads.example/gpu-scheduler/v1/gpu_scheduler-{VERSION}-py3-none-any.whl"
            in manifest["spec"]["caveats"])


def test_the_manifest_names_every_command_and_what_the_plugin_reads():
    """What `kubectl krew info` shows: every subcommand, and every kind the plugin may read
    (gpu_scheduler.permissions.PLUGIN)."""
    from gpu_scheduler.permissions import PLUGIN

    spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    for command in ("plan", "explain", "suggest", "gpus"):
        assert f"kubectl gpu-scheduler {command} " in spec["description"], command
    caveats = " ".join(spec["caveats"].split()).lower()
    for _group, resource, _verb in PLUGIN:
        assert resource in caveats, f"the caveats do not say the plugin reads {resource}"
    assert "only reads" in caveats and {verb for *_, verb in PLUGIN} <= {"get", "list"}


def test_the_release_step_fills_in_a_manifest_krew_accepts(tmp_path):
    archive, manifest = release(tmp_path / "a", "https://downloads.example/gpu-scheduler/v1/")
    assert krew_problems(manifest, "gpu-scheduler.yaml") == []
    [platform] = manifest["spec"]["platforms"]
    assert platform["uri"] == f"https://downloads.example/gpu-scheduler/v1/{archive.name}"
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert "RELEASE_" not in (tmp_path / "a" / "gpu-scheduler.yaml").read_text()
    assert release(tmp_path / "b")[0].read_bytes() == archive.read_bytes(), "the same bytes on every run"
    with tarfile.open(archive) as tar:
        [entry] = tar.getmembers()
    assert (entry.name, entry.mode, entry.mtime, entry.uid) == (platform["bin"], 0o755, 0, 0)


@pytest.mark.parametrize("argv,message", [
    (["--base-url", "http://insecure.example/x"], "--base-url: expected an https:// URL"),
    (["--base-url", "https://a b"], "--base-url: expected an https:// URL"),
])
def test_the_release_step_refuses_a_bad_url(tmp_path, argv, message):
    done = subprocess.run([sys.executable, str(KREW / "release.py"), *argv, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The archive unpacked and linked as krew does: ~/.krew/bin/kubectl-gpu_scheduler -> the store."""
    root = tmp_path_factory.mktemp("krew")
    archive, manifest = release(root / "dist")
    store = root / "store" / "gpu-scheduler" / manifest["spec"]["version"]
    with tarfile.open(archive) as tar:
        tar.extractall(store, filter="data")
    (root / "bin").mkdir()
    (root / "bin" / "kubectl-gpu_scheduler").symlink_to(store / manifest["spec"]["platforms"][0]["bin"])
    return root / "bin"


def launch(bin_dir: Path, python: str, *argv: str, kubectl: bool = False) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "KUBECTL_GPU_SCHEDULER_PYTHON": python}
    command = [str(BIN / "kubectl"), "gpu-scheduler"] if kubectl else [str(bin_dir / "kubectl-gpu_scheduler")]
    return subprocess.run([*command, *argv], cwd=bin_dir, env=env, capture_output=True, text=True, timeout=60)


def test_the_launcher_runs_the_installed_package(installed):
    done = launch(installed, sys.executable, "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kubectl-gpu_scheduler version v{VERSION}\n", "")


def test_the_launcher_says_how_to_install_what_is_missing(installed, tmp_path):
    bare = tmp_path / "python-without-the-package"
    bare.write_text(f"#!/bin/sh\nexec '{sys.executable}' -I -S \"$@\"\n")  # no site-packages
    bare.chmod(0o755)
    done = launch(installed, str(bare), "--version")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: the gpu-scheduler Python package is not installed for {bare}: install it"
                                  " with pip") and done.stderr.count("\n") == 1
    done = launch(installed, str(tmp_path / "nowhere" / "python3"), "--version")
    assert done.returncode == 2 and done.stderr.startswith(f"error: {tmp_path / 'nowhere' / 'python3'} not found")


@pytest.mark.skipif(not (BIN / "kubectl").exists(), reason="kubectl is built by localcp/build.sh (make controlplane)")
def test_kubectl_runs_the_plugin_krew_installed(installed):
    done = launch(installed, sys.executable, "plan", "-f", str(REPO / "check" / "statefulset.yaml"), "-o", "json",
                  kubectl=True)
    assert done.returncode == 0, done.stderr
    assert [p["node"] for p in yaml.safe_load(done.stdout)["workloads"][0]["pods"]] == [
        "node1", "node2", "node3", "node4", "node4"]
