"""Decoding a watch event: the standard library's json, orjson, orjson plus a projection in
Python, and msgspec against kubeapi/projection.py's TypedDicts (what bind and mutate use), on a
captured pod (tests/fixtures) as a kubelet's status updates make it (container statuses,
conditions, managed fields of three managers), on a node as a kubelet reports it (images,
heartbeats), and on a captured AdmissionReview (mutate).

Prints microseconds per event and each ÷ json, measured side by side in one run, and the bytes
kept. `python -m bench.decode [--events N]`; `make bench` prints it too."""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

from kubeapi import projection

FIXTURES = Path(__file__).resolve().parent.parent / "tests/fixtures/sample-events"
FIXTURE = FIXTURES / "knative-v0.50.0/apiserversource-update-gpu-scheduler-check-2-bound.json"
REVIEW = FIXTURES / "admissionreview-v1-create-gpu-scheduler-check-3.json"  # a bare AdmissionReview


def running_pod() -> dict:
    """The captured pod, bound, as it is once its kubelet has reported it running."""
    pod = copy.deepcopy(json.loads(FIXTURE.read_text())["body"])
    time_ = "2026-11-22T20:43:40Z"
    conditions = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": time_}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
    pod["status"] = {
        "phase": "Running", "conditions": conditions, "hostIP": "10.0.0.3", "hostIPs": [{"ip": "10.0.0.3"}],
        "podIP": "10.244.3.17", "podIPs": [{"ip": "10.244.3.17"}], "qosClass": "BestEffort", "startTime": time_,
        "containerStatuses": [{
            "name": "check", "ready": True, "restartCount": 0, "started": True, "image": "gpu-scheduler-check:dev",
            "imageID": "sha256:" + "ab" * 32, "containerID": "containerd://" + "cd" * 32,
            "state": {"running": {"startedAt": time_}}, "lastState": {},
            "volumeMounts": [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                              "readOnly": True, "recursiveReadOnly": "Disabled"}],
            "resources": {}, "user": {"linux": {"uid": 65532, "gid": 65532, "supplementalGroups": [65532]}}}]}
    pod["metadata"]["managedFields"] = pod["metadata"].get("managedFields", []) + [
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kubelet", "operation": "Update",
         "subresource": "status", "time": time_,
         "fieldsV1": {"f:status": {f"f:{k}": {} for k in pod["status"]}}}]
    pod["spec"]["volumes"] = [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                      "fieldPath": "metadata.namespace"}}]}}]}}]
    return pod


def kubelet_node(name: str = "node3") -> dict:
    time_ = "2026-11-22T20:43:40Z"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": "5e0c9a44-0e2b-4b1a-9c55-2f7c4b1d9a10", "resourceVersion": "91827",
                     "creationTimestamp": time_,
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "node.kubernetes.io/instance-type": "p5.48xlarge"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
                     "managedFields": [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": time_,
                                        "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
                                            f'k:{{"type":"{t}"}}': {".": {}, "f:lastHeartbeatTime": {}} for t in
                                            ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")}}}}
                                       for m in ("kubelet", "kube-controller-manager", "gpu-scheduler")]},
        "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]},
        "status": {
            "capacity": {"cpu": "192", "memory": "2113412000Ki", "pods": "110", "nvidia.com/gpu": "8",
                         "ephemeral-storage": "1952739332Ki", "gpu-scheduler.io/gpu": "100000"},
            "allocatable": {"cpu": "191450m", "memory": "2102000000Ki", "pods": "110", "nvidia.com/gpu": "8",
                            "ephemeral-storage": "1799629943693", "gpu-scheduler.io/gpu": "100000"},
            "conditions": [{"type": t, "status": "False" if t != "Ready" else "True", "lastHeartbeatTime": time_,
                            "lastTransitionTime": time_, "reason": f"Kubelet{t}", "message": f"kubelet has {t}"}
                           for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.3"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "ab" * 16, "systemUUID": "cd" * 16, "bootID": "ef" * 16, "kernelVersion": "6.8.0",
                         "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.34.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": [{"names": [f"registry.example/team/image-{i}@sha256:{i:064x}", f"registry.example/team/image-{i}:v{i}"],
                        "sizeBytes": 1_000_000 * i} for i in range(50)]}}


def _event(obj: dict) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": obj}, separators=(",", ":")).encode()


def _pick_pod(obj: dict) -> dict:
    """A projection in Python after a full decode: what orjson plus a projection costs."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return {"metadata": {k: meta[k] for k in projection.ObjectMeta.__annotations__ if k in meta},
            "spec": {k: spec[k] for k in projection.PodSpec.__annotations__ if k in spec},
            "status": {k: status[k] for k in projection.PodStatus.__annotations__ if k in status}}


def measure(events: int) -> dict:
    import orjson  # only here: measured against, not used
    samples = {"running pod": (_event(running_pod()), projection.PODS.event),
               "kubelet node": (_event(kubelet_node()), projection.NODES.event),
               "AdmissionReview": (REVIEW.read_bytes(), projection.admission_review)}
    ways = {"json": lambda line, _: json.loads(line),
            "orjson": lambda line, _: orjson.loads(line),
            "orjson + projection in Python": lambda line, _: _pick_pod(orjson.loads(line)["object"]),
            "msgspec projection (bind, mutate)": lambda line, decoder: decoder(line)}
    results: dict = {}
    for sample, (line, decoder) in samples.items():
        figures: dict = {"bytes": len(line), "kept_bytes": len(json.dumps(decoder(line)))}
        for rep in range(3):  # interleaved repetitions: the best of each way
            for way, decode in ways.items():
                if "Python" in way and sample != "running pod":
                    continue
                start = time.perf_counter()
                for _ in range(events):
                    decode(line, decoder)
                us = (time.perf_counter() - start) * 1e6 / events
                figures[way] = min(figures.get(way, us), us)
        results[sample] = figures
    return results


def rows(results: dict) -> list[str]:
    out = []
    for sample, figures in results.items():
        base = figures["json"]
        out.append(f"decode one {'watch event, ' if 'pod' in sample or 'node' in sample else ''}{sample}"
                   f" ({figures['bytes']} bytes; {figures['kept_bytes']} kept):")
        for way, us in figures.items():
            if way not in ("bytes", "kept_bytes"):
                out.append(f"  {way:<40} {us:8.1f} us  {us / base:5.2f} x json")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    print("\n".join(rows(measure(args.events))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
