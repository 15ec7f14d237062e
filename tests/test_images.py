"""The images built here without Docker (check, bind, mutate) have the content that
kind/images.sh builds from their Dockerfiles (both read those files), what the builder cannot
honour is refused with its line, and images are cached by content."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from localcp import images
from tests.test_manifests import instructions, kind_mk_variables

REPO = Path(__file__).resolve().parent.parent
built = pytest.mark.controlplane  # needs localcp/build.sh's base root filesystem


def test_dockerfile_check_reads_as_docker_reads_it():
    spec = images.read_dockerfile(REPO / "Dockerfile.check")
    steps = instructions(REPO / "Dockerfile.check")
    assert spec.base == next(args for op, args in steps if op == "FROM")
    assert spec.copies == [("check/check.py", "/app/check.py")]
    assert spec.env == {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    assert (spec.workdir, spec.user, spec.entrypoint) == ("/app", "65532:65532", ["python", "/app/check.py"])
    assert images.base_python(spec.base) == "3.11"


def test_the_pod_runs_as_the_image_user_under_the_name_kind_builds():
    pod = yaml.safe_load((REPO / "check" / "statefulset.yaml").read_text())["spec"]["template"]["spec"]
    user, group = images.read_dockerfile().user.split(":")
    assert (str(pod["securityContext"]["runAsUser"]), str(pod["securityContext"]["runAsGroup"])) == (user, group)
    assert images.image_name_in_manifest() == kind_mk_variables()["CHECK_IMAGE"]


def test_the_function_dockerfiles_read_as_docker_reads_them():
    for name in ("bind", "mutate"):
        spec = images.read_dockerfile(REPO / f"Dockerfile.{name}")
        build = spec.stages["build"]
        assert spec.parent is spec.stages["base"] and build.parent is spec.stages["base"]
        assert [s.command for s in build.steps if s.op == "RUN"][0] == "python -m venv /opt/venv"
        assert [(s.stage, s.source, s.dest) for s in spec.steps] == [
            ("build", "/opt/venv", "/opt/venv"), ("build", "/opt/bytecode", "/opt/bytecode"),
            ("", f"functions/{name}", f"/app/functions/{name}")]
        # the bytecode is compiled from the sources the image holds, and read from its own tree
        assert ("functions/" + name, f"/app/functions/{name}") in [(s.source, s.dest) for s in build.steps if s.op == "COPY"]
        assert "PYTHONPYCACHEPREFIX=/opt/bytecode python -m compileall" in [s.command for s in build.steps if s.op == "RUN"][-1]
        assert spec.env["PYTHONPYCACHEPREFIX"] == "/opt/bytecode"
        assert spec.env["PATH"] == "/opt/venv/bin:" + images.DEFAULT_PATH  # ENV PATH=/opt/venv/bin:$PATH
        assert spec.env["TMPDIR"] == "/dev/shm" and spec.env["PIP_NO_CACHE_DIR"] == "1"  # inherited from base
        assert (spec.workdir, spec.user, spec.exposed) == ("/app", "65532:65532", ["8080/tcp"])
        assert spec.entrypoint[:3] == ["gunicorn", "--config", "python:serving.gunicorn_config"]
        # The build context is the repository less .dockerignore: no func.yaml, no bytecode.
        assert "func.yaml" not in [rel for rel, _ in images.context_files(f"functions/{name}")]
        assert images.in_context("gpu_scheduler/schedmap.py") and not images.in_context("gpu_scheduler/__pycache__/x.pyc")
        assert images.in_context("serving/gunicorn_config.py")
        # The package the entry point's --config names is installed beside the core.
        build_copies = [(s.source, s.dest) for s in build.steps if s.op == "COPY" and not s.stage]
        assert ("serving", "/src/serving") in build_copies and ("gpu_scheduler", "/src/gpu_scheduler") in build_copies
        assert not images.in_context("tests/test_images.py") and not images.in_context(".venv/bin/python")


@pytest.mark.parametrize("text, message", [
    ("FROM python:3.11.13-slim-bookworm\nRUN pip install x\n", "line 2: RUN in a stage the image is built from"),
    ("FROM python:3.11.13-slim-bookworm\nADD x /x\n", "line 2: ADD is not supported"),
    ("FROM python:3.11.13-slim-bookworm\nRUN [\"true\"]\n", "line 2: RUN in JSON (exec) form"),
    ("FROM python:3.11.13-slim-bookworm\nCOPY --from=build /opt /opt\n", "line 2: COPY --from=build names no earlier stage"),
    ("FROM python:3.11.13-slim-bookworm\nCOPY tests/conftest.py /app/\n", "line 2: COPY source tests/conftest.py is not in the build context"),
    ("FROM python:3.11.13-slim-bookworm\nCOPY --chown=1 check/check.py /app/\n", "line 2: COPY takes one source"),
    ("FROM python:3.11.13-slim-bookworm\nCOPY nothere.py /app/\n", "line 2: COPY source nothere.py is not a file"),
    ("FROM python:3.11.13-slim-bookworm\nENTRYPOINT python /app/check.py\n", "line 2: ENTRYPOINT must be in JSON"),
    ("FROM a b\n", "line 1: FROM takes an image or a stage"),
    ("# no image\nUSER 1\n", "line 2: USER before FROM"),
    ("# nothing\n", "no FROM"),
])
def test_a_dockerfile_the_builder_cannot_honour_is_refused_with_its_line(tmp_path, text, message):
    path = tmp_path / "Dockerfile.check"
    path.write_text(text)
    with pytest.raises(images.ImageError, match=re.escape(message)):
        images.read_dockerfile(path)


@pytest.mark.parametrize("command, message", [
    ("pip install flask", "pip install 'flask' is not supported"),
    ("pip install --upgrade -r /r.txt", "pip install '--upgrade' is not supported"),
    ("pip install -r /r.txt && pip install -r /r.txt", "a RUN with pip install must be that one command"),
])
def test_a_pip_install_the_builder_cannot_feed_is_refused_with_its_line(tmp_path, command, message):
    (tmp_path / "r.txt").write_text("flask==3.0.0\n")
    step = images.Step("RUN", "Dockerfile.x line 7", command=command)
    with pytest.raises(images.ImageError, match=re.escape(f"Dockerfile.x line 7: {message}")):
        images.pip_requirements(step, tmp_path)


def test_a_pip_install_names_what_its_wheelhouse_needs(tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "requirements.txt").write_text("# pinned\nflask==3.0.0  # web\n\nPyYAML==6.0.2\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    run = lambda command: images.pip_requirements(images.Step("RUN", "x", command=command), tmp_path)
    assert run("/opt/venv/bin/pip install --requirement /tmp/requirements.txt") == ["flask==3.0.0", "PyYAML==6.0.2"]
    assert run("/opt/venv/bin/pip install --no-deps /src") == ["setuptools>=77"]  # its build backend
    assert run("python -m venv /opt/venv") == []


def test_only_a_python_slim_bookworm_base_has_a_local_stand_in():
    assert images.base_python("python:3.12.1-slim-bookworm") == "3.12"
    for base in ("python:3.11.13-slim-bullseye", "debian:bookworm", "python:3.11-alpine"):
        with pytest.raises(images.ImageError, match="has a base only for"):
            images.base_python(base)


@built
def test_the_built_check_image_is_what_dockerfile_check_says():
    spec = images.read_dockerfile()
    image = images.check_image()
    assert image.name == "kind.local/gpu-scheduler-check:latest"
    config = image.config()["config"]
    assert config["Entrypoint"] == spec.entrypoint and config["User"] == spec.user
    assert config["WorkingDir"] == spec.workdir
    env = dict(e.split("=", 1) for e in config["Env"])
    assert {k: env[k] for k in spec.env} == spec.env
    base, python_link, app = image.layers()
    with tarfile.open(fileobj=io.BytesIO(app)) as layer:
        assert layer.extractfile("app/check.py").read() == (REPO / "check" / "check.py").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(python_link)) as layer:
        assert layer.getmember("usr/local/bin/python").linkname == "/usr/bin/python3"
    names = set(tarfile.open(fileobj=io.BytesIO(base)).getnames())
    minor = images.base_python(spec.base)
    assert {f"./usr/bin/python{minor}", "./usr/bin/python3"} <= names  # the FROM's Python, not another


@built
@pytest.mark.parametrize("name", ["bind", "mutate"])
def test_the_built_function_image_is_what_its_dockerfile_says(name):
    spec = images.read_dockerfile(REPO / f"Dockerfile.{name}")
    image = images.function_image(name)
    assert image.name == kind_mk_variables()[f"{name.upper()}_IMAGE"]
    config = image.config()["config"]
    assert (config["Entrypoint"], config["User"], config["WorkingDir"]) == (spec.entrypoint, spec.user, spec.workdir)
    assert config["ExposedPorts"] == {"8080/tcp": {}}
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PATH"].startswith("/opt/venv/bin:") and env["TMPDIR"] == "/dev/shm"
    base, python_link, venv, bytecode, app = image.layers()
    with tarfile.open(fileobj=io.BytesIO(bytecode)) as layer:
        names = set(layer.getnames())
        assert "opt/bytecode/opt/venv/lib/python3.11/site-packages/flask/app.cpython-311.pyc" in names
        assert f"opt/bytecode/app/functions/{name}/main.cpython-311.pyc" in names
        assert any(n.startswith("opt/bytecode/usr/lib/python3.11/json/") for n in names)  # the standard library's
    with tarfile.open(fileobj=io.BytesIO(venv)) as layer:
        names = set(layer.getnames())
        assert "opt/venv/bin/gunicorn" in names and "opt/venv/pyvenv.cfg" in names
        assert not any("__pycache__" in n for n in names)  # pip's: unread with the prefix set
        assert any(n.startswith("opt/venv/lib/python3.11/site-packages/gpu_scheduler/") for n in names)
        # The entry point's --config (serving.gunicorn_config) and the functions' serving pieces.
        assert "opt/venv/lib/python3.11/site-packages/serving/gunicorn_config.py" in names
        # Both call the API server (mutate: the GPU type of a pinned pod's node, for quotas).
        assert any(n.startswith("opt/venv/lib/python3.11/site-packages/kubeapi/") for n in names)
        # bind's holds the kubectl plugin too, on the PATH: the chart's `helm test` runs it.
        # (pyproject's script is installed in both images; only bind's has the package it runs.)
        plugin = "opt/venv/lib/python3.11/site-packages/kubectl_gpu_scheduler/cli.py"
        assert (plugin in names) == (name == "bind") and "opt/venv/bin/kubectl-gpu_scheduler" in names
        assert {m.uid for m in layer.getmembers()} == {0} and {m.mtime for m in layer.getmembers()} == {0}
    with tarfile.open(fileobj=io.BytesIO(app)) as layer:
        main = layer.extractfile(f"app/functions/{name}/main.py").read()
        assert main == (REPO / "functions" / name / "main.py").read_bytes()
        assert f"app/functions/{name}/func.yaml" not in layer.getnames()  # .dockerignore


# Run inside an image's root filesystem: the function's app made as its entry point makes it, its
# readiness and metrics asked once, and every module compiled from source meanwhile printed.
COMPILED_AT_START = """
import importlib._bootstrap_external as external, json, os, sys
compiled, compile_source = [], external.SourceLoader.source_to_code
def recording(self, data, path, *args, **kwargs):
    compiled.append(path)
    return compile_source(self, data, path, *args, **kwargs)
