"""`make demo`: the seed StatefulSet placed on the local control plane, start to finish."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .cluster import REPO, ensure_built
from .stack import LocalStack

SEED = REPO / "check" / "statefulset.yaml"
SHOWN_NODES = ("node3", "node4")


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def container_env(pod: dict) -> dict[str, str]:
    """The check container's environment as the kubelet would give it (downward API resolved)."""
    env = {}
    for var in pod["spec"]["containers"][0].get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[var["name"]] = pod["spec"]["nodeName"]
    return env


def check_logs(pod: dict, seconds: float = 1.2) -> str:
    """Run check/check.py with the pod's environment, then stop it with SIGTERM as the kubelet would."""
    env = {"PATH": os.environ["PATH"], "CHECK_INTERVAL_SECONDS": "0.5", **container_env(pod)}
    process = subprocess.Popen([sys.executable, str(REPO / "check" / "check.py")], env=env,
                               stdout=subprocess.PIPE, text=True)
    time.sleep(seconds)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=5)
    return out


def main() -> int:
    step("Building the local control plane if it is not cached (first time: about 6-10 minutes)")
    ensure_built()
    step("Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, nodes node1..node4,\n"
         "    mutate (TLS, registered from knative/webhook.yaml), bind, and the ApiServerSource stand-in")
    started = time.monotonic()
    with LocalStack() as stack:
        print(f"    up in {time.monotonic() - started:.1f}s; API server {stack.cp.server}")
        print("    " + "; ".join(stack.cp.versions()))
        step(f"Applying {SEED.relative_to(REPO)} (5 replicas, the seed map)")
        print(stack.apply(SEED.read_text()), end="")
        pods = stack.wait_bound("default", 5, "app=gpu-scheduler-check", timeout=60)
        step("kubectl get pod -o wide -A -L apps.kubernetes.io/pod-index   (the label the StatefulSet controller sets)")
        print(stack.cp.kubectl("get", "pod", "-o", "wide", "-A", "-L", "apps.kubernetes.io/pod-index").stdout, end="")
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            if pod["spec"]["nodeName"] in SHOWN_NODES:
                step(f"kubectl logs {pod['metadata']['name']}   (on {pod['spec']['nodeName']})")
                print(check_logs(pod), end="")
        step("kubectl describe pod gpu-scheduler-check-4   (its Events)")
        stack.wait_for(lambda: len(stack.api.list_namespaced_event(
            "default", field_selector="involvedObject.name=gpu-scheduler-check-4").items) >= 2, 10, "events")
        described = stack.cp.kubectl("describe", "pod", "gpu-scheduler-check-4").stdout
        print(described[described.index("Events:"):], end="")
        print("\nNote: no kubelet runs here, so the pods are bound (NODE is set) but stay Pending;\n"
              "the logs above are check/check.py run locally with each pod's environment, with\n"
              "NODE_NAME resolved from spec.nodeName as the downward API does.")
        step("Tearing everything down")
        processes = list(stack.cp.processes.values())
    left = [p.args[0] for p in processes if p.poll() is None]
    print(f"    still running: {left}" if left else "    done: no process left running")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
