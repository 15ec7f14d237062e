"""Fixtures: sample events, real functions-framework servers, and the local control plane."""
from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import tempfile
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

# free_port: one issuer of ports for the whole run; DRA_SERVED: the stack's version serves resource.k8s.io/v1
from localcp.cluster import DRA_SERVED, KUBERNETES_VERSION, ControlPlane, free_port
from tests.fixtures import SAMPLES

REPO = Path(__file__).resolve().parent.parent


def sample(name: str) -> dict:
    return json.loads((SAMPLES / name).read_text())




class FunctionServer:
    """A function served by the real functions-framework CLI, as `func` runs it."""

    def __init__(self, name: str, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Its log goes to a file, not a pipe: a pipe nobody reads until stop() fills up and blocks
        # every thread that logs (bind's queue workers log each attempt).
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "functions_framework", "--target", name, "--source",
             str(REPO / "functions" / name / "main.py"), "--host", "127.0.0.1", "--port", str(self.port)],
            env={**os.environ, "PYTHONPATH": str(REPO), **env}, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited: {self.output()}")
            try:
                urllib.request.urlopen(f"{self.url}/health/liveness", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{name} did not start")

    def post(self, body: bytes | str | dict, headers: dict[str, str] | None = None, path: str = "/"):
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        request = urllib.request.Request(f"{self.url}{path}", data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        return self._open(request)

    def get(self, path: str):
        return self._open(urllib.request.Request(f"{self.url}{path}"))

    @staticmethod
    def _open(request):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, error.read(), dict(error.headers)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> str:
        self.process.terminate()
        self.process.wait(timeout=10)
        return self.output()


@pytest.fixture(scope="session")
def mutate_server():
    server = FunctionServer("mutate", {"LOG_LEVEL": "INFO"})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def unreachable_kubeconfig(tmp_path_factory) -> Path:
    """A kubeconfig naming an API server that refuses connections (nothing listens there)."""
    path = tmp_path_factory.mktemp("kube") / "config"
    server = f"https://127.0.0.1:{free_port()}"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


@pytest.fixture(scope="session")
def inprocess_apps(unreachable_kubeconfig):
    """Both functions as functions-framework apps in this process (Flask test clients), bind with
    an API server that refuses connections. Once per session: each registers its Prometheus
    metrics, which a second import would register twice. `bind_module` is bind's main.py, whose
    `placer` a test may swap for one over a fake API."""
    import functions_framework

    os.environ["KUBECONFIG"] = str(unreachable_kubeconfig)
    try:
        mutate = functions_framework.create_app("mutate", str(REPO / "functions" / "mutate" / "main.py"))
        bind = functions_framework.create_app("bind", str(REPO / "functions" / "bind" / "main.py"))
        bind_module = sys.modules["main"]  # the module functions-framework loaded last
        # No watches or workers in this process: the API server never answers here, and their
        # retries would only log until the interpreter exits (the served bind has them).
        bind_module.placer._started = True
    finally:
        os.environ.pop("KUBECONFIG")
    return SimpleNamespace(mutate=mutate.test_client(), bind=bind.test_client(), bind_module=bind_module)


@pytest.fixture(scope="session")
def bind_server(unreachable_kubeconfig):
    """bind with an API server that is down: pod events are kept for its queue, never a 5xx."""
    server = FunctionServer("bind", {"KUBECONFIG": str(unreachable_kubeconfig), "LOG_LEVEL": "DEBUG"})
    yield server
    server.stop()


# -- the local control plane ---------------------------------------------------------------
@pytest.fixture(scope="session")
def stack():
    from localcp.stack import LocalStack

    with LocalStack() as running:
        yield running


@pytest.fixture(scope="module")
def real_stack():
    """The stack with node1..node4 as real kubelets with containerd (localcp/nodes.py), for the
    tests of what runs. Per module: it is torn down (pods first) before other modules go on."""
    from localcp.stack import LocalStack

    with LocalStack(real_nodes=True) as running:
        yield running


@pytest.fixture(scope="session")
def controlplane(stack):
    """The API server, for tests that drive it with kubectl: kubeconfig path and kubectl binary."""
    return SimpleNamespace(kubeconfig=str(stack.cp.kubeconfig), kubectl=stack.cp.kubectl_path, cp=stack.cp)


_names = itertools.count()


@pytest.fixture
def namespace(stack, request) -> str:
    name = f"t{next(_names)}-{request.node.name.lower().replace('_', '-')}"[:50].rstrip("-[")
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name).strip("-")
    stack.create_namespace(name)
    yield name
    release_namespace(stack, name)


def release_namespace(stack, name: str) -> None:
    """Remove the test's workloads and pods at once. Pods bound to nodes without kubelets never
    finish a graceful deletion, and a pod on a node, Terminating or not, holds its cpu, host ports
    and GPUs for the fit checks (as for kube-scheduler's): left behind, they would keep the next
    test's replicas Pending on node1..node4. JobSets and LeaderWorkerSets first (orphaning their
    Jobs and StatefulSets; nothing to do on a stack without their CRDs), so that no controller
    of theirs makes the Jobs and StatefulSets again."""
    from kubernetes import client

    from localcp.workloads import delete_workloads

    delete_workloads(stack.api_client, name)
    orphan = client.V1DeleteOptions(propagation_policy="Orphan")
    client.AppsV1Api(stack.api_client).delete_collection_namespaced_stateful_set(name, body=orphan)
    client.BatchV1Api(stack.api_client).delete_collection_namespaced_job(name, body=orphan)
    stack.api.delete_collection_namespaced_pod(name, grace_period_seconds=0)


_DRA = re.compile(r"(^|[_/\[-])dra([_.\]-]|$)")


def pytest_collection_modifyitems(items):
    for item in items:
        if {"stack", "controlplane", "real_stack"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.controlplane)
        # make test K8S=v1.33.13: DRA's tests (named so) need resource.k8s.io/v1, served from 1.34;
        # those marked dra_unserved test the server without it, and run there above all.
        if (not DRA_SERVED and item.get_closest_marker("controlplane") and _DRA.search(item.nodeid.lower())
                and not item.get_closest_marker("dra_unserved")):
            item.add_marker(pytest.mark.skip(reason=f"Kubernetes {KUBERNETES_VERSION} serves no resource.k8s.io/v1"))


# -- only tests marked `controlplane` start it -----------------------------------------------
# `make unit` (-m "not controlplane") must pass from a clone without the binaries that
# localcp/build.sh builds, so a test that starts the control plane (LocalStack, ControlPlane: both
# go through ControlPlane.start) without the marker fails, whether or not the binaries are there.
_running: list[pytest.Item] = []  # the test being set up, run or torn down


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def require_controlplane_marker(item: pytest.Item | None) -> None:
    if item is not None and item.get_closest_marker("controlplane") is None:
        pytest.fail(f"{item.nodeid} starts the local control plane but is not marked `controlplane`:"
                    " add @pytest.mark.controlplane (or use the `stack` fixture), so that `make unit`"
                    " leaves it out", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def controlplane_only_when_marked():
    start = ControlPlane.start

    def guarded_start(self: ControlPlane) -> ControlPlane:
        require_controlplane_marker(_running[-1] if _running else None)
        return start(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ControlPlane, "start", guarded_start)
        yield
