"""func, Knative Functions' CLI, as a func user runs it against the local stack
(localcp/build-func.sh builds it: knative.dev/func at the version of localcp/versions.env, func 1.16).

`func invoke` runs where a function's Route is reachable: in a pod of the cluster (invoke_from_a_pod),
from an image of the binary (image()), since a Route's cluster-local URL resolves through cluster
DNS only.

`func deploy` records what it deployed in the function's func.yaml (deploy.image, deploy.namespace),
so the stack deploys from a copy of functions/<name>/func.yaml in its work directory: the generated
file in the repository stays what the chart renders (tests/test_chart.py compares them). func's own
configuration goes to the work directory too (XDG_CONFIG_HOME), never to the user's home.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import images, knative
from .cluster import REPO, ControlPlane, ProcessFailed
from .goprogram import CachedProgram


def _load_check():
    """chart/func_yaml.py, a script beside chart/manifests.py (chart/ is not a package)."""
    spec = importlib.util.spec_from_file_location("chart_func_yaml", REPO / "chart" / "func_yaml.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class FuncYamlRefused(ProcessFailed):
    """A func.yaml the chart refuses: chart/func_yaml.py's refusals, each naming its line."""


PROGRAM = CachedProgram("func")
binary, version, ensure_built = PROGRAM.binary, PROGRAM.version, PROGRAM.ensure_built
func_yaml_check = _load_check()
FUNCTIONS = REPO / "functions"


def image_name() -> str:
    return f"localhost/func:{version()}"


def image() -> images.Image:
    """The binary as an image on Knative's images' base (its nonroot user), cached by the binary.
    func keeps its configuration and caches under HOME and XDG_CONFIG_HOME: /tmp, an emptyDir."""
    return knative.binary_image(image_name(), PROGRAM.required(), env=("HOME=/tmp", "XDG_CONFIG_HOME=/tmp"))


def function_copy(cp: ControlPlane, name: str, func_yaml: str | None = None, copy: str = "") -> Path:
    """A directory of the stack's, func/<copy or name>, holding functions/<name>/func.yaml (or the
    text func_yaml): what func deploy reads and writes."""
    directory = cp.workdir / "func" / (copy or name)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    if func_yaml is None:
        shutil.copy(FUNCTIONS / name / "func.yaml", directory / "func.yaml")
    else:
        (directory / "func.yaml").write_text(func_yaml)
    return directory


