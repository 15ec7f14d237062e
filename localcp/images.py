"""Container images for the local nodes, built without Docker, as OCI archives that
`ctr images import` loads into each node's containerd.

- The check image. Dockerfile.check is its one definition, here and for `kind/images.sh`:
  read_dockerfile() reads its instructions (ENV, COPY, WORKDIR, USER, ENTRYPOINT, CMD) and
  check_image() applies them to a local base. The base stands in for the FROM image
  (python:3.11.x-slim-bookworm): Debian bookworm's python3-minimal, unpacked by
  localcp/build-node.sh, with `python` on the PATH as in the python image. Any other instruction
  (RUN, ADD, ...) is refused: it would make the two images differ.
- The pause (sandbox) image: localcp/pause/pause.go, built with the machine's Go.

Both are cached under CACHE/images/ by a digest of everything that goes into them, and are
reproducible: fixed timestamps and owners, so the same inputs give the same image digest.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shlex
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .cluster import CACHE, REPO

NODE_DIR = CACHE / "node-bookworm"  # localcp/build-node.sh
BASE_ROOTFS = NODE_DIR / "rootfs-python3-minimal.tar"
BASE_SUITE = "bookworm"
IMAGES = CACHE / "images"
CHECK_DOCKERFILE = REPO / "Dockerfile.check"
CHECK_MANIFEST = REPO / "check" / "statefulset.yaml"
PAUSE_SOURCE = REPO / "localcp" / "pause" / "pause.go"
FORMAT = "1"  # bump when the way images are assembled changes: the cache keys change with it
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUPPORTED = {"FROM", "ENV", "COPY", "WORKDIR", "USER", "ENTRYPOINT", "CMD"}


class ImageError(ValueError):
    """A Dockerfile or base this builder cannot honour; the message names the line."""


@dataclass
class Dockerfile:
    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)  # (source in the repo, destination)
    workdir: str = "/"
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def _logical_lines(text: str):
    """(line number, instruction line) with continuations joined and comments dropped."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield start, pending + stripped
        pending = ""
    if pending:
        yield start, pending


def read_dockerfile(path: Path = CHECK_DOCKERFILE) -> Dockerfile:
    """The instructions of a single-stage Dockerfile that only sets metadata and copies files."""
    spec = Dockerfile()
    for number, line in _logical_lines(path.read_text()):
        op, _, args = line.partition(" ")
        op, args = op.upper(), args.strip()
        where = f"{path.name} line {number}"
        if op not in SUPPORTED:
            raise ImageError(f"{where}: {op} is not supported by the local image builder (only {', '.join(sorted(SUPPORTED))})")
        if op == "FROM":
            if spec.base:
                raise ImageError(f"{where}: a second FROM; multi-stage builds are not supported")
            spec.base = args.split()[0]
        elif op == "ENV":
            words = shlex.split(args)
            if not all("=" in w for w in words):
                raise ImageError(f"{where}: ENV needs KEY=value pairs, got {args!r}")
            spec.env.update(w.split("=", 1) for w in words)
        elif op == "COPY":
            words = args.split()
            if len(words) != 2 or words[0].startswith("--"):
                raise ImageError(f"{where}: COPY takes one source file and one destination, got {args!r}")
            source = REPO / words[0]
            if not source.is_file():
                raise ImageError(f"{where}: COPY source {words[0]} is not a file in the repository")
            dest = words[1] if words[1].startswith("/") else f"{spec.workdir.rstrip('/')}/{words[1]}"
            if dest.endswith("/"):
                dest += source.name
            spec.copies.append((words[0], dest))
        elif op == "WORKDIR":
            spec.workdir = args
        elif op == "USER":
            spec.user = args
        elif op in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(args)
            except json.JSONDecodeError:
                raise ImageError(f"{where}: {op} must be in JSON (exec) form, got {args!r}") from None
            setattr(spec, op.lower(), value)
    if not spec.base:
        raise ImageError(f"{path.name}: no FROM")
    return spec


def base_python(base: str) -> str:
    """The Python minor version that a python:<x.y.z>-slim-bookworm base provides; the only kind
    of base the local builder has a stand-in for."""
    match = re.fullmatch(rf"python:(\d+\.\d+)\.\d+-slim-{BASE_SUITE}(@sha256:[0-9a-f]{{64}})?", base)
    if not match:
        raise ImageError(f"FROM {base}: the local builder has a base only for python:3.x.y-slim-{BASE_SUITE}")
    return match.group(1)


def image_name_in_manifest(manifest: Path = CHECK_MANIFEST) -> str:
    """The image the check StatefulSet runs: the local image is imported under this name."""
    [container] = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]["containers"]
    return container["image"]


# -- OCI archives ------------------------------------------------------------------------------
@dataclass
class Image:
    name: str
    archive: Path

    @property
    def index(self) -> dict:
        with tarfile.open(self.archive) as archive:
            return json.load(archive.extractfile("index.json"))

    def blob(self, digest: str) -> bytes:
        with tarfile.open(self.archive) as archive:
            return archive.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()

    def config(self) -> dict:
        manifest = json.loads(self.blob(self.index["manifests"][0]["digest"]))
        return json.loads(self.blob(manifest["config"]["digest"]))

    def layers(self) -> list[bytes]:
        manifest = json.loads(self.blob(self.index["manifests"][0]["digest"]))
        return [self.blob(layer["digest"]) for layer in manifest["layers"]]


