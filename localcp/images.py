"""Container images for the local nodes, built without Docker, as OCI archives that
`ctr images import` loads into each node's containerd.

- The check, bind and mutate images. Dockerfile.check, Dockerfile.bind and Dockerfile.mutate are
  their one definition, here and for `kind/images.sh`: read_dockerfile() reads their
  instructions and dockerfile_image() applies them to a local base. The base stands in for the
  FROM image (python:3.11.x-slim-bookworm): Debian bookworm's python3 with python3-venv,
  unpacked by localcp/build-node.sh, with `python` on the PATH as in the python image.
  What this builder does, instruction by instruction:
    FROM image [AS name], FROM stage [AS name]  stages, as Docker's multi-stage builds
    ENV, WORKDIR, USER, EXPOSE, ENTRYPOINT, CMD  the image's configuration, as Docker sets it
    COPY [--from=stage] source destination     a file or a directory tree of the build context
                                                (the repository less .dockerignore), or a path
                                                of an earlier stage
    RUN command                                 only in a stage that a later COPY --from reads:
      it runs under /bin/sh -c in that stage's root filesystem (chroot, a mount namespace of its
      own, and a network namespace with no interface: nothing it runs reaches any network).
      `pip install` there reads its packages from a local wheelhouse instead of an index
      (PIP_NO_INDEX, PIP_FIND_LINKS): the wheels its --requirement files and the build backend
      of a local project name, for the image's Python and platform, downloaded beforehand by
      the machine's own pip with the machine's configuration (download_wheels). The command
      itself is the Dockerfile's, run by the image's own python and pip.
  Anything else (ADD, a RUN in the image's own stage, COPY --chown, a pip install of named
  packages, ...) is refused with its line: the images would differ from Docker's.
- The pause (sandbox) image: localcp/pause/pause.go, built with the machine's Go.

All are cached under CACHE/images/ by a digest of everything that goes into them, and are
reproducible: fixed timestamps and owners, so the same inputs give the same image digest.
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .cluster import CACHE, REPO

NODE_DIR = CACHE / "node-bookworm"  # localcp/build-node.sh
BASE_ROOTFS = NODE_DIR / "rootfs-python3.tar"
BASE_SUITE = "bookworm"
BASE_GLIBC = "2_36"  # bookworm's: the newest manylinux wheels its python runs
IMAGES = CACHE / "images"
CHECK_DOCKERFILE = REPO / "Dockerfile.check"
CHECK_MANIFEST = REPO / "check" / "statefulset.yaml"
# Each function's image, under the name its Knative Service runs (and kind/kind.mk builds).
FUNCTIONS = {name: (REPO / f"Dockerfile.{name}", REPO / "knative" / f"{name}-service.yaml") for name in ("bind", "mutate")}
PAUSE_SOURCE = REPO / "localcp" / "pause" / "pause.go"
FORMAT = "2"  # bump when the way images are assembled changes: the cache keys change with it
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUPPORTED = {"FROM", "ENV", "COPY", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "RUN", "EXPOSE"}
RUN_TIMEOUT = 600


class ImageError(ValueError):
    """A Dockerfile or base this builder cannot honour; the message names the line."""


@dataclass
class Step:
    op: str  # "COPY" or "RUN"
    where: str  # "Dockerfile.bind line 17"
    source: str = ""  # COPY: a path in the build context, or in stage `stage`
    dest: str = ""
    stage: str = ""  # COPY --from
    command: str = ""  # RUN, for /bin/sh -c


@dataclass
class Dockerfile:
    """One stage; read_dockerfile() returns the last, whose `parent` chain and `stages` lead to
    the others."""
    base: str = ""  # the image the first stage of the chain is FROM
    name: str = ""
    parent: "Dockerfile | None" = None  # the stage this one is FROM, if any
    env: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    workdir: str = "/"
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    exposed: list[str] = field(default_factory=list)
    stages: dict[str, "Dockerfile"] = field(default_factory=dict)  # every named stage of the file

    @property
    def copies(self) -> list[tuple[str, str]]:
        """(source in the build context, destination) of this stage's COPYs from the context."""
        return [(s.source, s.dest) for s in self.steps if s.op == "COPY" and not s.stage]

    def chain(self) -> list["Dockerfile"]:
        """This stage and those it is built FROM, the first first."""
        return (self.parent.chain() if self.parent else []) + [self]


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