def func(cp: ControlPlane, *args: str, check: bool = True, timeout: float = 300,
         kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    """func ARGS... with the stack's kubeconfig (or another: kubeconfig)."""
    program = PROGRAM.required()
    config = cp.workdir / "func-config"
    config.mkdir(exist_ok=True)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig or cp.kubeconfig), "XDG_CONFIG_HOME": str(config),
           "FUNC_VERBOSE": "false"}
    done = subprocess.run([str(program), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise ProcessFailed(f"func {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def deploy(cp: ControlPlane, name: str, image: str, func_yaml: str | None = None, check: bool = True,
           kubeconfig: Path | None = None, copy: str = "") -> subprocess.CompletedProcess:
    """`func deploy --build=false --push=false --image IMAGE` of functions/<name> (a copy), as
    docs/install.md tells func users; func waits for the Knative Service to be Ready."""
    directory = function_copy(cp, name, func_yaml, copy)
    refusals = func_yaml_check.check(directory)
    if refusals:  # what the chart refuses is never deployed (chart/func_yaml.py)
        raise FuncYamlRefused("\n".join(map(str, refusals)))
    return func(cp, "deploy", "--path", str(directory), "--build=false", "--push=false", "--image", image,
                check=check, kubeconfig=kubeconfig)


def invoke_from_a_pod(cp: ControlPlane, namespace: str, name: str, *args: str,
                      timeout: float = 120) -> subprocess.CompletedProcess:
    """`func invoke --path /function ARGS...` as a pod of `namespace` on node1, with
    functions/<name>/func.yaml at /function (a ConfigMap): as a func user runs it where the
    function's Route resolves. The pod's exit code and its output (func has no shell to exec
    into: each invocation is a pod that runs to its end, then is deleted)."""
    configmap = f"func-{name}"
    cp.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap, "namespace": namespace},
        "data": {"func.yaml": (FUNCTIONS / name / "func.yaml").read_text()}}))
    pod = f"func-invoke-{name}-{time.monotonic_ns() % 10**9}"
    cp.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": namespace},
        "spec": {"nodeName": "node1", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True},
                 # func invoke writes its state beside func.yaml (.func/): the function's directory
                 # is an emptyDir holding the ConfigMap's func.yaml.
                 "volumes": [{"name": "func-yaml", "configMap": {"name": configmap}},
                             {"name": "function", "emptyDir": {}},
                             {"name": "tmp", "emptyDir": {}}],  # func's HOME and configuration
                 "containers": [{"name": "func", "image": image_name(), "imagePullPolicy": "Never",
                                 "command": ["/ko-app/func", "invoke", "--path", "/function", *args],
                                 "volumeMounts": [{"name": "function", "mountPath": "/function"},
                                                  {"name": "func-yaml", "mountPath": "/function/func.yaml",
                                                   "subPath": "func.yaml", "readOnly": True},
                                                  {"name": "tmp", "mountPath": "/tmp"}],
                                 "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                     "capabilities": {"drop": ["ALL"]}}}]}}))
    deadline = time.monotonic() + timeout
    try:
        while True:
            status = json.loads(cp.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout).get("status", {})
            [state] = [s["state"] for s in status.get("containerStatuses", [])] or [{}]
            if "terminated" in state:
                output = cp.kubectl("logs", "-n", namespace, pod, check=False).stdout
                return subprocess.CompletedProcess(["func", "invoke", *args], state["terminated"]["exitCode"], output, "")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"func invoke in pod {namespace}/{pod}: not done within {timeout} s: {status}")
            time.sleep(0.2)
    finally:
        cp.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false", "--ignore-not-found", check=False)


# -- what func deploy writes, beside what the chart renders -------------------------------------
# Each difference between the Knative Service `func deploy` made from functions/<name>/func.yaml
# and the one the chart renders with the same values (both as the API server and Knative's
# defaulting webhook keep them), by path, with why it is there: what func.yaml cannot say or func
# adds on its own. A path not covered here is drift, which tests/test_func_cluster.py refuses.
EXPLAINED: tuple[tuple[str, str], ...] = (
    ("labels.function.knative.dev", "func's own labels on every function (func.yaml cannot remove them)"),
    ("labels.boson.dev/", "func's own labels on every function (its older names)"),
    ("labels.app.kubernetes.io/", "the chart's release labels (helm's)"),
    ("labels.helm.sh/chart", "the chart's release labels (helm's)"),
    ("annotations.dapr.io/", "func's Dapr annotations: inert on a cluster without Dapr's control plane"),
    ("annotations.argocd.argoproj.io/sync-wave", "the chart's Argo CD order (argocd/)"),
    ("container.name", "Knative names an unnamed container user-container (kubectl logs -c user-container); the chart names it after the function"),
    ("container.env.BUILT", "func's own variable: the deploy's time, so each deploy makes a revision"),
    ("container.env.ADDRESS", "func's own variable for its templates' servers; the image's gunicorn binds PORT"),
    ("container.ports", "the chart declares 8080; func declares none and Knative uses 8080"),
    ("container.imagePullPolicy", "the chart's <function>.image.pullPolicy; func leaves the kubelet's default (IfNotPresent for a tagged image)"),
    ("container.securityContext.readOnlyRootFilesystem", "func.yaml cannot say it: func's pods have a writable root filesystem"),
)


def _flat(service: dict) -> dict[str, object]:
    """A Knative Service as path: value, for what either side sets: its and its template's labels
    and annotations, and the template's pod spec, its one container by field and env by name."""
    template = service["spec"]["template"]
    flat: dict[str, object] = {}
    for where in (service["metadata"], template.get("metadata", {})):
        for kind in ("labels", "annotations"):
            for key, value in (where.get(kind) or {}).items():
                if not key.startswith("serving.knative.dev/"):  # Knative's own bookkeeping (creator, ...)
                    flat[f"{kind}.{key}"] = value
    pod = dict(template["spec"])
    [container] = pod.pop("containers")
    for key, value in pod.items():
        flat[f"pod.{key}"] = value
    for key, value in container.items():
        if key == "env":
            for variable in value:
                flat[f"container.env.{variable['name']}"] = variable.get("value", variable.get("valueFrom"))
        elif key == "securityContext":
            for field, setting in value.items():
                flat[f"container.securityContext.{field}"] = setting
        else:
            flat[f"container.{key}"] = value
    return flat


def differences(deployed: dict, rendered: dict) -> list[tuple[str, object, object, str | None]]:
    """(path, func's value, the chart's value, why) for each path where they differ; why is None
    for a difference nothing explains (drift)."""
    ours, theirs = _flat(deployed), _flat(rendered)
    out = []
    for path in sorted(set(ours) | set(theirs)):
        if ours.get(path) != theirs.get(path):
            why = next((reason for prefix, reason in EXPLAINED if path.startswith(prefix)), None)
            out.append((path, ours.get(path), theirs.get(path), why))
    return out
