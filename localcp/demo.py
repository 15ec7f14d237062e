"""`make demo`: the seed StatefulSet placed and run on the local stack, start to finish: four real
nodes (kubelet + containerd each), the webhook, the event source and bind.

`make demo DRA=1` (--dra): the seed in DRA mode. Each replica gets a ResourceClaim that bind
allocates to exactly its map entry's devices, published by Kubernetes' DRA test driver on each
node, and the kubelet prepares it (CDI) before the container starts. The seed gives node4's device
3 to index 3 and 4; a device belongs to one claim, so in DRA mode index 4 takes device 2."""
from __future__ import annotations

import argparse
import io
import json
import sys
import time

import yaml

from .cluster import KUBERNETES_VERSION, REPO, ensure_built
from .stack import LocalStack

SEED = REPO / "check" / "statefulset.yaml"
SELECTOR = "app=gpu-scheduler-check"
DRA_CHANGES = {"gpu-scheduler/device-env": "dra", "gpu-scheduler/device-class": "test-driver.cdi.k8s.io"}
DRA_INDEX_4 = ("4=node4:3", "4=node4:2")


def seed(dra: bool) -> str:
    """The seed as applied: unchanged, or in DRA mode (two annotations, index 4 on device 2)."""
    if not dra:
        return SEED.read_text()
    manifest = yaml.safe_load(SEED.read_text())
    annotations = manifest["spec"]["template"]["metadata"]["annotations"]
    annotations.update(DRA_CHANGES)
    annotations["gpu-scheduling-map"] = annotations["gpu-scheduling-map"].replace(*DRA_INDEX_4)
    return json.dumps(manifest)


def suggested(stack: LocalStack) -> str:
    """What `kubectl gpu-scheduler suggest -f check/statefulset.yaml --gpus 2` prints on the stack."""
    from kubectl_gpu_scheduler.cli import main as plugin

    out, err = io.StringIO(), io.StringIO()
    plugin(["suggest", "-f", str(SEED), "--gpus", "2", "--kubeconfig", str(stack.cp.kubeconfig)],
           stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def running(stack: LocalStack, count: int) -> list[dict] | None:
    pods = stack.pods("default", SELECTOR)
    up = [p for p in pods if p["status"].get("phase") == "Running"]
    return pods if len(pods) == count and len(up) == count else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcp.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dra", action="store_true", help="the seed in DRA mode, through the DRA test driver")
    args = parser.parse_args(argv)
    step("Building what the stack runs if it is not cached (first time: about 6-10 minutes)")
    ensure_built()
    step(f"Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler {KUBERNETES_VERSION}; "
         "node1..node4 (a kubelet and a containerd each);\n"
         "    mutate (TLS, registered from knative/webhook.yaml), bind, and the ApiServerSource stand-in")
    started = time.monotonic()
    with LocalStack(real_nodes=True) as stack:
        print(f"    up in {time.monotonic() - started:.1f}s; API server {stack.cp.server}")
        print("    " + "; ".join(stack.cp.versions()))
        print(stack.cp.kubectl("get", "nodes", "-o", "wide").stdout, end="")
        step(f"kubectl gpu-scheduler suggest -f {SEED.relative_to(REPO)} --gpus 2   (a map from the nodes as they"
             " are, before the seed:\n    each replica 2 GPUs on one node, one replica per node first; the seed"
             " is applied with its own map)")
        print(suggested(stack), end="")
        if args.dra:
            step(f"kubectl apply -f {SEED.relative_to(REPO)} in DRA mode: annotations {DRA_CHANGES},"
                 f"\n    map entry {DRA_INDEX_4[0]} -> {DRA_INDEX_4[1]} (a device belongs to one claim)")
            print(stack.cp.kubectl("get", "resourceslices", "-o", "custom-columns=SLICE:.metadata.name,"
                                   "NODE:.spec.nodeName,DRIVER:.spec.driver,DEVICES:.spec.devices[*].name").stdout,
                  end="")
        else:
            step(f"kubectl apply -f {SEED.relative_to(REPO)}   (5 replicas, the seed map; unchanged)")
        applied = time.monotonic()
        print(stack.apply(seed(args.dra)), end="")
        pods = stack.wait_for(lambda: running(stack, 5), 120, "5 check pods Running")
        print(f"    five Running {time.monotonic() - applied:.1f}s after the apply")
        step("kubectl get pod -o wide -L apps.kubernetes.io/pod-index   (the label the StatefulSet controller sets)")
        print(stack.cp.kubectl("get", "pod", "-o", "wide", "-L", "apps.kubernetes.io/pod-index").stdout, end="")
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            name = pod["metadata"]["name"]
            step(f"kubectl logs {name} --tail=1   (its container, on {pod['spec']['nodeName']})")
            line = stack.wait_for(lambda: stack.cp.kubectl("logs", name, "--tail=1").stdout, 15, f"{name}'s log")
            print(line, end="")
        if args.dra:
            step("kubectl get resourceclaims   (each replica's claim: allocated by bind, reserved for its pod)")
            print(stack.cp.kubectl("get", "resourceclaims", "-o", "custom-columns=CLAIM:.metadata.name,"
                                   "NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0],"
                                   "DEVICES:.status.allocation.devices.results[*].device,"
                                   "RESERVED-FOR:.status.reservedFor[*].name").stdout, end="")
        step("kubectl describe pod gpu-scheduler-check-4   (its Events: gpu-scheduler's and the kubelet's)")
        described = stack.cp.kubectl("describe", "pod", "gpu-scheduler-check-4").stdout
        print(described[described.index("Events:"):], end="")
        step("Tearing down: pods deleted first, then the kubelets, the containerds, everything else")
        nodes = stack.nodes
        processes = list(stack.cp.processes.values())
    left = [p.args[0] for p in processes if p.poll() is None]
    leftovers = nodes.leftovers()
    if left or leftovers:
        print(f"    still there: processes {left}; {leftovers}")
        return 1
    print("    done: no process, shim, mount, cgroup, network namespace or interface left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