# -- the build context: the repository as .dockerignore leaves it ---------------------------------
def _pattern(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regular expression (`**` any number of directories)."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            c = pattern[i]
            out += "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
            i += 1
    return re.compile(out)


def _ignore_rules(context: Path) -> list[tuple[bool, re.Pattern]]:
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    rules = []
    for line in (line.strip() for line in lines):
        if line and not line.startswith("#"):
            include = line.startswith("!")
            rules.append((include, _pattern(line.lstrip("!").strip("/"))))
    return rules


def in_context(relative: str, context: Path = REPO) -> bool:
    """Whether Docker sends this path of the context (the last matching rule wins; a rule that
    matches a directory matches what it holds)."""
    parts = relative.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    sent = True
    for include, pattern in _ignore_rules(context):
        if any(pattern.fullmatch(p) for p in prefixes):
            sent = include
    return sent


def context_files(source: str, context: Path = REPO) -> list[tuple[str, Path]]:
    """(path below `source`, file) of a COPY source: the file itself, or a directory's files."""
    root = context / source
    if root.is_file():
        return [("", root)] if in_context(source, context) else []
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(context).as_posix()
        if path.is_file() and in_context(relative, context):
            found.append((path.relative_to(root).as_posix(), path))
    return found


# -- reading ---------------------------------------------------------------------------------------
def read_dockerfile(path: Path = CHECK_DOCKERFILE, context: Path = REPO) -> Dockerfile:
    """The stages of a Dockerfile, as far as this builder can honour them; the last one."""
    spec: Dockerfile | None = None
    stages: dict[str, Dockerfile] = {}
    for number, line in _logical_lines(path.read_text()):
        op, _, args = line.partition(" ")
        op, args = op.upper(), args.strip()
        where = f"{path.name} line {number}"
        if op not in SUPPORTED:
            raise ImageError(f"{where}: {op} is not supported by the local image builder (only {', '.join(sorted(SUPPORTED))})")
        if op == "FROM":
            words = args.split()
            if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS") or words[0].startswith("--"):
                raise ImageError(f"{where}: FROM takes an image or a stage and an optional AS name, got {args!r}")
            parent = stages.get(words[0])
            spec = Dockerfile(base=parent.base if parent else words[0], name=words[2] if len(words) == 3 else "",
                              parent=parent, stages=stages)
            if parent:  # a stage starts with what its FROM stage set
                spec.env, spec.workdir, spec.user = dict(parent.env), parent.workdir, parent.user
                spec.entrypoint, spec.cmd, spec.exposed = list(parent.entrypoint), list(parent.cmd), list(parent.exposed)
            if spec.name:
                stages[spec.name] = spec
            continue
        if spec is None:
            raise ImageError(f"{where}: {op} before FROM")
        if op == "ENV":
            words = shlex.split(args)
            if not all("=" in w for w in words):
                raise ImageError(f"{where}: ENV needs KEY=value pairs, got {args!r}")
            for key, value in (w.split("=", 1) for w in words):  # $VAR and ${VAR}, as Docker expands them
                known = {"PATH": DEFAULT_PATH, **spec.env}
                spec.env[key] = re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: known.get(m[1] or m[2], ""), value)
        elif op == "COPY":
            spec.steps.append(_copy(args, where, spec, stages, context))
        elif op == "RUN":
            if args.startswith("["):
                raise ImageError(f"{where}: RUN in JSON (exec) form is not supported by the local image builder")
            spec.steps.append(Step("RUN", where, command=args))
        elif op == "WORKDIR":
            spec.workdir = args if args.startswith("/") else f"{spec.workdir.rstrip('/')}/{args}"
        elif op == "USER":
            spec.user = args
        elif op == "EXPOSE":
            spec.exposed += [p if "/" in p else f"{p}/tcp" for p in args.split()]
        elif op in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(args)
            except json.JSONDecodeError:
                raise ImageError(f"{where}: {op} must be in JSON (exec) form, got {args!r}") from None
            setattr(spec, op.lower(), value)
    if spec is None:
        raise ImageError(f"{path.name}: no FROM")
    for stage in spec.chain():
        for step in stage.steps:
            if step.op == "RUN":
                raise ImageError(f"{step.where}: RUN in a stage the image is built from is not supported by the "
                                 "local image builder (only in a build stage that a COPY --from reads)")
    return spec


