"""The real workload controllers, JobSet, LeaderWorkerSet and Kueue, beside the local control
plane, as controller-runtime's envtest runs a controller: its CRDs applied, the controller a process
of this machine with the admin kubeconfig, and its webhooks registered against the API server by
`url` (https://127.0.0.1:<port><path>) with the `caBundle` of a CA made here.

    with WorkloadControllers(cp, kinds=("jobset", "lws", "kueue")) as controllers: ...

localcp/build-workloads.sh builds the binaries (sigs.k8s.io/jobset, sigs.k8s.io/lws and
sigs.k8s.io/kueue at the versions of the settings GPU_SCHEDULER_JOBSET, GPU_SCHEDULER_LWS and
GPU_SCHEDULER_KUEUE, localcp/versions.py: by default v0.11.1, v0.8.0 and v0.17.0; `make
JOBSET=v0.10.1 LWS=v0.7.0` runs the earlier ones, which build and run the same way) and copies
their CRD bases and webhook directories into the cache, once per version; the stack runs the
build of the version set. Each controller runs with its own Configuration file: internal certificate management
off (it would write a Secret and patch the webhook configurations for a Service that does not exist
here), its webhook server on 127.0.0.1 with our serving certificate, a health probe port, no
metrics server and no leader election. The webhook configurations are the upstream manifests with
the kustomization's patches applied (they give the pod webhooks their objectSelector: without it
every pod of the cluster would go through them), renamed `<kind>-<name>` so that they (all
upstream named `mutating-webhook-configuration`) do not collide.

Kueue (its JobSet and LeaderWorkerSet integrations are enabled only when their CRDs are served:
those of this stack are applied before any controller starts) needs three things more:
- its metrics certificate: with internal certificate management off, cmd/kueue/main.go builds a
  certificate watcher on the fixed /etc/kueue/metrics/certs/tls.{crt,key} (even with metrics off)
  and exits when they cannot be read. The process runs in a mount namespace of its own whose /etc
  is a read-only overlay of a directory of ours (kueue/metrics/certs: our serving certificate) on
  the machine's /etc, which is not touched.
- the VisibilityOnDemand feature gate off (featureGates in its Configuration): on, it starts the
  visibility API server on port 8082, which wants certificates of its own.
- the namespaces it manages: only those labelled KUEUE_NAMESPACE_LABEL. Its Configuration's
  managedJobsNamespaceSelector says so (with the ManagedJobsNamespaceSelectorAlwaysRespected gate,
  on by default in v0.17, its reconcilers ignore every other namespace, queue-name or not), and
  its webhooks on other groups' kinds (pods, jobs, statefulsets, deployments, jobsets,
  leaderworkersets, ...) get that label as their namespaceSelector, in place of the upstream patch
  (every namespace but kube-system and kueue-system): the pods and jobs of any other namespace
  never reach it. Within those namespaces, an object opts in with the kueue.x-k8s.io/queue-name
  label (manageJobsWithoutQueueName false).
"""
from __future__ import annotations

import base64
import copy
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import pki, versions
from .cluster import CACHE, ControlPlane, ProcessFailed, free_port

WORKLOADS = CACHE / "workloads"  # localcp/build-workloads.sh --path
BUILD_HINT = "bash localcp/build-workloads.sh"
# The namespaces Kueue manages (see above): create them with this label.
KUEUE_NAMESPACE_LABEL = {"gpu-scheduler.local/kueue": "managed"}
KUEUE_GROUP = "kueue.x-k8s.io"


