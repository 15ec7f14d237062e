"""bind in device env mode dra against a real kube-apiserver that does not serve resource.k8s.io/v1,
the local one made so in two ways: as a 1.33 server (--emulated-version=1.33: it serves what 1.33
serves, and says so in /version), and with the group turned off (--runtime-config and the
DynamicResourceAllocation feature gate, without which the server's own DRA informers never sync
and it is never ready). On a stack of Kubernetes before 1.34 the server is simply itself. bind
stays up and live (no crash loop, no traceback) and is not ready, its readiness and one log line
naming the API server's version and the fix. In cuda mode the same server is fine: bind is ready
with empty DRA views, as before. Only etcd and kube-apiserver run; bind runs as admin (its RBAC is
not what is tested here)."""
from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error

import pytest

from conftest import REPO, FunctionServer
from localcp import cluster, versions
from localcp.cluster import ControlPlane

sys.path.insert(0, str(REPO / "functions" / "bind"))
from config import dra_mode_unserved  # noqa: E402

pytestmark = [pytest.mark.controlplane, pytest.mark.dra_unserved]
RECORDS = "gpu-scheduler"  # bind's namespace for its device records: its readiness checks it
DRA_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


# The kube-apiserver flags that make the stack's server one without resource.k8s.io/v1, by how: a
# server before 1.34 is one as it is (CI runs this module on v1.33.13); 1.34 serves it by default,
# and is made not to both ways. Later minors skip: from 1.35 the DynamicResourceAllocation gate is
# locked on, and with only the group turned off the server's own DRA informers never sync, so it is
# never ready (tried on v1.37.2); 1.37 cannot emulate a minor before 1.34.
MINOR = versions.minor(cluster.KUBERNETES_VERSION)
WITHOUT_DRA = {"before-1.34": []} if MINOR < 34 else {
    "emulating-1.33": ["--emulated-version=1.33"],
    "turned-off": ["--runtime-config=resource.k8s.io/v1=false", "--feature-gates=DynamicResourceAllocation=false"],
}


@pytest.fixture(scope="module", params=sorted(WITHOUT_DRA))
def api_server(request):
    """etcd and a kube-apiserver without resource.k8s.io/v1, and bind's records namespace."""
    if MINOR > 34:
        pytest.skip(f"{cluster.KUBERNETES_VERSION}: made to serve no resource.k8s.io/v1 on 1.34 only (see WITHOUT_DRA)")
    cp = ControlPlane()
    cp.apiserver_flags += WITHOUT_DRA[request.param]
    try:
        cp._make_pki()
        cp._start_etcd()
        cp._start_apiserver()
        cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": RECORDS}})
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(cp.workdir, ignore_errors=True)


def bind_on(cp: ControlPlane, **env: str) -> FunctionServer:
    return FunctionServer("bind", {"KUBECONFIG": str(cp.kubeconfig), "GPU_SCHEDULER_NAMESPACE": RECORDS,
                                   "GPU_SCHEDULER_QUOTA": "false", "LOG_LEVEL": "INFO", **env})


def readiness_once(bind: FunctionServer, settled, seconds: float = 30) -> tuple[int, str]:
    """The readiness answer once `settled(status, body)` holds (the first request starts the watches)."""
    deadline = time.monotonic() + seconds
    while True:
        status, body, _ = bind.get("/health/readiness")
        if settled(status, body.decode()) or time.monotonic() > deadline:
            return status, body.decode()
        time.sleep(0.2)


def log_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_api_server_does_not_serve_dra(api_server):
    with pytest.raises(urllib.error.HTTPError) as refused:
        api_server.get(DRA_SLICES)
    assert refused.value.code == 404


def test_dra_mode_is_not_ready_naming_the_version_it_needs_and_stays_up(api_server):
    version = json.loads(api_server.get("/version"))
    bind = bind_on(api_server, DEVICE_ENV_MODE="dra")
    try:
        status, body = readiness_once(bind, lambda status, body: "resource.k8s.io/v1" in body)
        assert (status, body) == (503, f"not ready: {dra_mode_unserved(version)}\n")
        assert f"this API server is {version['gitVersion']}" in body
        time.sleep(1)  # up, and still not ready: not a crash loop
        assert bind.process.poll() is None and bind.get("/health/liveness")[0] == 200
        assert bind.get("/health/readiness")[0] == 503
    finally:
        output = bind.stop()
    errors = [line for line in log_lines(output) if line["level"] == "error"]
    assert [line["message"] for line in errors] == [f"not ready: {dra_mode_unserved(version)}"], output[-3000:]
    assert "Traceback" not in output


def test_cuda_mode_on_the_same_server_is_ready_with_empty_dra_views(api_server):
    bind = bind_on(api_server)  # DEVICE_ENV_MODE unset: cuda
    try:
        status, _ = readiness_once(bind, lambda status, body: status == 200)
        assert status == 200
    finally:
        output = bind.stop()
    not_served = [line for line in log_lines(output) if line["message"].startswith("not served by the API server")]
    assert {line["view"] for line in not_served} == {"resourceslices", "resourceclaims"}
    assert not [line for line in log_lines(output) if line["level"] == "error"] and "Traceback" not in output
