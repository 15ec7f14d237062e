"""Long-lived clients (docs/hostile-input.md, "Server settings"): one kept-alive connection, idle
10 s and then 95 s between requests, gets every answer, on every way this project runs mutate (and
bind's image). kube-apiserver's webhook client, Knative's queue-proxy and the event adapters keep an
idle connection for up to 90 s, and do not resend a POST that meets a connection the server has
closed: gunicorn's default keep-alive (2 s) closed it first, and the API server failed the pod's
creation ("write: broken pipe", "EOF").

Each server runs exactly as shipped: the images' ENTRYPOINT (Dockerfile.*, as Knative runs them:
plain HTTP from queue-proxy on PORT), the same entry point with the chart's webhook TLS listener
(webhook.path direct-service, its env rendered by helm: the API server's connection), the local stack's mutate (LocalStack.mutate_command) and the
in-cluster stand-in's (localcp/incluster.py), from the repository root (the images' /app holds the
same paths), with the venv's gunicorn first on PATH as /opt/venv/bin is in the images. Where it
serves TLS, the connection is TLS. The idle gaps are the test's subject, so they are real
sleeps; every path waits through them at once, in threads (about 105 s in all).

Also: a SIGTERM drains (readiness 503, requests still answered with Connection: close) and then
stops (serving/gunicorn_config.py).
"""
from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from localcp import images, incluster, pki
from localcp.cluster import free_port
from localcp.stack import LocalStack

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = str(Path(sys.executable).parent)
GAPS = (10, 95)  # seconds idle before the second and the third request
REVIEW = (REPO / "examples" / "admissionreview.json").read_bytes()  # captured from kube-apiserver 1.34


def _knative_env(name: str) -> dict[str, str]:
    [container] = yaml.safe_load((REPO / "knative" / f"{name}-service.yaml").read_text())["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def _expand(argv: list[str], variables: dict[str, str]) -> list[str]:
    """A container's command as the kubelet runs it: $(VAR) from its env."""
    return [re.sub(r"\$\((\w+)\)", lambda m: variables.get(m[1], m[0]), arg) for arg in argv]


def _swap(argv: list[str], port: int, cert: tuple[Path, Path]) -> list[str]:
    """The same command on a port of this machine, with this test's certificate."""
    key, crt = cert
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        for flag, value in (("--bind", f"127.0.0.1:{port}"), ("--certfile", str(crt)), ("--keyfile", str(key))):
            if arg == flag:
                out += [flag, value]
                skip = True
                break
            if arg.startswith(flag + "="):
                out.append(f"{flag}={value}")
                break
        else:
            out.append(arg)
    return out


def _chart_webhook_tls():
    """The rendered mutate container of chart/gpu-scheduler with ci/direct-service-values.yaml
    (its WEBHOOK_TLS_PORT listener is the API server's), or None without helm."""
    spec = importlib.util.spec_from_file_location("chart_manifests", REPO / "chart" / "manifests.py")
    manifests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(manifests)
    try:
        manifests.helm()
    except SystemExit:
        return None
    values = REPO / "chart" / "gpu-scheduler" / "ci" / "direct-service-values.yaml"
    docs = [d for d in yaml.safe_load_all(manifests.template("-f", str(values), namespace=manifests.NAMESPACE)) if d]
    [ksvc] = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "mutate"
              and d["apiVersion"].startswith("serving.knative.dev")]
    return {c["name"]: c for c in ksvc["spec"]["template"]["spec"]["containers"]}["mutate"]


class Served:
    """One way of serving a function, started here: argv, env, and whether it speaks TLS."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, tls: bool, path: str = "/",
                 body: bytes | None = REVIEW):
        self.name, self.port, self.tls, self.path, self.body = name, port, tls, path, body
        self.process = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO),
                 "LOG_LEVEL": "WARNING", **env})
        self.output = b""

    def connection(self, context: ssl.SSLContext | None, timeout: float = 30) -> http.client.HTTPConnection:
        if self.tls:
            return http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def wait_ready(self, context, timeout: float = 60) -> None:
        """Answers /health/liveness on a connection of its own."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.process.stdout.read().decode(errors='replace')}")
            connection = self.connection(context, timeout=2)
            try:
                connection.request("GET", "/health/liveness")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                connection.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not serving after {timeout} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)  # gunicorn's quick shutdown
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        self.output = self.process.stdout.read()