def _architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _layer(entries: list[tuple[str, bytes | None, int, str | None]]) -> bytes:
    """A layer tar of (path, content or None for a directory, mode, symlink target), root-owned,
    with time 0, so its digest depends on its content only."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content, mode, link in entries:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mode, info.mtime, info.uid, info.gid = mode, 0, 0, 0
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def write_oci_archive(target: Path, name: str, layers: list[Path | bytes], image_config: dict) -> Image:
    """An OCI image layout as one tar (what `ctr images import` reads), layers uncompressed."""
    def add(tar: tarfile.TarFile, member: str, data: bytes | None = None, path: Path | None = None) -> None:
        info = tarfile.TarInfo(member)
        info.mtime, info.mode = 0, 0o644
        if path is not None:
            info.size = path.stat().st_size
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    descriptors, diff_ids = [], []
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        for layer in layers:
            if isinstance(layer, Path):
                digest, size = _sha256_file(layer), layer.stat().st_size
                add(tar, f"blobs/sha256/{digest}", path=layer)
            else:
                digest, size = hashlib.sha256(layer).hexdigest(), len(layer)
                add(tar, f"blobs/sha256/{digest}", layer)
            descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                "digest": f"sha256:{digest}", "size": size})
            diff_ids.append(f"sha256:{digest}")  # uncompressed: the layer is its own diff
        config = json.dumps({"architecture": _architecture(), "os": "linux", "config": image_config,
                             "rootfs": {"type": "layers", "diff_ids": diff_ids}}, sort_keys=True).encode()
        config_digest = hashlib.sha256(config).hexdigest()
        add(tar, f"blobs/sha256/{config_digest}", config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": f"sha256:{config_digest}", "size": len(config)},
            "layers": descriptors}, sort_keys=True).encode()
        manifest_digest = hashlib.sha256(manifest).hexdigest()
        add(tar, f"blobs/sha256/{manifest_digest}", manifest)
        add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": f"sha256:{manifest_digest}", "size": len(manifest),
            "platform": {"architecture": _architecture(), "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}]}).encode())
    partial.rename(target)
    return Image(name, target)


def _cached(prefix: str, key: str) -> Path:
    return IMAGES / f"{prefix}-{key[:20]}.tar"


# -- the check image -----------------------------------------------------------------------------
def check_image(dockerfile: Path = CHECK_DOCKERFILE) -> Image:
    """Dockerfile.check applied to the local python base; built once per content."""
    spec = read_dockerfile(dockerfile)
    base_python(spec.base)  # refuses a FROM the local base does not stand in for
    if not BASE_ROOTFS.exists():
        raise ImageError(f"{BASE_ROOTFS} is missing: run localcp/build.sh")
    name = image_name_in_manifest()
    files = [(dest, (REPO / source).read_bytes()) for source, dest in spec.copies]
    key = hashlib.sha256(json.dumps([FORMAT, name, dockerfile.read_text(), [(d, c.hex()) for d, c in files],
                                     _sha256_file(BASE_ROOTFS)]).encode()).hexdigest()
    target = _cached("check", key)
    if target.exists():
        return Image(name, target)
    # What the python image adds to Debian's python: `python` on the PATH.
    python_link = _layer([("/usr/local", None, 0o755, None), ("/usr/local/bin", None, 0o755, None),
                          ("/usr/local/bin/python", None, 0o777, "/usr/bin/python3")])
    directories = sorted({p for dest, _ in files for p in _parents(dest)} | {spec.workdir})
    app = _layer([(d, None, 0o755, None) for d in directories] + [(dest, content, 0o644, None) for dest, content in files])
    env = {"PATH": DEFAULT_PATH, **spec.env}
    config = {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": spec.workdir, "User": spec.user,
              "Entrypoint": spec.entrypoint, "Cmd": spec.cmd or None,
              "Labels": {"org.opencontainers.image.source": f"{dockerfile.name} on a local {BASE_SUITE} python3-minimal base"}}
    return write_oci_archive(target, name, [BASE_ROOTFS, python_link, app], {k: v for k, v in config.items() if v})


# -- the pause image -----------------------------------------------------------------------------
def pause_image() -> Image:
    """localcp/pause/pause.go as a static binary in a one-layer image, run as 65535 like upstream's."""
    go_version = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(json.dumps([FORMAT, PAUSE_SOURCE.read_text(), go_version]).encode()).hexdigest()
    name = f"localhost/gpu-scheduler-pause:{key[:12]}"
    target = _cached("pause", key)
    if target.exists():
        return Image(name, target)
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "", "GO111MODULE": "off"}
        subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), str(PAUSE_SOURCE)],
                       check=True, env=env, cwd=tmp)
        layer = _layer([("/pause", binary.read_bytes(), 0o755, None)])
    return write_oci_archive(target, name, [layer], {"Entrypoint": ["/pause"], "User": "65535:65535"})
