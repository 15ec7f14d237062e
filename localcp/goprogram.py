"""A Go program that localcp/build-<name>.sh builds once into the cache, from a module of our own
(localcp/gomodule.sh): Traefik, kn and func. Where it is (the script says: the cache and the
version are its), its version, and building it when it is missing."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from .cluster import REPO, ProcessFailed


class CachedProgram:
    def __init__(self, name: str):
        self.name = name
        self.script = REPO / "localcp" / f"build-{name}.sh"

    @functools.cached_property
    def _path(self) -> Path:
        return Path(subprocess.run(["bash", str(self.script), "--path"], capture_output=True, text=True,
                                   check=True).stdout.strip())

    def binary(self) -> Path:
        return self._path

    def version(self) -> str:
        """The version of localcp/versions.env (or its override) the binary is built from."""
        return self._path.parent.parent.name.removeprefix(f"{self.name}-")

    def built(self) -> bool:
        return self._path.is_file()

    def ensure_built(self) -> None:
        if not self.built():
            subprocess.run(["bash", str(self.script)], check=True)

    def required(self) -> Path:
        """The binary, or the error that names the build to run."""
        if not self.built():
            raise ProcessFailed(f"{self.name} is not built: bash {self.script.relative_to(REPO)}")
        return self._path