def request(connection: http.client.HTTPConnection, served: Served) -> str:
    """One request on the connection as it is (never a new one): 'answered' or what went wrong."""
    try:
        if served.body is None:
            connection.request("GET", served.path)
        else:
            connection.request("POST", served.path, served.body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as error:
        return f"{type(error).__name__}: {error}"
    if response.status != 200:
        return f"HTTP {response.status}: {body[:200]!r}"
    if served.body is not None and json.loads(body)["response"]["uid"] != json.loads(served.body)["request"]["uid"]:
        return f"another review's answer: {body[:200]!r}"
    return "answered"


def idle_between_requests(served: Served, context) -> list[str]:
    connection = served.connection(context)
    outcomes = [request(connection, served)]
    connection.auto_open = 0  # a closed connection is an error, never silently opened again
    for gap in GAPS:
        time.sleep(gap)  # the deliberate idle gap under test
        outcomes.append(request(connection, served))
    connection.close()
    return outcomes


def ways_to_serve(tmp: Path, cert: tuple[Path, Path]) -> dict[str, tuple[list[str], dict[str, str], int, bool] | None]:
    """Every way this project runs mutate (and bind's image): name -> (argv, env, port, tls)."""
    ways = {}
    for name in ("mutate", "bind"):
        port = free_port()
        entrypoint = images.read_dockerfile(REPO / f"Dockerfile.{name}").entrypoint
        env = {**_knative_env(name), "PORT": str(port)}  # what Knative's revision gives the container
        if name == "bind":
            env["KUBECONFIG"] = str(tmp / "unreachable.kubeconfig")
        ways[f"{name}-image"] = (entrypoint, env, port, False)
    tls = _chart_webhook_tls()
    if tls is None:
        ways["mutate-webhook-tls"] = None
    else:
        port = free_port()
        key, crt = cert
        tls_dir = tmp / "webhook-tls"
        tls_dir.mkdir(exist_ok=True)
        (tls_dir / "tls.key").write_bytes(key.read_bytes())
        (tls_dir / "tls.crt").write_bytes(crt.read_bytes())
        variables = {e["name"]: str(e["value"]) for e in tls["env"] if "value" in e}
        variables |= {"PORT": str(free_port()), "WEBHOOK_TLS_PORT": str(port), "WEBHOOK_TLS_DIR": str(tls_dir)}
        entrypoint = images.read_dockerfile(REPO / "Dockerfile.mutate").entrypoint
        ways["mutate-webhook-tls"] = (entrypoint, variables, port, True)
    port = free_port()
    ways["mutate-local-stack"] = (LocalStack.mutate_command([f"127.0.0.1:{port}"], cert), {}, port, True)
    [container] = incluster.deployment("mutate")["spec"]["template"]["spec"]["containers"]
    port = free_port()
    variables = {e["name"]: str(e["value"]) for e in container["env"] if "value" in e} | {"PORT": str(port)}
    argv = _swap(_expand(container["command"], variables), port, cert)
    if not any(a.startswith("--bind") for a in argv):
        argv = [argv[0], f"--bind=127.0.0.1:{port}", *argv[1:]]
    ways["mutate-in-cluster-stand-in"] = (argv, variables, port, True)
    return ways


@pytest.fixture(scope="module")
def idle_outcomes(tmp_path_factory) -> dict[str, list[str] | None]:
    tmp = tmp_path_factory.mktemp("keepalive")
    (tmp / "unreachable.kubeconfig").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    ca = pki.make_ca(tmp, "ca")
    cert = pki.make_cert(tmp, "server", ca, "/CN=127.0.0.1", sans=("IP:127.0.0.1",))
    context = ssl.create_default_context(cafile=str(ca[1]))
    ways = ways_to_serve(tmp, cert)
    servers: dict[str, Served] = {}
    results: dict[str, list[str] | None] = {name: None for name, way in ways.items() if way is None}
    try:
        for name, way in ways.items():
            if way is not None:
                argv, env, port, tls = way
                bind = name.startswith("bind")
                servers[name] = Served(name, argv, {**env, "DRAIN_SECONDS": "0"}, port, tls,
                                       path="/health/liveness" if bind else "/", body=None if bind else REVIEW)
        for served in servers.values():
            served.wait_ready(context)

        def run(name: str) -> None:
            results[name] = idle_between_requests(servers[name], context)
        threads = [threading.Thread(target=run, args=(name,)) for name in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for served in servers.values():
            served.stop()
    return results


@pytest.mark.parametrize("way", ["mutate-image", "mutate-webhook-tls", "mutate-local-stack",
                                 "mutate-in-cluster-stand-in", "bind-image"])
def test_a_kept_alive_connection_idle_10_s_then_95_s_gets_every_answer(idle_outcomes, way):
    if idle_outcomes[way] is None:
        pytest.skip("helm is not built (make controlplane): the chart cannot be rendered")
    assert idle_outcomes[way] == ["answered"] * 3, (
        f"{way}: the requests after {GAPS[0]} s and then {GAPS[1]} s idle on the same connection")


# -- SIGTERM: drain, then stop ----------------------------------------------------------------------
def _image(name: str, drain_seconds: float, kubeconfig: Path) -> Served:
    """The function's image entry point as Knative runs it (plain HTTP on PORT); bind with an API
    server that refuses connections, asked /health/liveness instead of a review."""
    port = free_port()
    entrypoint = images.read_dockerfile(REPO / f"Dockerfile.{name}").entrypoint
    env = {**_knative_env(name), "PORT": str(port), "DRAIN_SECONDS": str(drain_seconds), "KUBECONFIG": str(kubeconfig)}
    bind = name == "bind"
    served = Served(f"{name}-image", entrypoint, env, port, False,
                    path="/health/liveness" if bind else "/", body=None if bind else REVIEW)
    served.wait_ready(None)
    return served


@pytest.mark.parametrize("name", ["mutate", "bind"])
def test_sigterm_drains_then_stops_by_itself(name, unreachable_kubeconfig):
    """As Kubernetes stops a pod: SIGTERM to the image's process 1. For DRAIN_SECONDS (20 here) it
    answers readiness 503 ("draining") and answers requests, on a connection kept alive from before
    and on new ones, each with Connection: close; then it stops by itself, and the port is closed."""
    served = _image(name, 20, unreachable_kubeconfig)
    try:
        kept = served.connection(None)
        assert request(kept, served) == "answered"
        kept.auto_open = 0
        os.kill(served.process.pid, signal.SIGTERM)  # the master only, as the kubelet signals process 1

        def readiness() -> tuple[int, bytes]:
            connection = served.connection(None, timeout=5)
            try:
                connection.request("GET", "/health/readiness")
                response = connection.getresponse()
                return response.status, response.read()
            finally:
                connection.close()
        deadline = time.monotonic() + 15
        while not (answer := readiness())[1].startswith(b"draining") and time.monotonic() < deadline:
            time.sleep(0.05)  # until the master has handled the signal
        assert answer[0] == 503 and answer[1].startswith(b"draining"), answer
        if served.body is None:
            kept.request("GET", served.path)
        else:
            kept.request("POST", served.path, served.body, {"Content-Type": "application/json"})
        response = kept.getresponse()
        assert response.status == 200, response.read()
        response.read()
        assert response.getheader("Connection") == "close", "a kept-alive client is told to reconnect"
        fresh = served.connection(None)
        assert request(fresh, served) == "answered", "new connections are still served while draining"
        assert served.process.wait(timeout=90) == 0, "it stops by itself once drained"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", served.port), timeout=2).close()
    finally:
        served.stop()
