"""`make demo`: the seed StatefulSet placed and run on the local stack, start to finish: four real
nodes (kubelet + containerd each), the webhook, the event source and bind."""
from __future__ import annotations

import sys
import time

from .cluster import KUBERNETES_VERSION, REPO, ensure_built
from .stack import LocalStack

SEED = REPO / "check" / "statefulset.yaml"
SELECTOR = "app=gpu-scheduler-check"


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def running(stack: LocalStack, count: int) -> list[dict] | None:
    pods = stack.pods("default", SELECTOR)
    up = [p for p in pods if p["status"].get("phase") == "Running"]
    return pods if len(pods) == count and len(up) == count else None


def main() -> int:
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
        step(f"kubectl apply -f {SEED.relative_to(REPO)}   (5 replicas, the seed map; unchanged)")
        applied = time.monotonic()
        print(stack.apply(SEED.read_text()), end="")
        pods = stack.wait_for(lambda: running(stack, 5), 120, "5 check pods Running")
        print(f"    five Running {time.monotonic() - applied:.1f}s after the apply")
        step("kubectl get pod -o wide -L apps.kubernetes.io/pod-index   (the label the StatefulSet controller sets)")
        print(stack.cp.kubectl("get", "pod", "-o", "wide", "-L", "apps.kubernetes.io/pod-index").stdout, end="")
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            name = pod["metadata"]["name"]
            step(f"kubectl logs {name} --tail=1   (its container, on {pod['spec']['nodeName']})")
            line = stack.wait_for(lambda: stack.cp.kubectl("logs", name, "--tail=1").stdout, 15, f"{name}'s log")
            print(line, end="")
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