def _copy(args: str, where: str, spec: Dockerfile, stages: dict[str, Dockerfile], context: Path) -> Step:
    words = args.split()
    stage = ""
    if words and words[0].startswith("--from="):
        stage = words.pop(0).split("=", 1)[1]
        if stage not in stages:
            raise ImageError(f"{where}: COPY --from={stage} names no earlier stage")
    if len(words) != 2 or words[0].startswith("--"):
        raise ImageError(f"{where}: COPY takes one source and one destination (and optionally --from), got {args!r}")
    source, dest = words
    dest = dest if dest.startswith("/") else f"{spec.workdir.rstrip('/')}/{dest}"
    if not stage:
        if not (context / source).exists():
            raise ImageError(f"{where}: COPY source {source} is not a file in the repository")
        if not context_files(source, context):
            raise ImageError(f"{where}: COPY source {source} is not in the build context (.dockerignore)")
        if (context / source).is_file() and dest.endswith("/"):
            dest += Path(source).name
    return Step("COPY", where, source=source, dest=dest.rstrip("/") or "/", stage=stage)


def base_python(base: str) -> str:
    """The Python minor version that a python:<x.y.z>-slim-bookworm base provides; the only kind
    of base the local builder has a stand-in for."""
    match = re.fullmatch(rf"python:(\d+\.\d+)\.\d+-slim-{BASE_SUITE}(@sha256:[0-9a-f]{{64}})?", base)
    if not match:
        raise ImageError(f"FROM {base}: the local builder has a base only for python:3.x.y-slim-{BASE_SUITE}")
    return match.group(1)


def image_name_in_manifest(manifest: Path = CHECK_MANIFEST) -> str:
    """The image a workload or Knative Service runs: the local image is imported under this name."""
    [container] = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]["containers"]
    return container["image"]


# -- OCI archives ------------------------------------------------------------------------------
@dataclass
class Image:
    name: str
    archive: Path
    # False: the nodes import it without unpacking it; containerd's CRI unpacks an image the first
    # time a container of it is created there (for archives of many images each node runs few of).
    unpack: bool = True

    @property
    def index(self) -> dict:
        with tarfile.open(self.archive) as archive:
            return json.load(archive.extractfile("index.json"))

    def blob(self, digest: str) -> bytes:
        with tarfile.open(self.archive) as archive:
            return archive.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()

    def manifest(self) -> dict:
        """This image's manifest (an archive may hold several images: write_oci_archive_of)."""
        [entry] = [m for m in self.index["manifests"]
                   if m.get("annotations", {}).get("io.containerd.image.name", self.name) == self.name]
        return json.loads(self.blob(entry["digest"]))

    def config(self) -> dict:
        return json.loads(self.blob(self.manifest()["config"]["digest"]))

    def layers(self) -> list[bytes]:
        return [self.blob(layer["digest"]) for layer in self.manifest()["layers"]]

    def environment(self) -> dict[str, str]:
        """The image's ENV, as its container starts with it."""
        return dict(e.split("=", 1) for e in self.config()["config"].get("Env", []))

    def unpack_into(self, root: Path) -> Path:
        """The image's root filesystem, its layers applied in order, at `root` (for a chroot)."""
        for layer in self.layers():
            with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
                tar.extractall(root, filter="fully_trusted")
        return root

    def sizes(self) -> dict[str, float]:
        """What a node stores and what it pulls, in MB: the layers as unpacked (the archive's are
        uncompressed tars) and gzipped at level 6, as a registry would serve them. Layer by layer,
        streamed: a layer is not held in memory whole."""
        import zlib

        uncompressed = compressed = 0
        with tarfile.open(self.archive) as archive:
            for layer in self.manifest()["layers"]:
                member = archive.extractfile(f"blobs/sha256/{layer['digest'].split(':', 1)[1]}")
                gzip = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: a gzip stream, as registries serve
                for chunk in iter(lambda: member.read(1 << 20), b""):
                    uncompressed += len(chunk)
                    compressed += len(gzip.compress(chunk))
                compressed += len(gzip.flush())
        return {"uncompressed_mb": uncompressed / 1e6, "compressed_mb": compressed / 1e6}


