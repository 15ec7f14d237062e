"""The functions start and serve on a read-only root filesystem, as knative/*-service.yaml runs
them (readOnlyRootFilesystem), given the TMPDIR=/dev/shm their Dockerfiles set. Emulated with a
private mount namespace whose / is remounted read-only and /dev/shm is a fresh tmpfs."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, free_port
from localcp import images

SCRIPT = r"""
set -u
mount --make-rprivate / 2>/dev/null
mount -t tmpfs -o size=16m tmpfs /dev/shm || exit 90
for m in $(awk '{print $2}' /proc/mounts | sort -r); do
  case "$m" in /proc*|/sys*|/dev*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null ;; esac
done
mount -o remount,bind,ro / || exit 90
touch /tmp/writable 2>/dev/null && exit 91
cd "$REPO"
eval "exec $ENTRYPOINT" >/dev/shm/log 2>&1 &
for _ in $(seq 60); do
  code=$("$PY" -c "import urllib.request,sys
try: print(urllib.request.urlopen('http://127.0.0.1:$PORT/health/liveness', timeout=1).status)
except Exception as e: print(getattr(e, 'code', 0))")
  [ "$code" = 200 ] && { kill %1; echo READY; exit 0; }
  sleep 0.2
done
kill %1 2>/dev/null; tail -3 /dev/shm/log; exit 1
"""


def run_read_only(target: str, tmpdir: str | None, kubeconfig) -> subprocess.CompletedProcess:
    """The image's ENTRYPOINT (the venv's gunicorn first on PATH, as /opt/venv/bin is in the image),
    from the repository root (the image's /app holds the same paths). DRAIN_SECONDS 0: the script's
    kill stops it at once."""
    entrypoint = images.read_dockerfile(REPO / f"Dockerfile.{target}").entrypoint
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "REPO": str(REPO), "PY": sys.executable,
           "ENTRYPOINT": shlex.join(entrypoint), "PORT": str(free_port()), "PYTHONPATH": str(REPO),
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/nonexistent", "KUBECONFIG": str(kubeconfig),
           "DRAIN_SECONDS": "0"}
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return subprocess.run(["unshare", "-m", "bash", "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=60)


def namespaces_usable() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


needs_namespaces = pytest.mark.skipif(not namespaces_usable(), reason="needs root and mount namespaces (unshare -m)")


@needs_namespaces
@pytest.mark.parametrize("target", ["mutate", "bind"])
def test_serves_on_a_read_only_root_with_tmpdir_on_dev_shm(target, unreachable_kubeconfig):
    result = run_read_only(target, "/dev/shm", unreachable_kubeconfig)
    assert result.returncode == 0 and "READY" in result.stdout, result.stdout + result.stderr


@needs_namespaces
def test_without_a_writable_tmpdir_it_cannot_start(unreachable_kubeconfig):
    """Why the Dockerfiles set TMPDIR: gunicorn's worker needs a temporary file."""
    result = run_read_only("mutate", None, unreachable_kubeconfig)
    assert result.returncode == 1 and "No usable temporary directory" in result.stdout, result.stdout


@pytest.mark.parametrize("name", ["bind", "mutate"])
def test_the_deployment_is_what_was_tested(name):
    import yaml

    assert "TMPDIR=/dev/shm" in (REPO / f"Dockerfile.{name}").read_text()
    service = yaml.safe_load((REPO / "knative" / f"{name}-service.yaml").read_text())
    (container,) = service["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
