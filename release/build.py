"""`make release VERSION=x.y.z`: the files of a release, built into dist/.

    python -m release.build --version X.Y.Z [--url URL] [--out dist] [--image-registry REGISTRY]
                            [--no-images] [--helm HELM] [--changelog CHANGELOG.md]

pyproject.toml's `version` is the one place the version is kept. Refused before anything is
written, with exit status 2 and one line naming the fix: a VERSION that is not pyproject's, a
CHANGELOG.md without an entry for it, an OUT that holds files this script did not write. Then OUT
is emptied and gets:

  gpu-scheduler-X.Y.Z.tgz               the chart (helm package; X.Y.Z stamped into its copy of
                                        Chart.yaml as version and appVersion, the images' default tag)
  index.yaml                            a chart repository's index of it (helm repo index --url URL)
  {bind,mutate,check}-X.Y.Z-ARCH.tar    the images as OCI archives, named
                                        REGISTRY/gpu-scheduler-NAME:X.Y.Z (--no-images: none)
  gpu_scheduler-X.Y.Z-py3-none-any.whl  the Python package: the kubectl plugin
  kubectl-gpu_scheduler-vX.Y.Z.tar.gz   krew's archive, and gpu-scheduler.yaml, krew's manifest with
                                        the archive's URL and sha256 (plugins/krew/release.py)
  RELEASE_NOTES.md                      CHANGELOG.md's entry, the files, how to install them, and
                                        what this machine did not build
  SHA256SUMS                            of every file above: cd OUT && sha256sum -c SHA256SUMS

URL is where these files will be downloadable (default: the project's releases download URL, with
OWNER to replace); the chart index and the krew manifest point there. The images are built by
localcp/images.py (no Docker): the very images the local control plane runs, under the release's
names. docs/plugin-release.md describes the whole flow.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # also when run as `python release/build.py`
    sys.path.insert(0, str(REPO))

PYPROJECT = REPO / "pyproject.toml"
CHANGELOG = REPO / "CHANGELOG.md"
CHART = REPO / "chart" / "gpu-scheduler"
KREW_RELEASE = REPO / "plugins" / "krew" / "release.py"
DEFAULT_URL = "https://github.com/OWNER/gpu-scheduler/releases/download/v{version}"
DEFAULT_REGISTRY = "localhost"
IMAGES = ("bind", "mutate", "check")
MARKER = ".gpu-scheduler-release"  # in OUT: this script wrote what is there, and may empty it
# Semantic versioning, as krew and helm require it (krew's manifest adds the "v").
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")
REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*")


class ReleaseError(Exception):
    """Why there is no release: one line that names the fix."""


def log(message: str) -> None:
    print(f"release: {message}", flush=True)


def run(argv: list[str], **kwargs) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise ReleaseError(f"{' '.join(map(str, argv))} failed with {done.returncode}:\n{tail}")
    return done.stdout


# -- what is refused -------------------------------------------------------------------------------
def package_version(pyproject: Path = PYPROJECT) -> str:
    return tomllib.loads(pyproject.read_text())["project"]["version"]


def changelog_entry(text: str, version: str) -> tuple[str, str] | None:
    """(date, body) of CHANGELOG.md's `## [version] - date` section, None when it has none. The body
    ends at the next `## ` heading; link reference definitions (`[x]: URL`) are left out."""
    heading = re.compile(rf"^## \[?{re.escape(version)}\]?(?:\s+-\s+(\S+))?\s*$", re.MULTILINE)
    found = heading.search(text)
    if not found:
        return None
    following = re.compile(r"^## ", re.MULTILINE).search(text, found.end())
    body = text[found.end():following.start() if following else len(text)]
    lines = [line for line in body.splitlines() if not re.match(r"^\[[^\]]+\]:\s", line)]
    return found.group(1) or "", "\n".join(lines).strip()


def check(version: str, changelog: Path = CHANGELOG, pyproject: Path = PYPROJECT) -> tuple[str, str]:
    """The changelog entry's (date, body) for `version`, or why it cannot be released."""
    if not SEMVER.fullmatch(version):
        raise ReleaseError(f"VERSION {version!r} is not a semantic version x.y.z (krew and helm need one):"
                           " run make release VERSION=x.y.z with pyproject.toml's version")
    kept = package_version(pyproject)
    if version != kept:
        raise ReleaseError(f"VERSION {version} is not pyproject.toml's version ({kept}), the one place the version"
                           f" is kept: set version = \"{version}\" in pyproject.toml (and give it a CHANGELOG.md"
                           f" entry), or run make release VERSION={kept}")
    if not changelog.exists():
        raise ReleaseError(f"{changelog} is missing: create it (Keep a Changelog) with a '## [{version}] - YYYY-MM-DD'"
                           " entry saying what changed")
    entry = changelog_entry(changelog.read_text(), version)
    if entry is None:
        raise ReleaseError(f"{changelog} has no entry for {version}: add a '## [{version}] - YYYY-MM-DD' section"
                           " (Keep a Changelog) saying what changed, then run make release again")
    if not entry[1]:
        raise ReleaseError(f"{changelog}'s entry for {version} is empty: say in it what changed")
    return entry


