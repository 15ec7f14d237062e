"""The uninstall commands for an uninstall without the chart's hook (docs/install.md, "Uninstall":
`helm uninstall --no-hooks`, Argo CD), run as written against a real API server: the loop that
removes the quota resources bind patched into every node's status (gpu-scheduler.io/gpu and
product.gpu-scheduler.io/<type>, capacity and allocatable), and the deletion of bind's device
records (its Leases). Only etcd and kube-apiserver run: after `helm uninstall` no bind is left to
advertise the resources again, and a node's status is the API server's to keep."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO
from gpu_scheduler.quota import GPU_RESOURCE, PRODUCT_PREFIX, advertisement
from gpu_scheduler.records import LEASE_API, RECORD_SELECTOR
from localcp.cluster import BIN, ControlPlane

pytestmark = pytest.mark.controlplane
INSTALL = REPO / "docs" / "install.md"  # the README links its Uninstall section


@pytest.fixture(scope="module")
def api_server():
    """etcd and kube-apiserver alone (no controllers, scheduler or bind)."""
    cp = ControlPlane()
    try:
        cp._make_pki()
        cp._start_etcd()
        cp._start_apiserver()
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(cp.workdir, ignore_errors=True)


def readme_shell(pattern: str) -> str:
    """docs/install.md's sh block that contains `pattern`."""
    blocks = re.findall(r"^```sh\n(.*?)^```", INSTALL.read_text(), re.M | re.S)
    [block] = [b for b in blocks if pattern in b]
    return block


def run(cp: ControlPlane, script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig), PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)


def status(cp: ControlPlane, node: str) -> dict:
    return json.loads(cp.get(f"/api/v1/nodes/{node}"))["status"]


def check_the_node_loop_removes_what_bind_advertised(cp: ControlPlane) -> None:
    gpu_node = cp._node("gpu-a100")
    gpu_node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
    for node in (gpu_node, cp._node("plain"), cp._node("never-advertised")):
        cp.request("POST", "/api/v1/nodes", node)
    for name in ("gpu-a100", "plain"):  # bind's advertiser: this merge patch of the node's status
        patch = advertisement(json.loads(cp.get(f"/api/v1/nodes/{name}")))
        cp.request("PATCH", f"/api/v1/nodes/{name}/status", patch, "application/merge-patch+json")
    product = PRODUCT_PREFIX + "NVIDIA-A100-SXM4-80GB"
    assert {GPU_RESOURCE, product} <= set(status(cp, "gpu-a100")["capacity"]), "advertised, as bind does"
    before = {name: status(cp, name) for name in ("gpu-a100", "plain", "never-advertised")}

    done = run(cp, readme_shell("--subresource=status"))
    assert done.returncode == 0, done.stderr

    for name, was in before.items():
        now = status(cp, name)
        for field in ("capacity", "allocatable"):
            assert not [r for r in now[field] if r == GPU_RESOURCE or r.startswith(PRODUCT_PREFIX)], (name, now[field])
            kept = {r: v for r, v in was[field].items() if r != GPU_RESOURCE and not r.startswith(PRODUCT_PREFIX)}
            assert now[field] == kept, f"{name}: only the quota resources go"


def check_the_lease_command_deletes_only_binds_records(cp: ControlPlane) -> None:
    [command] = re.findall(r"`(kubectl -n gpu-scheduler delete leases [^`]*)`", INSTALL.read_text())
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": "gpu-scheduler"}})
    key, _, value = RECORD_SELECTOR.partition("=")
    for name, labels in (("node1.gpu-0", {key: value}), ("node1.gpu-1", {key: value}), ("someone-elses", {})):
        cp.request("POST", f"/apis/{LEASE_API}/namespaces/gpu-scheduler/leases",
                   {"apiVersion": LEASE_API, "kind": "Lease", "metadata": {"name": name, "labels": labels}, "spec": {}})

    done = run(cp, command)
    assert done.returncode == 0, done.stderr

    left = json.loads(cp.get(f"/apis/{LEASE_API}/namespaces/gpu-scheduler/leases"))["items"]
    assert [lease["metadata"]["name"] for lease in left] == ["someone-elses"]


def test_the_readme_removes_the_quota_resources_from_every_node(api_server):
    check_the_node_loop_removes_what_bind_advertised(api_server)


def test_the_readme_deletes_binds_records_and_nothing_else(api_server):
    check_the_lease_command_deletes_only_binds_records(api_server)
