"""The check image built here without Docker has the content that kind/images.sh builds from
Dockerfile.check (both read that one file), and images are cached by content."""
from __future__ import annotations

import io
import re
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


@pytest.mark.parametrize("text, message", [
    ("FROM python:3.11.13-slim-bookworm\nRUN pip install x\n", "line 2: RUN is not supported"),
    ("FROM python:3.11.13-slim-bookworm\nCOPY --chown=1 check/check.py /app/\n", "line 2: COPY takes one source"),
    ("FROM python:3.11.13-slim-bookworm\nCOPY nothere.py /app/\n", "line 2: COPY source nothere.py is not a file"),
    ("FROM python:3.11.13-slim-bookworm\nENTRYPOINT python /app/check.py\n", "line 2: ENTRYPOINT must be in JSON"),
    ("FROM a\nFROM b\n", "line 2: a second FROM"),
    ("# no image\nUSER 1\n", "no FROM"),
])
def test_a_dockerfile_the_builder_cannot_honour_is_refused_with_its_line(tmp_path, text, message):
    path = tmp_path / "Dockerfile.check"
    path.write_text(text)
    with pytest.raises(images.ImageError, match=re.escape(message)):
        images.read_dockerfile(path)


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