def prepare(out: Path) -> None:
    """OUT, empty but for the marker; refused if it holds files this script did not write."""
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ReleaseError(f"{out} holds files make release did not write: move them away (or remove {out}),"
                           " or choose another --out")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / MARKER).write_text("written by release/build.py: emptied by the next release\n")


# -- the pieces --------------------------------------------------------------------------------
def source_date_epoch() -> str:
    """The commit's time, for the wheel's file times: the same commit gives the same wheel."""
    done = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "315532800"  # 1980, zip's first


def build_wheel(out: Path, version: str) -> Path:
    """`pip wheel --no-deps` of a copy of the package's sources: a stale build/ or *.egg-info of the
    checkout cannot leak into it. Its build backend (pyproject's build-system) comes through pip's
    own configuration."""
    project = tomllib.loads(PYPROJECT.read_text())
    packages = {name.split(".")[0] for name in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    with tempfile.TemporaryDirectory(prefix="release-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in ("pyproject.toml", "LICENSE"):
            shutil.copy2(REPO / name, source / name)
        for package in sorted(packages):
            shutil.copytree(REPO / package, source / package,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        env = {**os.environ, "SOURCE_DATE_EPOCH": source_date_epoch(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(source)],
            env=env, cwd=tmp, timeout=900)
    wheel = out / f"gpu_scheduler-{version}-py3-none-any.whl"
    if not wheel.exists():
        raise ReleaseError(f"pip wheel wrote {sorted(p.name for p in out.glob('*.whl'))}, not {wheel.name}")
    return wheel


def krew_module():
    spec = importlib.util.spec_from_file_location("krew_release", KREW_RELEASE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_krew(out: Path, url: str) -> tuple[Path, Path]:
    krew = krew_module()
    try:
        return krew.release(url, out)
    except krew.ReleaseError as error:
        raise ReleaseError(str(error)) from None


def stamp_chart(chart_yaml: Path, version: str) -> None:
    """version and appVersion of a copy of Chart.yaml, set to the release's; comments kept."""
    text = chart_yaml.read_text()
    for key, value in (("version", version), ("appVersion", f'"{version}"')):
        text, count = re.subn(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.MULTILINE)
        if count != 1:
            raise ReleaseError(f"{CHART / 'Chart.yaml'}: expected one top-level {key}: line, found {count}")
    chart_yaml.write_text(text)


def find_helm(given: str | None) -> str:
    if given:
        return given
    if shutil.which("helm"):
        return shutil.which("helm")
    log("helm: not on PATH; localcp/build-helm.sh's (built once, then cached)")
    run(["bash", str(REPO / "localcp" / "build-helm.sh")], timeout=3600)
    return run(["bash", str(REPO / "localcp" / "build-helm.sh"), "--path"]).strip()


def build_chart(out: Path, version: str, url: str, helm: str) -> tuple[Path, Path]:
    """The chart packaged from a copy stamped with the version (lint --strict first), and the index
    of OUT as a chart repository whose files are at URL."""
    with tempfile.TemporaryDirectory(prefix="release-chart-") as tmp:
        chart = Path(tmp) / CHART.name  # helm wants the directory named as the chart
        shutil.copytree(CHART, chart)
        stamp_chart(chart / "Chart.yaml", version)
        run([helm, "lint", "--strict", str(chart)], timeout=300)
        run([helm, "package", str(chart), "--destination", str(out)], timeout=300)
    package = out / f"{CHART.name}-{version}.tgz"
    if not package.exists():
        raise ReleaseError(f"helm package did not write {package.name}")
    run([helm, "repo", "index", str(out), "--url", url], timeout=300)
    return package, out / "index.yaml"


def retag(source: Path, name: str, target: Path) -> dict:
    """An OCI archive's copy under another name: only index.json changes (the annotations that name
    the image), so the manifest, config and layers, and the image's digest, are the source's."""
    tag = name.rsplit(":", 1)[1]
    partial = target.with_name(target.name + ".part")
    with tarfile.open(source) as src, tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as dst:
        index = None
        for member in src:
            if member.name == "index.json":
                index = json.load(src.extractfile(member))
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        if index is None or len(index.get("manifests", [])) != 1:
            raise ReleaseError(f"{source}: expected an OCI archive with one manifest in index.json")
        index["manifests"][0]["annotations"] = {"io.containerd.image.name": name,
                                                "org.opencontainers.image.ref.name": tag}
        data = json.dumps(index).encode()
        info = tarfile.TarInfo("index.json")
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        dst.addfile(info, io.BytesIO(data))
    partial.rename(target)
    return index["manifests"][0]


def build_images(out: Path, version: str, registry: str) -> list[dict]:
    """bind, mutate and check from localcp/images.py (built once per content, cached), copied into
    OUT as NAME-VERSION-ARCH.tar under REGISTRY/gpu-scheduler-NAME:VERSION."""
    from localcp import images
    if not images.BASE_ROOTFS.exists():
        log("images' base: bash localcp/build-node.sh (built once, cached)")
        run(["bash", str(REPO / "localcp" / "build-node.sh")], timeout=3600)
    built = []
    for name in IMAGES:
        start = time.monotonic()
        image = images.check_image() if name == "check" else images.function_image(name)
        reference = f"{registry}/gpu-scheduler-{name}:{version}"
        platform = image.index["manifests"][0]["platform"]
        target = out / f"{name}-{version}-{platform['architecture']}.tar"
        descriptor = retag(image.archive, reference, target)
        built.append({"name": name, "reference": reference, "file": target.name, "digest": descriptor["digest"],
                      "platform": f"{platform['os']}/{platform['architecture']}",
                      "dockerfile": f"Dockerfile.{name}", "size": target.stat().st_size})
        log(f"image {reference}: {target.name} ({descriptor['digest'][:19]}…, {time.monotonic() - start:.1f} s)")
    return built


# -- notes and sums ---------------------------------------------------------------------------------
def commit() -> str:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def other_architectures(built: list[dict]) -> str:
    have = {image["platform"].split("/")[1] for image in built}
    missing = sorted({"amd64", "arm64"} - have) if have else []
    if not missing:
        return ""
    return (f"**Not built: {', '.join(missing)}.** `localcp/images.py`, the builder that made these images"
            " without Docker, builds for the machine it runs on only: its base is that machine's Debian"
            " bookworm python3, unpacked, and the Dockerfiles' `RUN` steps (`python -m venv`, `pip install`)"
            " execute inside it. Another architecture would need that architecture's packages and an"
            " emulator to run them (qemu-user through binfmt_misc), which the builder does not use."
            " The Dockerfiles' base is a multi-architecture image, so on a machine with Docker,"
            f" `docker buildx build --platform linux/{missing[0]} -f Dockerfile.bind .` (and the same for"
            " Dockerfile.mutate and Dockerfile.check) should build them; `make release` does not"
            " (it needs no Docker), and that command was not tried here.")


def release_notes(version: str, date: str, entry: str, url: str, registry: str, files: dict[str, str],
                  built: list[dict] | None) -> str:
    """RELEASE_NOTES.md: the changelog's entry, then the files and how to use them."""
    chart = f"{CHART.name}-{version}.tgz"
    lines = [f"# gpu-scheduler {version}" + (f" ({date})" if date else ""), "", entry, "", "## Files", "",
             "| file | what it is |", "|------|------------|"]
    lines += [f"| `{name}` | {what} |" for name, what in files.items()]
    lines += ["", f"Built from commit {commit()} by `make release VERSION={version}`. Check the files"
              " with `sha256sum -c SHA256SUMS`.", "", "## Install", "",
              "The chart, from this release's chart repository (the images' tag defaults to the chart's"
              f" appVersion, {version}):", "", "```sh",
              f"helm repo add gpu-scheduler {url}",
              f"helm upgrade --install gpu-scheduler gpu-scheduler/gpu-scheduler --version {version} \\",
              "  -n gpu-scheduler --create-namespace -f my-values.yaml",
              "# my-values.yaml names the images where your nodes pull them from:",
              "#   bind.image.repository, mutate.image.repository",
              "```", "", "or the package itself: `helm install gpu-scheduler "
              f"{url}/{chart} ...`. Every value and what the cluster needs: `docs/install.md`.", ""]
    lines += ["The kubectl plugin, in a virtualenv (Python 3.11 or later):", "", "```sh",
              "python3 -m venv ~/.local/share/kubectl-gpu-scheduler",
              f"~/.local/share/kubectl-gpu-scheduler/bin/pip install {url}/gpu_scheduler-{version}-py3-none-any.whl",
              "~/.local/share/kubectl-gpu-scheduler/bin/kubectl-gpu_scheduler --version",
              "```", "",
              "or with krew: `kubectl krew install --manifest=gpu-scheduler.yaml` (the manifest's caveats say how"
              " to install the package krew's launcher runs; `docs/plugin-release.md`).", "", "## Images", ""]
    if built is None:
        lines += ["**Not built in this run** (`--no-images`): this release has no image archives.", ""]
    else:
        lines += ["| image | file | manifest digest | platform |", "|-------|------|-----------------|----------|"]
        lines += [f"| `{i['reference']}` | `{i['file']}` ({i['size'] / 2**20:.0f} MiB) | `{i['digest']}` | {i['platform']} |"
                  for i in built]
        lines += ["", "OCI image layouts in one tar each, layers uncompressed. Push one to your registry, for"
                  f" example `skopeo copy oci-archive:{built[0]['file']} docker://REGISTRY/gpu-scheduler-"
                  f"{built[0]['name']}:{version}`, or load it onto a node with"
                  f" `ctr -n k8s.io images import {built[0]['file']}` (how the local control plane loads"
                  f" them). They are named `{registry}/gpu-scheduler-NAME:{version}` inside.", "",
                  "How they were built: `localcp/images.py` applies `Dockerfile.bind`, `Dockerfile.mutate` and"
                  " `Dockerfile.check` without Docker, to a stand-in for their `FROM` image"
                  " (python:3.11.13-slim-bookworm): Debian bookworm's python3 packages (Python 3.11), with"
                  " `python` on the PATH as in the python image. The functions' dependencies are the same pinned"
                  " wheels (`functions/*/requirements.txt`); the base layer is Debian's python3, not the"
                  " python image's own build. They are the images the local control plane runs on its real"
                  " nodes (check always; bind and mutate when the tests run them in the cluster), under the"
                  " release's names: the same manifest digests.", ""]
        note = other_architectures(built)
        if note:
            lines += [note, ""]
    return "\n".join(lines)


def write_sums(out: Path) -> Path:
    """SHA256SUMS of every file in OUT, in sha256sum's format."""
    sums = out / "SHA256SUMS"
    entries = []
    for path in sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith(".") and p != sums):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        entries.append(f"{digest.hexdigest()}  {path.name}\n")
    sums.write_text("".join(entries))
    return sums


# -- the release ---------------------------------------------------------------------------------
def release(version: str, url: str | None = None, out: Path = REPO / "dist", registry: str = DEFAULT_REGISTRY,
            images: bool = True, helm: str | None = None, changelog: Path = CHANGELOG) -> list[Path]:
    date, entry = check(version, changelog)
    url = (url or DEFAULT_URL.format(version=version)).rstrip("/")
    if not re.fullmatch(r"https://[^\s]+", url):
        raise ReleaseError(f"RELEASE_URL: expected an https:// URL without spaces (krew accepts no other), found: {url}")
    if not REGISTRY.fullmatch(registry):
        raise ReleaseError(f"IMAGE_REGISTRY: {registry!r} is not a registry and path an image name may start with"
                           " (lower case, e.g. registry.example.org/team)")
    out = out.resolve()  # pip runs in a directory of its own
    prepare(out)
    helm = find_helm(helm)
    if "OWNER" in url:
        log(f"warning: the files will point at {url}: set RELEASE_URL to where they will be downloadable"
            " before publishing them")
    steps = time.monotonic()

    def done(what: str, start: float) -> None:
        log(f"{what} ({time.monotonic() - start:.1f} s)")

    start = time.monotonic()
    wheel = build_wheel(out, version)
    done(f"wheel {wheel.name}", start)
    start = time.monotonic()
    archive, manifest = build_krew(out, url)
    done(f"krew {archive.name}, {manifest.name}", start)
    start = time.monotonic()
    package, index = build_chart(out, version, url, helm)
    done(f"chart {package.name}, {index.name}", start)
    built = build_images(out, version, registry) if images else None
    files = {package.name: f"the Helm chart, version and appVersion {version}",
             index.name: f"a chart repository's index of it, at {url}"}
    for image in built or []:
        files[image["file"]] = f"the {image['name']} image ({image['dockerfile']}), {image['platform']}, OCI archive"
    files |= {wheel.name: "the Python package: the kubectl plugin `kubectl-gpu_scheduler` (pip installs it)",
              archive.name: "krew's archive: the plugin's launcher",
              manifest.name: "krew's manifest, with the archive's URL and sha256",
              "RELEASE_NOTES.md": "this page", "SHA256SUMS": "the sha256 of every file here"}
    (out / "RELEASE_NOTES.md").write_text(release_notes(version, date, entry, url, registry, files, built))
    sums = write_sums(out)
    done(f"{len(sums.read_text().splitlines())} files in {out}", steps)
    return sorted(p for p in out.iterdir() if not p.name.startswith("."))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.build", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--version", required=True, help="the release's version: must be pyproject.toml's")
    parser.add_argument("--url", help="where the files will be downloadable (default: "
                        + DEFAULT_URL.format(version="X.Y.Z") + ")")
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="directory to write (default: dist)")
    parser.add_argument("--image-registry", default=DEFAULT_REGISTRY,
                        help=f"the images' names start with it (default: {DEFAULT_REGISTRY})")
    parser.add_argument("--no-images", action="store_true", help="build no image archives (the notes say so)")
    parser.add_argument("--helm", help="the helm binary (default: helm on PATH, else localcp/build-helm.sh's)")
    parser.add_argument("--changelog", type=Path, default=CHANGELOG, help="default: CHANGELOG.md")
    args = parser.parse_args(argv)
    try:
        written = release(args.version, args.url, args.out, args.image_registry, not args.no_images, args.helm,
                          args.changelog)
    except (ReleaseError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
