"""The krew files of a release: the launcher's archive and the manifest that points at it.

    python plugins/krew/release.py --base-url https://HOST/PATH/v0.1.0 [--out dist]

BASE_URL is where the release's files will be downloadable. Writes, in OUT:
- kubectl-gpu_scheduler-vX.tar.gz, the launcher (plugins/krew/kubectl-gpu_scheduler), without
  timestamps or owners: the same launcher gives the same bytes, so anyone can check the sha256;
- gpu-scheduler.yaml, plugins/krew/gpu-scheduler.yaml with RELEASE_VERSION (pyproject.toml's
  version, the one place it is kept), RELEASE_BASE_URL and RELEASE_ARCHIVE_SHA256 filled in: the
  manifest to publish.
The package's wheel, which the manifest's caveats name, is built beside them: `make release` does
both (release/build.py, docs/plugin-release.md). Exit status 2 with one line on errors.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import sys
import tarfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE.parent.parent / "pyproject.toml"
MANIFEST = HERE / "gpu-scheduler.yaml"
LAUNCHER = HERE / "kubectl-gpu_scheduler"
VERSION, BASE_URL, ARCHIVE_SHA256 = "RELEASE_VERSION", "RELEASE_BASE_URL", "RELEASE_ARCHIVE_SHA256"
MANIFEST_VERSION = re.compile(r"^  version: (\S+)$", re.MULTILINE)


class ReleaseError(Exception):
    pass


def package_version() -> str:
    return tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def wheel() -> str:
    """The name `pip wheel` gives the package's wheel (the project name with '_' for '-')."""
    return f"gpu_scheduler-{package_version()}-py3-none-any.whl"


def archive(launcher: bytes) -> bytes:
    """A .tar.gz holding the launcher, executable, with no time, owner or group in it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        entry = tarfile.TarInfo(LAUNCHER.name)
        entry.size, entry.mode, entry.mtime = len(launcher), 0o755, 0
        tar.addfile(entry, io.BytesIO(launcher))
    return gzip.compress(raw.getvalue(), mtime=0)


def release(base_url: str, out: Path) -> tuple[Path, Path]:
    """The archive and the filled manifest, written into `out`."""
    if not re.fullmatch(r"https://[^\s]+", base_url):
        raise ReleaseError(f"--base-url: expected an https:// URL without spaces, found: {base_url}")
    # The template names no version: it is pyproject.toml's, filled in here.
    version, text = f"v{package_version()}", MANIFEST.read_text()
    found = MANIFEST_VERSION.findall(text)
    if found != [f"v{VERSION}"]:
        raise ReleaseError(f"{MANIFEST}: spec.version is {', '.join(found) or 'missing'}; expected v{VERSION},"
                           " filled in from pyproject.toml")
    name = f"kubectl-gpu_scheduler-{version}.tar.gz"
    for expected in (f"uri: {BASE_URL}/kubectl-gpu_scheduler-v{VERSION}.tar.gz\n", f"sha256: {ARCHIVE_SHA256}\n",
                     f"{BASE_URL}/gpu_scheduler-{VERSION}-py3-none-any.whl\n"):  # the wheel() pip builds
        if expected not in text:
            raise ReleaseError(f"{MANIFEST}: expected {expected.strip()} in it")
    data = archive(LAUNCHER.read_bytes())
    # The template's opening comment is about its placeholders; the published copy has none.
    body = text[text.index("apiVersion:"):]
    filled = (f"# Written by plugins/krew/release.py from plugins/krew/gpu-scheduler.yaml ({version}).\n"
              + body.replace(VERSION, version[1:]).replace(BASE_URL, base_url.rstrip("/"))
              .replace(ARCHIVE_SHA256, hashlib.sha256(data).hexdigest()))
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(data)
    (out / MANIFEST.name).write_text(filled)
    return out / name, out / MANIFEST.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="where the release's files will be downloadable")
    parser.add_argument("--out", type=Path, default=Path("dist"), help="directory to write to (default: dist)")
    args = parser.parse_args(argv)
    try:
        written = release(args.base_url, args.out)
    except (ReleaseError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