@dataclass(frozen=True)
class Controller:
    """One workload controller: where localcp/build-workloads.sh puts it, how it is configured,
    and a probe object that shows its webhooks are called (dry-run created)."""
    kind: str                 # the short name: the cache directory's and the process's
    version: str
    config_api_version: str   # its Configuration's apiVersion
    group: str
    api_version: str
    plural: str
    probe: dict               # a valid object; its mutating webhook sets `defaulted`
    defaulted: tuple[str, ...]
    invalid_name: str = "webhook.probe"  # a DNS-1123 subdomain that its validating webhook refuses
    invalid: dict | None = None  # or: merged into the probe, what its validating webhook refuses
    namespaced: bool = True   # the probe's kind
    # namespaced kinds delete_workloads deletes: (group, version, plural); its own kind if empty
    cleanup: tuple[tuple[str, str, str], ...] = ()

    @property
    def dir(self) -> Path:
        return WORKLOADS / f"{self.kind}-{self.version}"

    @property
    def binary(self) -> Path:
        return self.dir / "bin" / f"{self.kind}-controller"

    def collection(self, namespace: str) -> str:
        if not self.namespaced:
            return f"/apis/{self.group}/{self.api_version}/{self.plural}"
        return f"/apis/{self.group}/{self.api_version}/namespaces/{namespace}/{self.plural}"

    @property
    def cleanup_kinds(self) -> tuple[tuple[str, str, str], ...]:
        return self.cleanup or ((self.group, self.api_version, self.plural),)


_PAUSE = {"containers": [{"name": "c", "image": "pause"}],
          "schedulerName": "no-such-scheduler"}

