"""The operator's view (issue 45), on snapshots: each GPU's state by bind's record rules, its
holders and waiters, the counts, the grid and the JSON."""
from __future__ import annotations

import json

from gpu_scheduler.fit import NodeInfo
from gpu_scheduler.framework.snapshot import NodeSnapshot
from gpu_scheduler.gpus import BEING_FREED, FREE, HELD, IN_FLIGHT, SHARED, Waiter, gpu_view, only
from gpu_scheduler.records import Record, lease_for, nominated_lease
from kubectl_gpu_scheduler import gpus as shell

NOW = 1_000_000.0


def node(name, gpus=4, product="NVIDIA-A100"):
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}}}


def pod(name, node_name, devices, owner="train", kind="StatefulSet", share=False, uid=None):
    annotations = {"gpu-scheduler/devices": devices}
    if share:
        annotations["gpu-scheduler/share-gpus"] = "true"
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or name, "annotations": annotations,
                         "ownerReferences": [{"kind": kind, "name": owner, "controller": True}]},
            "spec": {"nodeName": node_name, "schedulerName": "gpu-scheduler"},
            "status": {"phase": "Running",
                       "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-27T10:00:00Z"}]}}


def record(node_name, device, holder, pod_name, uid, written, **nominee):
    lease = lease_for(node_name, device, (holder,), False, pod_name, uid, written)
    if nominee:
        lease = nominated_lease(Record.of({**lease, "metadata": {**lease["metadata"], "resourceVersion": "1"}}),
                                node_name, device, **nominee)
    lease["metadata"]["resourceVersion"] = "1"
    return Record.of(lease)


def test_every_state_by_binds_rules_with_holders_counts_and_the_legend():
    pending = [{"metadata": {"name": n, "namespace": "ns", "uid": uid}, "spec": {"schedulerName": "gpu-scheduler"},
                "status": {"phase": "Pending"}} for n, uid in (("c-0", "c0"), ("urgent-0", "u"), ("old-0", "old0"))]
    pods = [pod("train-0", "n1", "0,1"), pod("a-0", "n1", "2", owner="a", share=True),
            pod("b-0", "n1", "2", owner="b", share=True), *pending]
    records = [record("n1", "3", "StatefulSet ns/c", "ns/c-0", "c0", NOW - 5),  # in flight: no pod holds it
               record("n2", "0", "StatefulSet ns/old", "ns/old-0", "old0", NOW - 100,
                      pod="ns/urgent-0", pod_uid="u", priority=1000, until=NOW + 20),
               record("n2", "1", "StatefulSet ns/d", "ns/d-0", "d0", NOW - 100)]  # past grace, no pod: free
    snaps = shell.snapshots([node("n1"), node("n2", 2, "NVIDIA-H100")], pods, records, [], [], NOW)
    view = gpu_view(snaps, [(Waiter("ns/w-0", "GPUsHeld", "GPU 0 on n1 is held by ns/train-0 (…)", "wait"),
                             [("n1", "0")])], {"train-0": "2026-11-27T10:00:00Z"})
    states = {(g.node, g.device): g.state for g in view.gpus}
    assert states == {("n1", "0"): HELD, ("n1", "1"): HELD, ("n1", "2"): SHARED, ("n1", "3"): IN_FLIGHT,
                      ("n2", "0"): BEING_FREED, ("n2", "1"): FREE}
    first = view.gpus[0]
    assert [h.pod for h in first.holders] == ["ns/train-0"] and first.workloads == ("StatefulSet ns/train",)
    assert first.since == "2026-11-27T10:00:00Z" and [w.pod for w in first.waiting] == ["ns/w-0"]
    assert view.gpus[4].nominee == "ns/urgent-0" and view.gpus[3].in_flight_for == "ns/c-0"
    assert [(c.name, c.free, c.total) for c in view.nodes] == [("n1", 0, 4), ("n2", 1, 2)]
    assert [(c.name, c.free, c.total) for c in view.types] == [("NVIDIA-A100", 0, 4), ("NVIDIA-H100", 1, 2)]
    assert view.legend["StatefulSet ns/train"] == "A"
    grid = shell.grid(view)
    assert grid.splitlines()[0] == "n1  A A * +   0/4 free   (GPU 2: 2 pods)" and grid.splitlines()[1] == "n2  ~ .   1/2 free"
    data = json.loads(shell.render(view, "json"))
    assert data["gpus"][4]["state"] == "being-freed" and data["gpus"][4]["nominee"] == "ns/urgent-0"
    assert only(view, node="n2").nodes[0].name == "n2" and len(only(view, namespace="other").gpus) == 0


def test_a_node_without_gpus_has_no_rows_and_a_record_of_a_pod_gone_frees_its_gpu_at_once():
    records = [record("n1", "0", "StatefulSet ns/c", "ns/c-0", "gone-uid", NOW - 1)]
    snaps = shell.snapshots([node("n1", 1), node("cpu", 0)], [], records, [], [], NOW)
    view = gpu_view(snaps)
    assert [(g.node, g.state) for g in view.gpus] == [("n1", FREE)]