def _architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_layer(out, entries) -> None:
    """A layer tar of (path, content: bytes, a file to read, or None for a directory, mode,
    symlink target), root-owned, with time 0, so its digest depends on its content only."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content, mode, link in entries:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mode, info.mtime, info.uid, info.gid = mode, 0, 0, 0
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, Path):
                info.size = content.stat().st_size
                with open(content, "rb") as f:
                    tar.addfile(info, f)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))


def _layer(entries) -> bytes:
    buffer = io.BytesIO()
    _write_layer(buffer, entries)
    return buffer.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def write_oci_archive(target: Path, name: str, layers: list[Path | bytes], image_config: dict) -> Image:
    """An OCI image layout as one tar (what `ctr images import` reads), layers uncompressed."""
    [image] = write_oci_archive_of(target, {name: (layers, image_config)})
    return image


def write_oci_archive_of(target: Path, contents: dict[str, tuple[list[Path | bytes], dict]]) -> list[Image]:
    """Several images (name: their layers and config) in one OCI layout tar, each layer blob once:
    one `ctr images import` loads them all."""
    def add(tar: tarfile.TarFile, member: str, data: bytes | None = None, path: Path | None = None) -> None:
        if member in written:
            return
        written.add(member)
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
    written: set[str] = set()
    digests: dict[int, tuple[str, int]] = {}  # id(layer) -> (digest, size): a shared layer hashed once
    index = []
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        for name, (layers, image_config) in contents.items():
            descriptors, diff_ids = [], []
            for layer in layers:
                if id(layer) not in digests:
                    if isinstance(layer, Path):
                        digests[id(layer)] = (_sha256_file(layer), layer.stat().st_size)
                    else:
                        digests[id(layer)] = (hashlib.sha256(layer).hexdigest(), len(layer))
                digest, size = digests[id(layer)]
                if isinstance(layer, Path):
                    add(tar, f"blobs/sha256/{digest}", path=layer)
                else:
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
            index.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                          "digest": f"sha256:{manifest_digest}", "size": len(manifest),
                          "platform": {"architecture": _architecture(), "os": "linux"},
                          "annotations": {"io.containerd.image.name": name,
                                          "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}})
        add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": index}).encode())
    partial.rename(target)
    return [Image(name, target) for name in contents]  # (callers set unpack)


def _cached(prefix: str, key: str) -> Path:
    return IMAGES / f"{prefix}-{key[:20]}.tar"


# -- building ------------------------------------------------------------------------------------
def _file_mode(path: Path) -> int:
    """What git keeps of a file's mode: executable or not (the same in every clone)."""
    return 0o755 if path.stat().st_mode & 0o100 else 0o644


def _context_key(spec: Dockerfile) -> list:
    """What of the build context the stages copy, by content."""
    stages = list(spec.stages.values()) + [spec]
    return sorted({(s.source, rel, hashlib.sha256(f.read_bytes()).hexdigest())
                   for stage in stages for s in stage.steps if s.op == "COPY" and not s.stage
                   for rel, f in context_files(s.source)})


def _context_entries(step: Step) -> list:
    files = context_files(step.source)
    if (REPO / step.source).is_file():
        return [(step.dest, f, _file_mode(f), None) for _, f in files]
    return [(f"{step.dest}/{rel}", f, _file_mode(f), None) for rel, f in files]


def _tree_entries(root: Path, dest: str) -> list:
    """A directory of a build stage's root filesystem, as layer entries under `dest`."""
    entries = [(dest, None, root.stat().st_mode & 0o7777, None)]
    for path in sorted(root.rglob("*")):
        target, mode = f"{dest}/{path.relative_to(root).as_posix()}", path.lstat().st_mode
        if path.is_symlink():
            entries.append((target, None, 0o777, os.readlink(path)))
        elif path.is_dir():
            entries.append((target, None, mode & 0o7777, None))
        elif path.is_file():
            entries.append((target, path, mode & 0o7777, None))
    return entries


def _with_parents(entries: list) -> list:
    """The entries, after a directory entry for each parent they need."""
    have = {path for path, *_ in entries}
    parents = sorted({p for path, *_ in entries for p in _parents(path)} - have)
    return [(p, None, 0o755, None) for p in parents] + entries


PYTHON_LINK = [("/usr/local", None, 0o755, None), ("/usr/local/bin", None, 0o755, None),
               ("/usr/local/bin/python", None, 0o777, "/usr/bin/python3")]  # what the python image adds