CONTROLLERS = {
    "jobset": Controller(
        "jobset", versions.workload("jobset"), "config.jobset.x-k8s.io/v1alpha1", "jobset.x-k8s.io", "v1alpha2", "jobsets",
        probe={"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "webhook-probe"},
               "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                   "template": {"spec": _PAUSE}}}}]}},
        defaulted=("spec", "network", "enableDNSHostnames")),
    "lws": Controller(
        "lws", versions.workload("lws"), "config.lws.x-k8s.io/v1alpha1", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets",
        probe={"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
               "metadata": {"name": "webhook-probe"},
               "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 1, "workerTemplate": {"spec": _PAUSE}}}},
        defaulted=("spec", "networkConfig", "subdomainPolicy")),
    # Probed with a ResourceFlavor (cluster-scoped): its defaulting webhook adds the
    # resource-in-use finalizer, its validating webhook refuses a node label key with a space
    # (the CRD's schema does not check the keys).
    "kueue": Controller(
        "kueue", versions.workload("kueue"), "config.kueue.x-k8s.io/v1beta2", KUEUE_GROUP, "v1beta2", "resourceflavors",
        probe={"apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": "webhook-probe"}, "spec": {}},
        defaulted=("metadata", "finalizers"),
        invalid={"spec": {"nodeLabels": {"not a label key": "x"}}},
        namespaced=False,
        cleanup=((KUEUE_GROUP, "v1beta2", "workloads"), (KUEUE_GROUP, "v1beta2", "localqueues"))),
}
# Kueue's integrations (Configuration integrations.frameworks): always, and those whose CRDs
# must be served (group, version) for Kueue to run their controllers.
KUEUE_FRAMEWORKS = ("batch/job", "pod", "statefulset")
KUEUE_CRD_FRAMEWORKS = {"jobset.x-k8s.io/jobset": ("jobset.x-k8s.io", "v1alpha2"),
                        "leaderworkerset.x-k8s.io/leaderworkerset": ("leaderworkerset.x-k8s.io", "v1")}
KUEUE_METRICS_CERTS = "/etc/kueue/metrics/certs"  # fixed in v0.17's cmd/kueue/main.go


@dataclass
class _Running:
    controller: Controller
    process: str
    webhook_port: int
    health_port: int
    configurations: list[tuple[str, str]] = field(default_factory=list)  # (resource, name)


class WorkloadControllers:
    """The controllers of `kinds` (keys of CONTROLLERS) on `cp`: start() applies the CRDs, starts
    the processes and registers their webhooks; stop() unregisters the webhooks first (the API
    server must not keep calling a stopped webhook: failurePolicy Fail), then stops them.
    `started_seconds`: how long start() took."""

    def __init__(self, cp: ControlPlane, kinds: tuple[str, ...] = ("jobset", "lws")):
        unknown = set(kinds) - set(CONTROLLERS)
        if unknown:
            raise ValueError(f"unknown workload controllers {sorted(unknown)}; known: {sorted(CONTROLLERS)}")
        self.cp = cp
        self.controllers = [CONTROLLERS[k] for k in kinds]
        self.running: list[_Running] = []
        self.started_seconds: float | None = None
        self.dir = cp.workdir / "workloads"

    def __enter__(self) -> "WorkloadControllers":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- start -----------------------------------------------------------------------------
    def start(self) -> "WorkloadControllers":
        began = time.monotonic()
        missing = [c for c in self.controllers if not c.binary.exists()]
        if missing:
            raise FileNotFoundError(f"workload controllers not built ({', '.join(str(c.binary) for c in missing)}):"
                                    f" run {BUILD_HINT} {' '.join(c.kind for c in missing)}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._apply_crds()
        self.ca = pki.make_ca(self.dir, "workloads-ca")
        certs = self.dir / "certs"  # controller-runtime's webhook server reads tls.crt and tls.key here
        certs.mkdir(exist_ok=True)
        pki.make_cert(certs, "tls", self.ca, "/CN=workload-webhooks", sans=("IP:127.0.0.1", "DNS:localhost"))
        for controller in self.controllers:  # all started before any is waited for
            self.running.append(self._spawn(controller, certs))
        for running in self.running:
            self.cp._wait(running.process, lambda r=running: self._healthy(r), "/readyz", timeout=60)
        for running in self.running:
            self._register_webhooks(running)
        for running in self.running:
            self._wait_webhooks_called(running)
        if any(c.kind == "kueue" for c in self.controllers):
            self._wait_collected()
        self.started_seconds = time.monotonic() - began
        return self

    def _wait_collected(self, timeout: float = 90) -> None:
        """Until the garbage collector collects Kueue's objects: a Workload goes when its owner (a
        Job, a StatefulSet and its pods, ...) is gone, and only that frees its quota. The collector
        watches a new CRD's objects from its next discovery resync (every 30 s in the controller
        manager); before, a deleted workload's Workload would stay, admitted. Probe: a LocalQueue
        owned by a ConfigMap, the ConfigMap deleted, until the LocalQueue is collected."""
        owner = json.loads(self.cp.request("POST", "/api/v1/namespaces/default/configmaps",
                                           {"metadata": {"name": "kueue-gc-probe"}}))
        queues = f"/apis/{KUEUE_GROUP}/v1beta2/namespaces/default/localqueues"
        self.cp.request("POST", queues, {
            "apiVersion": f"{KUEUE_GROUP}/v1beta2", "kind": "LocalQueue", "metadata": {
                "name": "gc-probe", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                                         "name": "kueue-gc-probe", "uid": owner["metadata"]["uid"]}]},
            "spec": {"clusterQueue": "none"}})
        self.cp.request("DELETE", "/api/v1/namespaces/default/configmaps/kueue-gc-probe")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.cp.request("GET", f"{queues}/gc-probe")
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return
                raise
            time.sleep(0.5)
        raise TimeoutError(f"the garbage collector did not collect a LocalQueue within {timeout} s")

    def _apply_crds(self) -> None:
        names = []
        for controller in self.controllers:
            files = sorted((controller.dir / "crds").glob("*.yaml"))
            names += [f"crd/{yaml.safe_load(f.read_text())['metadata']['name']}" for f in files]
            # server-side: the CRDs are too large for the last-applied annotation
            self.cp.kubectl("apply", "--server-side", "--force-conflicts", *(a for f in files for a in ("-f", str(f))))
        # Polled rather than `kubectl wait`, which fails at once when its discovery of the new
        # resources races their registration (seen with the real nodes' stack).
        deadline = time.monotonic() + 60
        while True:
            pending = [name for name in names if self.cp.kubectl(
                "get", name, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                check=False).stdout.strip() != "True"]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRDs not Established after 60 s: {', '.join(pending)}")
            time.sleep(0.2)

    def configuration(self, controller: Controller, webhook_port: int, health_port: int, certs: Path) -> dict:
        """The controller's Configuration file (its API's `Configuration` kind, JSON is YAML)."""
        configuration = {
            "apiVersion": controller.config_api_version, "kind": "Configuration",
            "internalCertManagement": {"enable": False},
            "leaderElection": {"leaderElect": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},  # controller-runtime's "no metrics server"
        }
        if controller.kind == "kueue":
            configuration.update({
                "manageJobsWithoutQueueName": False,
                "managedJobsNamespaceSelector": {"matchLabels": dict(KUEUE_NAMESPACE_LABEL)},
                "integrations": {"frameworks": self.kueue_frameworks()},
                "featureGates": {"VisibilityOnDemand": False},
            })
        return configuration

    def kueue_frameworks(self) -> list[str]:
        """Kueue's integrations: job, pod and statefulset, and JobSet's and LeaderWorkerSet's when
        their CRDs are served (started before it). Without them Kueue would still run, polling for
        the APIs to set those controllers up."""
        frameworks = list(KUEUE_FRAMEWORKS)
        for name, (group, version) in KUEUE_CRD_FRAMEWORKS.items():
            try:
                self.cp.get(f"/apis/{group}/{version}")
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
            else:
                frameworks.append(name)
        return frameworks

    def _spawn(self, controller: Controller, certs: Path) -> _Running:
        running = _Running(controller, f"{controller.kind}-controller", free_port(), free_port())
        path = self.dir / f"{controller.kind}-config.yaml"
        path.write_text(json.dumps(self.configuration(controller, running.webhook_port, running.health_port, certs),
                                   indent=2))
        argv = [str(controller.binary), "--config", str(path), "--kubeconfig", str(self.cp.kubeconfig)]
        if controller.kind == "kueue":
            argv = self._with_kueue_metrics_certs(argv, certs)
        self.cp._spawn(running.process, argv)
        return running

    def _with_kueue_metrics_certs(self, argv: list[str], certs: Path) -> list[str]:
        """argv in a mount namespace of its own whose /etc is a read-only overlay of
        <dir>/kueue-etc (kueue/metrics/certs/tls.{crt,key}: our serving certificate, never served:
        metrics are off) on the machine's /etc: Kueue v0.17 without internal certificate
        management reads them there and exits without them. The machine's /etc is not touched."""
        etc = self.dir / "kueue-etc"
        metrics_certs = etc / KUEUE_METRICS_CERTS.removeprefix("/etc/")
        metrics_certs.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (metrics_certs / name).write_bytes((certs / name).read_bytes())
        return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c",
                'mount -t overlay overlay -o lowerdir="$0":/etc /etc && exec "$@"', str(etc), *argv]

    @staticmethod
    def _healthy(running: _Running) -> bool:
        url = f"http://127.0.0.1:{running.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    # -- webhooks --------------------------------------------------------------------------
    def webhook_configurations(self, running: _Running) -> list[dict]:
        """The controller's webhook manifests with its kustomization's patches applied, each
        webhook's clientConfig its URL on 127.0.0.1 with our CA, each name prefixed by its kind."""
        webhook_dir = running.controller.dir / "webhook"
        manifests = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
        kustomization = webhook_dir / "kustomization.yaml"
        if kustomization.exists():
            for patch in yaml.safe_load(kustomization.read_text()).get("patches") or []:
                apply_kustomize_patch(manifests, patch, webhook_dir)
        ca_bundle = base64.b64encode(self.ca[1].read_bytes()).decode()
        for manifest in manifests:
            manifest["metadata"] = {"name": f"{running.controller.kind}-{manifest['metadata']['name']}",
                                    "labels": {"gpu-scheduler.local/workload-controller": running.controller.kind}}
            for webhook in manifest["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": f"https://127.0.0.1:{running.webhook_port}{path}",
                                           "caBundle": ca_bundle}
                if running.controller.kind == "kueue" and not all(
                        rule.get("apiGroups") == [KUEUE_GROUP] for rule in webhook.get("rules") or []):
                    # pods, jobs, statefulsets, ...: only in the namespaces Kueue manages
                    webhook["namespaceSelector"] = {"matchLabels": dict(KUEUE_NAMESPACE_LABEL)}
        return manifests

    def _register_webhooks(self, running: _Running) -> None:
        manifests = self.webhook_configurations(running)
        self.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
        running.configurations = [(m["kind"].lower(), m["metadata"]["name"]) for m in manifests]

    def _wait_webhooks_called(self, running: _Running, timeout: float = 30) -> None:
        """Until the API server calls both webhooks (it picks configurations up asynchronously):
        a dry-run create of the probe comes back defaulted by the mutating one, and one with an
        invalid name is denied by the validating one."""
        controller = running.controller
        path = controller.collection("default") + "?dryRun=All"
        invalid = copy.deepcopy(controller.probe)
        if controller.invalid is not None:
            _merge(invalid, controller.invalid)
        else:
            invalid["metadata"]["name"] = controller.invalid_name
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            value = None
            try:
                value = json.loads(self.cp.request("POST", path, controller.probe))
                for key in controller.defaulted:
                    value = value.get(key) if isinstance(value, dict) else None
                if value is None:
                    last = f"the probe came back without {'.'.join(controller.defaulted)}"
                else:
                    self.cp.request("POST", path, invalid)
                    last = "the invalid probe was accepted"
            except urllib.error.HTTPError as error:
                last = error.read().decode(errors="replace")
                if value is not None and error.code in (400, 403, 422) and "denied the request" in last:
                    return
            time.sleep(0.2)
        raise ProcessFailed(f"{running.process}: its webhooks not called after {timeout}s ({last}):\n"
                            f"{self.cp.log_tail(running.process)}")

    # -- stop ------------------------------------------------------------------------------
    def stop(self) -> None:
        for running in self.running:
            for resource, name in running.configurations:
                self.cp.kubectl("delete", resource, name, "--ignore-not-found", check=False)
        for running in self.running:
            self.cp._terminate(running.process)
            self.cp.processes.pop(running.process, None)
        self.running = []


