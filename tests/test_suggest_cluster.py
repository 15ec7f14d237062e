"""`kubectl gpu-scheduler suggest` on the real control plane, run as a user granted exactly
permissions.PLUGIN: with GPUs held by another workload, the map it prints is applied, and bind
binds every replica on the node and devices suggest printed, no device to two workloads; with too
few free GPUs it exits 1 naming them. The tests' nodes are their own (4 GPUs each, no kubelet: the
pods stay Pending once bound); the manifests' nodeSelector keeps suggest to them."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO
from gpu_scheduler import ANNOTATION
from gpu_scheduler.devices import MODE_ANNOTATION
from gpu_scheduler.plugins.dynamicresources.allocator import PCIE_ROOT
from gpu_scheduler.fit import DEVICES_ANNOTATION
from gpu_scheduler.schedmap import parse_map
from test_dra_cluster import admin  # noqa: F401 (fixture)
from test_plugin_cluster import SEED, reader, run  # noqa: F401 (fixture)
from test_records_cluster import Nodes, own_nodes, record_of  # noqa: F401 (fixture)

LABEL = "gpu-scheduler.test/suggest"


def statefulset(namespace: str, name: str, replicas: int, pool: str, annotations: dict | None = None) -> dict:
    """The seed StatefulSet without its map, kept to the nodes labelled `pool`."""
    obj = json.loads(json.dumps(SEED))
    obj["metadata"].update(name=name, namespace=namespace, labels={"app": name})
    obj["spec"].update(replicas=replicas, serviceName=name, selector={"matchLabels": {"app": name}})
    template = obj["spec"]["template"]
    template["metadata"] = {"labels": {"app": name}, "annotations": dict(annotations or {})}
    template["spec"]["nodeSelector"] = {LABEL: pool}
    return obj


def given(pods) -> list[tuple[str, str]]:
    """(node, device) for each device each bound pod holds, as bind recorded it on the pod."""
    return [(p["spec"]["nodeName"], device) for p in pods if p["spec"].get("nodeName")
            for device in p["metadata"].get("annotations", {}).get(DEVICES_ANNOTATION, "").split(",") if device]


def test_suggest_places_every_replica_where_bind_then_binds_it(stack, namespace, reader, own_nodes, tmp_path):
    a, b = own_nodes(2, **{LABEL: namespace})
    # Another workload holds GPU 0 on a and GPU 3 on b (its pods bound, bind's records written).
    holder = statefulset(namespace, "holder", 2, namespace,
                         {ANNOTATION: f"0={a}:0\n1={b}:3\n"})
    stack.apply(holder)
    stack.wait_bound(namespace, 2, "app=holder")
    assert record_of(stack, a, "0") and record_of(stack, b, "3")

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(statefulset(namespace, "train", 3, namespace)))

    # Three replicas of 2 GPUs: two fit (a: 1,2; b: 0,1), the third does not; the message says so.
    code, out, err = run("suggest", "-f", str(path), "--gpus", "2", "--spread", "--kubeconfig", reader)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: StatefulSet {namespace}/train: 3 replicas x 2 GPUs = 6 GPUs do not fit: 6 GPUs"
                          f" are free now: {a} 1,2,3; {b} 0,1,2; each replica needs 2 on one node. 2 of 3 replicas"
                          f" fit; index 2 does not (after the 2 that fit, 2 GPUs left: {a} 3; {b} 2)"), err
    assert "node1, node2, node3, node4 (NodeAffinity:" in err and err.count("\n") == 1

    # Two replicas fit: the manifest with its map, as the reader prints it.
    obj = yaml.safe_load(path.read_text())
    obj["spec"]["replicas"] = 2
    path.write_text(yaml.safe_dump(obj))
    code, out, err = run("suggest", "-f", str(path), "--gpus", "2", "--spread", "-o", "yaml", "--kubeconfig", reader)
    assert (code, err) == (0, "")
    suggested = yaml.safe_load(out)
    text = suggested["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == f"0={a}:1,2\n1={b}:0,1\n"
    assert f"{ANNOTATION}: |\n" in out, "the map as a block, as people write it"

    stack.apply(out)
    pods = {p["metadata"]["name"]: p for p in stack.wait_bound(namespace, 2, "app=train")}
    for index, placement in parse_map(text).items():
        pod = pods[f"train-{index}"]
        assert pod["spec"]["nodeName"] == placement.node
        assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == ",".join(placement.devices)
    everything = given(stack.pods(namespace))
    assert len(everything) == 6 and len(set(everything)) == 6, everything

    # Now only a's 3 and b's 2 are free: one more replica of 1 GPU each fits on each, --pack fills a first.
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump(statefulset(namespace, "more", 2, namespace)))
    code, out, err = run("suggest", "-f", str(more), "--gpus", "1", "--pack", "--in-place", "--kubeconfig", reader)
    assert (code, err) == (0, "")
    assert f"0       more-0   {a}   3" in out and f"written to {more}" in out
    written = yaml.safe_load(more.read_text())
    assert written["spec"]["template"]["metadata"]["annotations"][ANNOTATION] == f"0={a}:3\n1={b}:2\n"


# -- DRA mode -------------------------------------------------------------------------------------------
RESOURCE = "/apis/resource.k8s.io/v1"
NVIDIA = "gpu.nvidia.com"
ROOTS = {"gpu-0": "pci0000:00", "gpu-1": "pci0000:00", "gpu-2": "pci0000:80", "gpu-3": "pci0000:80"}


@pytest.fixture
def dra_nodes(stack, namespace, admin, own_nodes):
    """Two nodes of the test's own, each publishing gpu-0..gpu-3 under two PCIe roots (NVIDIA's
    driver names and attributes). Afterwards the StatefulSets go (their pods not made again), the
    pods at once, then their claims and the slices, so that no allocation outlives the test."""
    nodes = own_nodes(2, **{LABEL: namespace})
    for name in nodes:
        admin._call("POST", f"{RESOURCE}/resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{name}-gpus"},
            "spec": {"driver": NVIDIA, "nodeName": name, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": device, "attributes": {"index": {"int": int(device[-1])},
                                                                 PCIE_ROOT: {"string": root}}}
                                 for device, root in ROOTS.items()]}})
    yield nodes
    stack.cp.kubectl("delete", "statefulsets", "--all", "-n", namespace, "--cascade=orphan")  # no pod made again
    stack.cp.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force")
    stack.cp.kubectl("delete", "resourceclaims", "--all", "-n", namespace, "--wait=false")
    stack.wait_for(lambda: not admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"], 60,
                   "the test's claims gone")
    for name in nodes:
        admin._call("DELETE", f"{RESOURCE}/resourceslices/{name}-gpus")


def test_dra_suggest_takes_devices_from_the_slices_under_one_pcie_root(stack, namespace, reader, admin, dra_nodes,
                                                                      tmp_path):
    a, b = dra_nodes
    # Another claim holds a's gpu-1: a's only root with two free devices is pci0000:80.
    theirs = admin._call("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "theirs", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": NVIDIA}}]}}})
    theirs["status"] = {"allocation": {"devices": {"results": [
        {"request": "one", "driver": NVIDIA, "pool": a, "device": "gpu-1"}]}}}
    admin._call("PUT", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/theirs/status", theirs)

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(statefulset(namespace, "train", 2, namespace, {MODE_ANNOTATION: "dra"})))
    code, out, err = run("suggest", "-f", str(path), "--gpus", "2", "--spread", "-o", "yaml", "--kubeconfig", reader)
    assert (code, err) == (0, "")
    text = yaml.safe_load(out)["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == f"0={a}:2,3\n1={b}:0,1\n"

    stack.apply(out)
    pods = {p["metadata"]["name"]: p for p in stack.wait_bound(namespace, 2, "app=train")}
    for index, placement in parse_map(text).items():
        assert pods[f"train-{index}"]["spec"]["nodeName"] == placement.node
        claim = admin._call("GET", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/train-{index}-gpus")
        devices = [(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]]
        assert devices == [(placement.node, f"gpu-{d}") for d in placement.devices]
        assert len({ROOTS[device] for _, device in devices}) == 1, "one PCIe root"

    # Another workload of three GPUs under one root fits nowhere: exit 1, naming what is free.
    path.write_text(yaml.safe_dump(statefulset(namespace, "more", 2, namespace, {MODE_ANNOTATION: "dra"})))
    code, out, err = run("suggest", "-f", str(path), "--gpus", "3", "--kubeconfig", reader)
    assert (code, out) == (1, "")
    assert ("2 replicas x 3 GPUs = 6 GPUs do not fit: 3 GPUs are free now: "
            f"{a} 0; {b} 2,3; each replica needs 3 on one node under one PCIe root") in err, err


def test_try_it_shows_what_suggest_prints_on_the_local_cluster(stack, monkeypatch):
    """docs/try-it.md (the README's "Try it" in full): `make demo` runs suggest on node1..node4
    before the seed (localcp/demo.py `suggested`); here on the same four nodes, 4 GPUs each,
    nothing held."""
    from localcp.demo import suggested

    monkeypatch.chdir(REPO)
    out = suggested(stack)
    page = (REPO / "docs" / "try-it.md").read_text()
    assert f"$ kubectl gpu-scheduler suggest -f check/statefulset.yaml --gpus 2\n{out}```" in page
    assert "With `--gpus 3` only four replicas fit, one a node: it exits 1" in page
    code, out, err = run("suggest", "-f", "check/statefulset.yaml", "--gpus", "3", "--kubeconfig",
                         str(stack.cp.kubeconfig))
    assert (code, out) == (1, "")
    assert ("5 replicas x 3 GPUs = 15 GPUs do not fit: 16 GPUs are free now: node1 0,1,2,3; node2 0,1,2,3;"
            " node3 0,1,2,3; node4 0,1,2,3; each replica needs 3 on one node. 4 of 5 replicas fit; index 4 does not"
            " (after the 4 that fit, 4 GPUs left: node1 3; node2 3; node3 3; node4 3)\n") in err, err
