"""`kubectl gpu-scheduler gpus --watch` on the real control plane: it draws again when a pod takes
or leaves a GPU (from its watches, no polling), as a user granted exactly permissions.PLUGIN and
PLUGIN_WATCH; granted PLUGIN alone, it stops at once with the message naming the grant it lacks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from gpu_scheduler import permissions
from test_end_to_end import statefulset

pytestmark = pytest.mark.controlplane
SCRIPT = os.path.join(os.path.dirname(sys.executable), "kubectl-gpu_scheduler")


def account(stack, tmp_path_factory, name: str, grants) -> str:
    """A kubeconfig for ServiceAccount `name` granted exactly `grants`."""
    rules = [{"apiGroups": [group], "resources": [resource], "verbs": [verb]} for group, resource, verb in sorted(grants)]
    if not stack.api.list_namespace(field_selector="metadata.name=gpus-home").items:
        stack.create_namespace("gpus-home")
    for manifest in (
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "gpus-home"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"gpus-{name}"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"gpus-{name}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"gpus-{name}"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "gpus-home"}]},
    ):
        stack.apply(manifest)
    path = tmp_path_factory.mktemp(name) / "config"
    path.write_text(stack.cp.kubeconfig_text(user={"token": stack.cp.service_account_token("gpus-home", name)}))
    return str(path)


class Draws:
    """The JSON views a running `gpus --watch -o json` prints, as they come."""

    def __init__(self, process: subprocess.Popen):
        self.views: list[dict] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process) -> None:
        decoder, text = json.JSONDecoder(), ""
        for line in process.stdout:
            text += line
            while text.strip():
                try:
                    view, end = decoder.raw_decode(text.lstrip())
                except ValueError:
                    break
                with self._lock:
                    self.views.append(view)
                text = text.lstrip()[end:]

    def state(self, node: str, device: str) -> tuple[str, list[str]] | None:
        with self._lock:
            if not self.views:
                return None
            view = self.views[-1]
        gpu = next(g for g in view["gpus"] if (g["node"], g["device"]) == (node, device))
        return gpu["state"], [h["pod"] for h in gpu["holders"]]


def test_gpus_watch_draws_again_when_a_pod_takes_and_leaves_a_gpu(stack, namespace, tmp_path_factory):
    config = account(stack, tmp_path_factory, "watcher", permissions.PLUGIN | permissions.PLUGIN_WATCH)
    process = subprocess.Popen([SCRIPT, "gpus", "--watch", "-o", "json", "--kubeconfig", config],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        draws = Draws(process)
        stack.wait_for(lambda: draws.state("node2", "3") == ("free", []), 30, "the first draw: node2's GPU 3 free")
        first = len(draws.views)
        obj = statefulset(namespace)
        obj["spec"]["replicas"] = 1
        obj["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] = "0=node2:3\n"
        stack.apply(obj)
        holder = f"{namespace}/gpu-scheduler-check-0"
        stack.wait_for(lambda: draws.state("node2", "3") == ("held", [holder]), 30, "a draw with the pod holding it")
        assert len(draws.views) > first  # drawn again, not only once
        stack.cp.kubectl("delete", "statefulset", "gpu-scheduler-check", "-n", namespace, "--wait=false")
        stack.cp.kubectl("delete", "pod", "gpu-scheduler-check-0", "-n", namespace, "--grace-period=0", "--force",
                         check=False)
        stack.wait_for(lambda: draws.state("node2", "3") == ("free", []), 60, "a draw with the GPU free again")
        assert process.poll() is None, process.stderr.read()
    finally:
        process.terminate()
        process.wait(10)


def test_gpus_watch_without_the_watch_grant_stops_naming_it(stack, tmp_path_factory):
    config = account(stack, tmp_path_factory, "reader-only", permissions.PLUGIN)
    done = subprocess.run([SCRIPT, "gpus", "--watch", "-o", "grid", "--kubeconfig", config],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: gpus --watch: the API server refused to watch ") and "PLUGIN_WATCH" in line
    assert "Traceback" not in done.stderr