# -- kustomize patches, as the webhook kustomizations use them -------------------------------
def apply_kustomize_patch(manifests: list[dict], patch: dict, base: Path) -> None:
    """One entry of a kustomization's `patches`: a JSON 6902 patch (a list of operations) on its
    `target`, or a strategic merge patch naming its object (webhooks merged by name)."""
    text = (base / patch["path"]).read_text() if "path" in patch else patch["patch"]
    body = yaml.safe_load(text)
    if isinstance(body, list):
        target = patch["target"]
        for manifest in manifests:
            if manifest["kind"] == target["kind"] and manifest["metadata"]["name"] == target["name"]:
                for operation in body:
                    _json_patch(manifest, operation)
        return
    for manifest in manifests:
        if manifest["kind"] == body["kind"] and manifest["metadata"]["name"] == body["metadata"]["name"]:
            by_name = {w["name"]: w for w in manifest["webhooks"]}
            for webhook in body.get("webhooks") or []:
                _merge(by_name[webhook["name"]], webhook)


def _merge(into: dict, patch: dict) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _json_patch(document: dict, operation: dict) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
    node = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    op = operation["op"]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op == "add":
            node.insert(index, copy.deepcopy(operation["value"]))
        elif op == "replace":
            node[index] = copy.deepcopy(operation["value"])
        elif op == "remove":
            del node[index]
        else:
            raise NotImplementedError(f"JSON patch op {op}")
    elif op in ("add", "replace"):
        node[last] = copy.deepcopy(operation["value"])
    elif op == "remove":
        del node[last]
    else:
        raise NotImplementedError(f"JSON patch op {op}")


