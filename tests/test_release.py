"""`make release VERSION=x.y.z` (release/build.py): what it refuses and how it says so, and what it
builds, used as a user would use it: the wheel installed with its dependencies into a fresh
virtualenv (pip reaches the package index) runs the plugin; krew's manifest names the archive's
sha256; the chart package carries the version into the images' tags; the image archives are the
images the local control plane runs, renamed.

The release needs helm (localcp/build-helm.sh, `make controlplane`): without it the tests that build
one are skipped. The images are built (from localcp/images.py's cache: seconds; about 15 s each
when their sources changed) when the images' base is there (localcp/build-node.sh), else the
release is built with --no-images and the image test is skipped.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from localcp import images
from release import build

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
URL = f"https://downloads.example/gpu-scheduler/v{VERSION}"
REGISTRY = "registry.example/team"
HELM = shutil.which("helm") or subprocess.run(["bash", str(REPO / "localcp" / "build-helm.sh"), "--path"],
                                              capture_output=True, text=True).stdout.strip()


def run_build(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "release.build", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=900)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# -- refusals: before anything is written, one line that names the fix ---------------------------
def test_a_version_that_is_not_pyprojects_is_refused(tmp_path):
    done = run_build("--version", "9.9.9", "--out", str(tmp_path / "dist"), "--no-images")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: VERSION 9.9.9 is not pyproject.toml's version ({VERSION}), the one place the"
                           " version is kept: set version = \"9.9.9\" in pyproject.toml (and give it a CHANGELOG.md"
                           f" entry), or run make release VERSION={VERSION}\n")
    assert not (tmp_path / "dist").exists()


def test_a_version_that_is_not_semantic_is_refused(tmp_path):
    done = run_build("--version", f"v{VERSION}", "--out", str(tmp_path / "dist"))
    assert done.returncode == 2
    assert done.stderr == (f"error: VERSION 'v{VERSION}' is not a semantic version x.y.z (krew and helm need one):"
                           " run make release VERSION=x.y.z with pyproject.toml's version\n")
    assert not (tmp_path / "dist").exists()


def test_a_version_without_a_changelog_entry_is_refused(tmp_path):
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## [Unreleased]\n\n- something\n\n## [0.0.1] - 2026-01-01\n\n- the first\n")
    done = run_build("--version", VERSION, "--changelog", str(changelog), "--out", str(tmp_path / "dist"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: {changelog} has no entry for {VERSION}: add a '## [{VERSION}] - YYYY-MM-DD'"
                           " section (Keep a Changelog) saying what changed, then run make release again\n")
    assert not (tmp_path / "dist").exists()
    changelog.write_text(f"# Changelog\n\n## [{VERSION}] - 2026-01-02\n\n## [0.0.1] - 2026-01-01\n\n- the first\n")
    done = run_build("--version", VERSION, "--changelog", str(changelog), "--out", str(tmp_path / "dist"))
    assert done.returncode == 2
    assert done.stderr == f"error: {changelog}'s entry for {VERSION} is empty: say in it what changed\n"


def test_make_release_without_a_version_is_refused_before_building_anything():
    done = subprocess.run(["make", "--no-print-directory", "release"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert ("*** VERSION=x.y.z is required for make release: pyproject.toml's version, with an entry in"
            " CHANGELOG.md.  Stop.") in done.stderr


def test_an_out_directory_with_files_it_did_not_write_is_left_alone(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(build.ReleaseError, match=f"^{re.escape(str(tmp_path))} holds files make release did not"
                                                 " write: move them away"):
        build.prepare(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    out = tmp_path / "dist"
    build.prepare(out)
    (out / "gpu-scheduler-0.0.1.tgz").write_text("a previous release")
    build.prepare(out)  # its own: emptied, so SHA256SUMS and index.yaml name this release's files only
    assert [p.name for p in out.iterdir()] == [build.MARKER]


def test_the_changelog_entry_is_the_section_under_the_versions_heading():
    text = ("# Changelog\n\n## [Unreleased]\n\n- next\n\n## [1.2.0] - 2026-03-04\n\nIntro.\n\n### Added\n\n- a\n"
            "\n## [1.1.0] - 2026-01-01\n\n- older\n\n[1.2.0]: https://example.org/v1.2.0\n")
    assert build.changelog_entry(text, "1.2.0") == ("2026-03-04", "Intro.\n\n### Added\n\n- a")
    assert build.changelog_entry(text, "1.1.0") == ("2026-01-01", "- older")
    assert build.changelog_entry(text, "1.2") is None and build.changelog_entry(text, "1.1.0.1") is None
    date, entry = build.check(VERSION)  # the repository's own CHANGELOG.md has this version's entry
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) and entry


# -- the release ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    if not Path(HELM).is_file():
        pytest.skip("helm is built by localcp/build-helm.sh (make controlplane)")
    out = tmp_path_factory.mktemp("release") / "dist"
    no_images = [] if images.BASE_ROOTFS.exists() else ["--no-images"]
    done = run_build("--version", VERSION, "--url", URL, "--out", str(out), "--image-registry", REGISTRY,
                     "--helm", HELM, *no_images)
    assert done.returncode == 0, done.stderr
    yield out
    for archive in out.glob("*.tar"):  # hundreds of MB each: not kept with pytest's last temporary directories
        archive.unlink()


def test_every_file_is_in_sha256sums(released):
    files = sorted(p.name for p in released.iterdir() if not p.name.startswith("."))
    expected = {f"gpu-scheduler-{VERSION}.tgz", "index.yaml", f"gpu_scheduler-{VERSION}-py3-none-any.whl",
                f"kubectl-gpu_scheduler-v{VERSION}.tar.gz", "gpu-scheduler.yaml", "RELEASE_NOTES.md", "SHA256SUMS"}
    if images.BASE_ROOTFS.exists():
        expected |= {f"{name}-{VERSION}-{images._architecture()}.tar" for name in ("bind", "mutate", "check")}
    assert set(files) == expected
    sums = dict(reversed(line.split("  ")) for line in (released / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == sorted(set(files) - {"SHA256SUMS"})
    assert all(sums[name] == sha256(released / name) for name in sums)
    done = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=released, capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout.count(": OK\n") == len(sums)


def test_the_krew_manifest_names_the_archives_url_and_sha256(released):
    manifest = yaml.safe_load((released / "gpu-scheduler.yaml").read_text())
    archive = released / f"kubectl-gpu_scheduler-v{VERSION}.tar.gz"
    [platform] = manifest["spec"]["platforms"]
    assert manifest["spec"]["version"] == f"v{VERSION}"
    assert (platform["uri"], platform["sha256"]) == (f"{URL}/{archive.name}", sha256(archive))
    assert f"pip install \\\n    {URL}/gpu_scheduler-{VERSION}-py3-none-any.whl\n" in manifest["spec"]["caveats"]
    assert "RELEASE_" not in (released / "gpu-scheduler.yaml").read_text()
    with tarfile.open(archive) as tar:
        [entry] = tar.getmembers()
        launcher = tar.extractfile(entry).read()
    assert (entry.name, entry.mode) == (platform["bin"], 0o755)
    assert launcher == (REPO / "plugins" / "krew" / "kubectl-gpu_scheduler").read_bytes()


def test_the_chart_carries_the_version_into_its_images_tags(released):
    package = released / f"gpu-scheduler-{VERSION}.tgz"
    with tarfile.open(package) as tar:
        chart = yaml.safe_load(tar.extractfile("gpu-scheduler/Chart.yaml"))
        names = tar.getnames()
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("gpu-scheduler", VERSION, VERSION)
    assert not [n for n in names if n.startswith("gpu-scheduler/ci/")], ".helmignore leaves the test values out"
    index = yaml.safe_load((released / "index.yaml").read_text())
    [entry] = index["entries"]["gpu-scheduler"]
    assert (entry["version"], entry["appVersion"]) == (VERSION, VERSION)
    assert (entry["urls"], entry["digest"]) == ([f"{URL}/{package.name}"], sha256(package))
    rendered = subprocess.run([HELM, "template", "gpu-scheduler", str(package), "--namespace", "gpu-scheduler",
                               "--set", f"bind.image.repository={REGISTRY}/gpu-scheduler-bind",
                               "--set", f"mutate.image.repository={REGISTRY}/gpu-scheduler-mutate"],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    found = set(re.findall(r"image: (\S+)", rendered.stdout))
    assert {f"{REGISTRY}/gpu-scheduler-bind:{VERSION}", f"{REGISTRY}/gpu-scheduler-mutate:{VERSION}"} <= found
    assert {image.rsplit(":", 1)[1] for image in found if "gpu-scheduler-" in image} == {VERSION}


def test_the_release_notes_are_the_changelogs_entry_and_say_what_was_not_built(released):
    notes = (released / "RELEASE_NOTES.md").read_text()
    date, entry = build.check(VERSION)
    assert notes.startswith(f"# gpu-scheduler {VERSION} ({date})\n\n{entry}\n\n## Files\n")
    for name in (p.name for p in released.iterdir() if not p.name.startswith(".")):
        assert f"| `{name}` |" in notes
    assert f"helm repo add gpu-scheduler {URL}\n" in notes
    assert f"pip install {URL}/gpu_scheduler-{VERSION}-py3-none-any.whl\n" in notes
    if not images.BASE_ROOTFS.exists():
        assert "**Not built in this run** (`--no-images`)" in notes
    elif images._architecture() == "amd64":
        assert "**Not built: arm64.** `localcp/images.py`, the builder that made these images" in notes


def test_the_wheel_installed_into_a_fresh_virtualenv_runs_the_plugin(released, tmp_path):
    """As the release notes and krew's caveats say: a virtualenv, pip install the wheel (its
    dependencies from the package index), then the command, directly and through krew's launcher."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    wheel = released / f"gpu_scheduler-{VERSION}-py3-none-any.whl"
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    # The wheel's dependencies are PyYAML and urllib3 (kubeapi/ loads kubeconfigs itself): the kubernetes
    # package, 30 MB and 0.7 s of imports, must not come with it.
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util, kubectl_gpu_scheduler, yaml,"
                            " urllib3; print(kubectl_gpu_scheduler.__file__);"
                            " print(importlib.util.find_spec('kubernetes') is None)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert where.returncode == 0, where.stderr
    installed_from, kubernetes_absent = where.stdout.splitlines()
    assert installed_from.startswith(str(venv / "lib"))  # the wheel's copy, not the checkout's
    assert kubernetes_absent == "True"

    command = str(venv / "bin" / "kubectl-gpu_scheduler")
    done = subprocess.run([command, "--version"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kubectl-gpu_scheduler version v{VERSION}\n", "")
    done = subprocess.run([command, "plan", "-f", "check/statefulset.yaml"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "StatefulSet default/gpu-scheduler-check (check/statefulset.yaml, document 1; replicas 5)"
    assert lines[1].split() == ["INDEX", "POD", "NODE", "CUDA_VISIBLE_DEVICES", "STATUS"]
    assert [line.split() for line in lines[2:7]] == [
        ["0", "gpu-scheduler-check-0", "node1", "0,1", "ok"], ["1", "gpu-scheduler-check-1", "node2", "2", "ok"],
        ["2", "gpu-scheduler-check-2", "node3", "0,1,2", "ok"], ["3", "gpu-scheduler-check-3", "node4", "3", "ok"],
        ["4", "gpu-scheduler-check-4", "node4", "3", "ok"]]

    # krew's launcher from the released archive, pointed at the virtualenv as the caveats say.
    with tarfile.open(released / f"kubectl-gpu_scheduler-v{VERSION}.tar.gz") as tar:
        tar.extractall(tmp_path / "krew", filter="data")
    launcher = {**env, "KUBECTL_GPU_SCHEDULER_PYTHON": str(venv / "bin" / "python"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(tmp_path / "krew" / "kubectl-gpu_scheduler"), "--version"], capture_output=True,
                          text=True, env=launcher, cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kubectl-gpu_scheduler version v{VERSION}\n", "")


def test_the_image_archives_are_the_local_images_under_the_releases_names(released):
    if not images.BASE_ROOTFS.exists():
        pytest.skip("the images' base is built by localcp/build-node.sh (make controlplane): released with"
                    " --no-images")
    arch = images._architecture()
    local = {"bind": images.function_image("bind"), "mutate": images.function_image("mutate"),
             "check": images.check_image()}
    for name, image in local.items():
        archive = released / f"{name}-{VERSION}-{arch}.tar"
        with tarfile.open(archive) as tar:
            members = {m.name: m for m in tar.getmembers()}
            [descriptor] = json.load(tar.extractfile("index.json"))["manifests"]
            # An OCI layout whose every blob is what its name says, from the index down.
            for member in members.values():
                if member.name.startswith("blobs/sha256/"):
                    digest = hashlib.sha256()
                    stream = tar.extractfile(member)
                    for chunk in iter(lambda: stream.read(1 << 20), b""):
                        digest.update(chunk)
                    assert member.name == f"blobs/sha256/{digest.hexdigest()}"
            manifest = json.load(tar.extractfile(f"blobs/sha256/{descriptor['digest'].split(':')[1]}"))
            config = json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
        assert "oci-layout" in members
        assert {f"blobs/sha256/{layer['digest'].split(':')[1]}" for layer in manifest["layers"]} <= set(members)
        assert descriptor["annotations"] == {"io.containerd.image.name": f"{REGISTRY}/gpu-scheduler-{name}:{VERSION}",
                                             "org.opencontainers.image.ref.name": VERSION}
        assert descriptor["platform"] == {"architecture": arch, "os": "linux"} and config["architecture"] == arch
        assert descriptor["digest"] == image.index["manifests"][0]["digest"], "the image the local nodes run"