external.SourceLoader.source_to_code = recording
os.chdir("/app")
import functions_framework, gunicorn.app.base, gunicorn.arbiter, gunicorn.workers.gthread
import serving.gunicorn_config
app = functions_framework.create_app(target=sys.argv[1], source=f"functions/{sys.argv[1]}/main.py")
with app.test_client() as client:
    client.get("/health/readiness")
    client.get("/metrics")
print(json.dumps(compiled))
"""


@built
@pytest.mark.parametrize("name", ["bind", "mutate"])
def test_what_the_function_imports_at_start_is_bytecode_in_its_image(name, tmp_path):
    """The root filesystem is read-only and layers' times are fixed: a module without valid
    bytecode in the image is compiled at every start (0.6 s of bind's cold start, issue 53)."""
    if os.geteuid() != 0:
        pytest.skip("chroot into the image's root filesystem needs root")
    image = images.function_image(name)
    root = image.unpack_into(tmp_path / "root")
    (root / "tmp" / "compiled_at_start.py").write_text(COMPILED_AT_START)
    env = {**image.environment(), "LOG_LEVEL": "CRITICAL"}
    assert env["PYTHONPYCACHEPREFIX"] == "/opt/bytecode" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    done = subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", str(root), "/opt/venv/bin/python",
                           "/tmp/compiled_at_start.py", name], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
    # and without the prefix, as the images were before: the same start compiles what it imports
    without = {k: v for k, v in env.items() if k != "PYTHONPYCACHEPREFIX"}
    done = subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", str(root), "/opt/venv/bin/python",
                           "/tmp/compiled_at_start.py", name], env=without, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(path.startswith("/usr/lib/python3") for path in json.loads(done.stdout.splitlines()[-1]))


@built
def test_images_are_cached_by_content(tmp_path, monkeypatch):
    first = images.check_image()
    assert images.check_image().archive == first.archive  # same inputs: the cached archive
    dockerfile = tmp_path / "Dockerfile.check"
    dockerfile.write_text((REPO / "Dockerfile.check").read_text().replace("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0"))
    monkeypatch.setattr(images, "IMAGES", tmp_path / "images")
    changed = images.check_image(dockerfile)
    assert changed.archive.name != first.archive.name
    assert "PYTHONUNBUFFERED=0" in changed.config()["config"]["Env"]
    index = changed.index
    changed.archive.unlink()
    assert images.check_image(dockerfile).index == index  # rebuilt from scratch: the same digest