def dockerfile_image(dockerfile: Path, name: str) -> Image:
    """The Dockerfile applied to the local python base, imported under `name`; built once per
    content (the Dockerfile, what it copies, the base)."""
    spec = read_dockerfile(dockerfile)
    base_python(spec.base)  # refuses a FROM the local base does not stand in for
    if not BASE_ROOTFS.exists():
        raise ImageError(f"{BASE_ROOTFS} is missing: run localcp/build.sh")
    key = hashlib.sha256(json.dumps([FORMAT, name, dockerfile.read_text(), _context_key(spec),
                                     _sha256_file(BASE_ROOTFS)]).encode()).hexdigest()
    target = _cached(dockerfile.name.split(".")[-1], key)
    if target.exists():
        return Image(name, target)
    with tempfile.TemporaryDirectory(prefix="image-", dir=IMAGES.parent if IMAGES.parent.exists() else None) as tmp:
        builder = _StageBuilder(Path(tmp))
        layers: list[Path | bytes] = [BASE_ROOTFS, _layer(PYTHON_LINK)]
        created: set[str] = set()
        for stage in spec.chain():
            for step in stage.steps:  # COPYs only: read_dockerfile refused RUNs here
                if step.stage:
                    entries = _tree_entries(builder.tree(spec.stages[step.stage]) / step.source.lstrip("/"), step.dest)
                else:
                    entries = _context_entries(step)
                entries = _with_parents(entries)
                created |= {path for path, *_ in entries}
                layer = Path(tmp) / f"layer-{len(layers)}.tar"
                with open(layer, "wb") as out:
                    _write_layer(out, entries)
                layers.append(layer)
        if spec.workdir not in created | {"/"}:  # WORKDIR makes its directory
            layers.append(_layer(_with_parents([(spec.workdir, None, 0o755, None)])))
        env = {"PATH": DEFAULT_PATH, **spec.env}
        config = {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": spec.workdir, "User": spec.user,
                  "Entrypoint": spec.entrypoint, "Cmd": spec.cmd or None,
                  "ExposedPorts": {port: {} for port in spec.exposed} or None,
                  "Labels": {"org.opencontainers.image.source":
                             f"{dockerfile.name} on a local {BASE_SUITE} python3 base"}}
        return write_oci_archive(target, name, layers, {k: v for k, v in config.items() if v})