# -- cleanup ---------------------------------------------------------------------------------
def delete_workloads(cp_or_api, namespace: str, propagation: str = "Orphan") -> None:
    """Delete every JobSet, LeaderWorkerSet, Kueue Workload and LocalQueue in `namespace` (a
    ControlPlane, a LocalStack or a kubernetes ApiClient). Without their CRDs (a stack without the
    controllers) there is nothing to delete: 404 is fine. Orphan by default, as
    tests/conftest.py's release_namespace deletes Jobs and StatefulSets, then the pods at once.
    Kueue's cluster-scoped ClusterQueues and ResourceFlavors are the tests' to delete."""
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
    cp = getattr(cp_or_api, "cp", cp_or_api)
    for group, version, plural in (kind for c in CONTROLLERS.values() for kind in c.cleanup_kinds):
        if isinstance(cp, ControlPlane):
            try:
                cp.request("DELETE", f"/apis/{group}/{version}/namespaces/{namespace}/{plural}", body)
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
        else:
            from kubernetes import client
            from kubernetes.client.exceptions import ApiException
            try:
                client.CustomObjectsApi(cp_or_api).delete_collection_namespaced_custom_object(
                    group, version, namespace, plural, body=body)
            except ApiException as error:
                if error.status != 404:
                    raise