class _StageBuilder:
    """The root filesystems of build stages, made in a scratch directory: the base unpacked,
    then each step, RUNs executed inside it (see the module's docstring)."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.trees: dict[str, Path] = {}

    def tree(self, stage: Dockerfile) -> Path:
        if stage.name in self.trees:
            return self.trees[stage.name]
        root = self.scratch / f"stage-{stage.name}"
        root.mkdir()
        subprocess.run(["tar", "-xf", str(BASE_ROOTFS), "-C", str(root)], check=True)
        for path, _, mode, link in PYTHON_LINK:
            target = root / path.lstrip("/")
            if link is not None and not target.is_symlink():
                target.symlink_to(link)
            elif link is None:
                target.mkdir(mode=mode, exist_ok=True)
        for each in stage.chain():
            for step in each.steps:
                if step.op == "RUN":
                    self._run(root, each, step)
                else:
                    self._copy(root, each, step)
        self.trees[stage.name] = root
        return root

    def _copy(self, root: Path, stage: Dockerfile, step: Step) -> None:
        if step.stage:
            entries = _tree_entries(self.tree(stage.stages[step.stage]) / step.source.lstrip("/"), step.dest)
        else:
            entries = _context_entries(step)
        for path, content, mode, link in _with_parents(entries):
            target = root / path.lstrip("/")
            if link is not None:
                target.unlink(missing_ok=True)
                target.symlink_to(link)
            elif content is None:
                target.mkdir(exist_ok=True)
                target.chmod(mode)
            else:
                shutil.copyfile(content, target)
                target.chmod(mode)

    def _run(self, root: Path, stage: Dockerfile, step: Step) -> None:
        wheels = download_wheels(pip_requirements(step, root), python_version=base_python(stage.base))
        mount_point = "/tmp/local-wheelhouse"
        for needed in ("proc", "dev", mount_point.lstrip("/"), stage.workdir.lstrip("/")):
            (root / needed).mkdir(parents=True, exist_ok=True)
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", **stage.env, "SOURCE_DATE_EPOCH": "0"}
        mounts = 'mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev"'
        if wheels:
            env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=mount_point)
            mounts += f' && mount --bind -o ro {shlex.quote(str(wheels))} "$0{mount_point}"'
        user = ["--userspec", stage.user] if stage.user else []
        # Mount, PID and network namespaces of its own: /proc and /dev for the command, the
        # wheelhouse read-only, and no network interface but a loopback that is down.
        argv = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--net", "--",
                "sh", "-c", mounts + ' && exec chroot "$@"', str(root), *user, str(root),
                "/bin/sh", "-c", f"cd {shlex.quote(stage.workdir)} && {step.command}"]
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ImageError(f"{step.where}: RUN did not finish in {RUN_TIMEOUT}s") from None
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise ImageError(f"{step.where}: RUN {step.command!r} failed with {done.returncode}:\n{tail}")
        shutil.rmtree(root / mount_point.lstrip("/"), ignore_errors=True)


def pip_requirements(step: Step, root: Path) -> list[str]:
    """What a RUN's `pip install` needs from an index: the lines of its --requirement files and
    the build requirements of a local project it installs; [] for a RUN without pip install.
    Other forms are refused: the wheelhouse could not be known."""
    words = shlex.split(step.command)
    starts = [i for i, w in enumerate(words[:-1]) if w.split("/")[-1] in ("pip", "pip3") and words[i + 1] == "install"]
    if not starts:
        return []
    if len(starts) > 1 or any(w in (";", "&&", "||", "|") for w in words):
        raise ImageError(f"{step.where}: a RUN with pip install must be that one command")
    needed, args = [], iter(words[starts[0] + 2:])
    for arg in args:
        if arg in ("--requirement", "-r") or arg.startswith("--requirement="):
            path = arg.split("=", 1)[1] if "=" in arg else next(args, "")
            needed += [line.split("#")[0].strip() for line in (root / path.lstrip("/")).read_text().splitlines()
                       if line.split("#")[0].strip()]
        elif arg == "--no-deps":
            continue
        elif arg.startswith("/") and (root / arg.lstrip("/") / "pyproject.toml").exists():
            import tomllib
            project = tomllib.loads((root / arg.lstrip("/") / "pyproject.toml").read_text())
            needed += project.get("build-system", {}).get("requires", ["setuptools>=40.8.0"])
        else:
            raise ImageError(f"{step.where}: pip install {arg!r} is not supported by the local image builder "
                             "(only --requirement FILE, --no-deps and a local project directory)")
    return needed


def download_wheels(requirements: list[str], python_version: str) -> Path | None:
    """A directory of wheels for these requirements and their dependencies, for the base's Python
    on Linux (bookworm's glibc or older), downloaded once by this machine's pip with its own
    configuration (index, certificates): the only step of an image build that uses a network."""
    if not requirements:
        return None
    machine = platform.machine()
    key = hashlib.sha256(json.dumps([sorted(requirements), python_version, BASE_GLIBC, machine]).encode()).hexdigest()
    wheels = IMAGES / f"wheels-{key[:20]}"
    if (wheels / ".complete").exists():
        return wheels
    shutil.rmtree(wheels, ignore_errors=True)
    abi = "cp" + python_version.replace(".", "")
    # Every manylinux tag that bookworm's glibc runs, by its name and its legacy aliases.
    glibc = int(BASE_GLIBC.split("_")[1])
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(glibc, 4, -1)]
    tags += [f"manylinux{alias}_{machine}" for alias in ("2014", "2010", "1")]
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels),
                           "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
                           "--abi", abi, *(f"--platform={tag}" for tag in tags), *requirements],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageError(f"pip download {' '.join(requirements)} failed:\n{done.stderr[-2000:]}")
    (wheels / ".complete").write_text("\n".join(requirements) + "\n")
    return wheels


def check_image(dockerfile: Path = CHECK_DOCKERFILE) -> Image:
    """Dockerfile.check's image, under the name check/statefulset.yaml runs."""
    return dockerfile_image(dockerfile, image_name_in_manifest())


def function_image(name: str) -> Image:
    """Dockerfile.<name>'s image (bind, mutate), under the name knative/<name>-service.yaml runs."""
    dockerfile, manifest = FUNCTIONS[name]
    return dockerfile_image(dockerfile, image_name_in_manifest(manifest))


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
