"""A real Kubernetes control plane as local processes: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler at KUBERNETES_VERSION, the setting GPU_SCHEDULER_K8S
(localcp/versions.py: `make K8S=v1.33.13`; default localcp/versions.env's), built by
localcp/build.sh into a directory of its own per version. The flags below are accepted by every
version from 1.33 to 1.37: `--endpoint-reconciler-type none` is what lets the API server advertise
127.0.0.1 (the reconciler would write that address into the kubernetes Service's endpoints, where
validation refuses a loopback address), and nothing here depends on a feature gate. DRA (resource.k8s.io/v1) is served from 1.34 (DRA_SERVED).

Nodes come in two kinds. By default no kubelet runs: Node objects are created by us and their
Ready condition is kept fresh by a heartbeat thread, so the node-lifecycle controller treats them
as healthy; pods get bound but never run (cheap: tests with hundreds of pods use these), and the API
server advertises 127.0.0.1 (`--endpoint-reconciler-type none`: the reconciler would write it into
the kubernetes Service's endpoints, where validation refuses a loopback address). With `kubelets`
(node name -> its address on the node network), real kubelets (localcp/nodes.py) register the
nodes themselves on the cluster network of localcp/network.py, started here before the API server:
the API server advertises the control plane's address there (10.240.0.1, its endpoint reconciler
writing it into the kubernetes Service), and reaches kubelets and pods through its egress.
kube-scheduler runs as in any cluster: it places pods of the default scheduler only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from . import network, pki, versions

CACHE = Path(os.environ.get("GPU_SCHEDULER_CACHE", Path.home() / ".cache" / "gpu-scheduler"))
KUBERNETES_VERSION = versions.kubernetes()  # GPU_SCHEDULER_K8S; localcp/build.sh builds the same one
BIN = CACHE / f"k8s-{KUBERNETES_VERSION}" / "bin"
DRA_SERVED = versions.dra_served(KUBERNETES_VERSION)
ETCD = CACHE / "etcd-trixie" / "bin" / "etcd"
REPO = Path(__file__).resolve().parent.parent
NODES = ("node1", "node2", "node3", "node4")
GPUS_PER_NODE = "4"
HEARTBEAT_SECONDS = 10


_issued: set[int] = set()
_issued_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out twice by this process: ports are
    chosen before the servers that use them start, so the kernel could offer one again."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with _issued_lock:
            if port not in _issued:
                _issued.add(port)
                return port


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_built(stack_only: bool = False, workloads: tuple[str, ...] = ()) -> None:
    """Build the binaries once (minutes, with progress); a no-op when cached. By default
    everything the tests and benchmarks use (localcp/build.sh); stack_only: only what a stack
    runs (build.sh --stack: the control plane, etcd, the nodes' parts, the DRA test driver where
    served), plus the workload controllers named in `workloads` (jobset, lws, kueue). At the
    versions of localcp/versions.py, which the scripts read from the same settings."""
    build = REPO / "localcp"
    subprocess.run(["bash", str(build / "build.sh"), *(["--stack"] if stack_only else [])], check=True)
    if stack_only and workloads:
        subprocess.run(["bash", str(build / "build-workloads.sh"), *workloads], check=True)


class ProcessFailed(RuntimeError):
    pass


class ControlPlane:
    def __init__(self, workdir: Path | None = None, kubelets: dict[str, str] | None = None):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gpu-scheduler-cp-"))
        self.kubelets = kubelets or {}
        self.apiserver_flags: list[str] = []  # more kube-apiserver flags (the in-cluster stack's)
        self.processes: dict[str, subprocess.Popen] = {}
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.kubectl_path = str(BIN / "kubectl")
        self._tls_context: ssl.SSLContext | None = None
        # The cluster network (real nodes only): the fabric, and the API server's address on it.
        self.fabric = network.Fabric(self) if self.kubelets else None
        self.egress_socket = self.workdir / "network" / "egress.sock"
        self.cluster_server = f"https://{network.FABRIC_ADDRESS}:{self.api_port}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "ControlPlane":
        try:
            self._make_pki()
            if self.fabric:
                self.fabric.start()
                network.start_podnet(self, self.fabric)
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
            if not self.kubelets:
                self._create_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._heartbeat:
            self._heartbeat.join(timeout=5)
        for name in reversed(list(self.processes)):
            self._terminate(name)
        self.processes.clear()

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if not os.environ.get("GPU_SCHEDULER_KEEP_WORKDIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _terminate(self, name: str) -> None:
        process = self.processes.get(name)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None,
               cwd: str | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _wait(self, name: str, ready, what: str, timeout: float = 60, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.processes[name]
            if process.poll() is not None:
                raise ProcessFailed(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(interval)
        raise ProcessFailed(f"{name}: {what} not ready after {timeout}s:\n{self.log_tail(name)}")

    # -- pieces ----------------------------------------------------------------------------
    def _make_pki(self) -> None:
        d = self.workdir
        self.ca = pki.make_ca(d)
        self.serving = pki.make_cert(d, "apiserver", self.ca, "/CN=kube-apiserver",
                                     sans=("IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes.default.svc",
                                           f"IP:{network.KUBERNETES_SERVICE[0]}",  # the kubernetes Service, as pods reach it
                                           f"IP:{network.FABRIC_ADDRESS}"))  # kubelets, kube-proxies
        self.admin = pki.make_cert(d, "admin", self.ca, "/O=system:masters/CN=admin", client=True)
        self.sa_key = pki.make_rsa_key(d / "sa.key")
        self.kubeconfig.write_text(self.kubeconfig_text(user={
            "client-certificate": str(self.admin[1]), "client-key": str(self.admin[0])}))

    def kubeconfig_text(self, user: dict[str, str], server: str | None = None) -> str:
        """A kubeconfig for this API server with the given user credentials (JSON is YAML);
        server: another address of it (cluster_server, for what runs on the nodes)."""
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": server or self.server,
                                                        "certificate-authority": str(self.ca[1])}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        }, indent=2)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            str(ETCD), "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ], env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")})
        self._wait("etcd", lambda: urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2).status == 200,
                   "health endpoint")

    @property
    def _tls(self) -> ssl.SSLContext:
        if self._tls_context is None:
            context = ssl.create_default_context(cafile=str(self.ca[1]))
            context.load_cert_chain(str(self.admin[1]), str(self.admin[0]))
            self._tls_context = context
        return self._tls_context

    def request(self, method: str, path: str, body: dict | None = None,
                content_type: str = "application/json") -> bytes:
        """One call to the API server as admin; raises urllib.error.HTTPError on non-2xx."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method,
                                     headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, context=self._tls, timeout=10) as r:
            return r.read()

    def get(self, path: str) -> bytes:
        return self.request("GET", path)

    def stop_apiserver(self) -> None:
        self._terminate("kube-apiserver")

    def start_apiserver(self) -> None:
        """(Re)start the API server on the same port, with the same etcd and certificates."""
        self._start_apiserver()

    def _start_apiserver(self) -> None:
        if self.kubelets:
            # On the cluster network: advertised there, with the lease reconciler keeping the
            # kubernetes Service's endpoint; kubelets (by InternalIP) and webhooks in pods reached
            # through the egress (localcp/network.py, localcp/podnet.py).
            egress = self.workdir / "network" / "egress.yaml"
            egress.write_text(network.egress_configuration(self.egress_socket))
            placement = ["--advertise-address", network.FABRIC_ADDRESS, "--endpoint-reconciler-type", "lease",
                         "--egress-selector-config-file", str(egress), "--enable-aggregator-routing=true",
                         "--kubelet-preferred-address-types", "InternalIP"]
        else:
            placement = ["--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none"]
        argv = [
            str(BIN / "kube-apiserver"), "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", *placement,
            "--secure-port", str(self.api_port),
            "--tls-cert-file", str(self.serving[1]), "--tls-private-key-file", str(self.serving[0]),
            "--client-ca-file", str(self.ca[1]),
            "--service-account-key-file", str(self.sa_key), "--service-account-signing-key-file", str(self.sa_key),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--api-audiences", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", network.SERVICE_RANGE, "--authorization-mode", "Node,RBAC",
            "--profiling=false", "--v=1",
            # logs, exec: the API server calls kubelets with the admin client certificate
            "--kubelet-client-certificate", str(self.admin[1]), "--kubelet-client-key", str(self.admin[0]),
            *self.apiserver_flags,
        ]
        self._spawn("kube-apiserver", argv)
        self._wait("kube-apiserver", lambda: self.get("/readyz") == b"ok", "/readyz", timeout=90)

    def _start_controller_manager(self) -> None:
        # With kubelets, Ready comes from their leases (renewed every 5 s): NotReady after 20 s.
        grace = ["--node-monitor-grace-period", "20s"] if self.kubelets else []
        self._spawn("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), "--kubeconfig", str(self.kubeconfig),
            "--authentication-kubeconfig", str(self.kubeconfig), "--authorization-kubeconfig", str(self.kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--service-account-private-key-file", str(self.sa_key), "--root-ca-file", str(self.ca[1]),
            "--use-service-account-credentials=true", "--leader-elect=false",
            "--cluster-signing-cert-file", str(self.ca[1]), "--cluster-signing-key-file", str(self.ca[0]),
            "--controllers", "*,-csrsigning,-csrapproving,-csrcleaner,-bootstrapsigner,-tokencleaner",
            "--concurrent-statefulset-syncs", "10",
            "--kube-api-qps", "200", "--kube-api-burst", "400", "--v=1", *grace,
        ])
        # The serviceaccount controller creates each namespace's default account once it runs.
        self._wait("kube-controller-manager", lambda: self.service_account_ready("kube-system"),
                   "ServiceAccounts", timeout=60)

    def _start_scheduler(self) -> None:
        """kube-scheduler, as every cluster runs it: the peer bind is measured against, and
        the placer of the default scheduler's pods (fillers, system pods)."""
        port = free_port()
        self._spawn("kube-scheduler", [
            str(BIN / "kube-scheduler"), "--kubeconfig", str(self.kubeconfig),
            "--authentication-kubeconfig", str(self.kubeconfig), "--authorization-kubeconfig", str(self.kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(port), "--leader-elect=false",
            "--kube-api-qps", "200", "--kube-api-burst", "400", "--v=1",
        ])
        self._wait("kube-scheduler", lambda: self._healthz(port), "/healthz", timeout=60)

    def _healthz(self, port: int) -> bool:
        context = ssl._create_unverified_context()  # its own self-signed serving certificate
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=2) as r:
            return r.read() == b"ok"

    def versions(self) -> list[str]:
        """What runs, as the components report it themselves."""
        server = json.loads(self.get("/version"))["gitVersion"]
        etcd = subprocess.run([str(ETCD), "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        return [f"kube-apiserver {server} (kube-controller-manager, kube-scheduler, kubectl the same build)",
                " ".join(etcd.replace("Version:", "").split())]

    def service_account_ready(self, namespace: str, name: str = "default") -> bool:
        """Pods are admitted only once their ServiceAccount exists (ServiceAccount admission)."""
        try:
            self.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
        return True

    def service_account_token(self, namespace: str, name: str, seconds: int = 24 * 3600,
                              audiences: list[str] | None = None) -> str:
        """A bound token for the account, from the TokenRequest API, as the kubelet projects
        one into a pod (token Secrets are no longer created since Kubernetes 1.24); with
        `audiences`, one issued for them, as Knative's sources request one for their sink."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": seconds, **({"audiences": audiences} if audiences else {})}}
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
        return json.loads(answer)["status"]["token"]

    def wait_namespace_ready(self, namespace: str, timeout: float = 30) -> None:
        """A namespace accepts pods only once its default ServiceAccount exists."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.service_account_ready(namespace):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"namespace {namespace}: no default ServiceAccount after {timeout}s")

    # -- nodes -----------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, check=check)

    def _node(self, name: str) -> dict:
        resources = {"cpu": "16", "memory": "64Gi", "pods": "2000", "nvidia.com/gpu": GPUS_PER_NODE}
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
                "status": {"capacity": resources, "allocatable": resources, "conditions": self._conditions()}}

    @staticmethod
    def _conditions(ready: bool = True) -> list[dict]:
        stamp = now()
        return [{"type": "Ready", "status": "True" if ready else "False",
                 "reason": "KubeletReady" if ready else "KubeletNotReady",
                 "message": "gpu-scheduler local control plane heartbeat",
                 "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]

    def add_node(self, name: str, ready: bool = True, spec: dict | None = None, gpus: str = GPUS_PER_NODE) -> dict:
        """One more Node, outside the heartbeat (it goes NotReady after the 40 s grace period)."""
        node = self._node(name)
        node["status"]["conditions"] = self._conditions(ready)
        node["status"]["capacity"]["nvidia.com/gpu"] = node["status"]["allocatable"]["nvidia.com/gpu"] = gpus
        node["spec"] = spec or {}
        return json.loads(self.request("POST", "/api/v1/nodes", node))

    def _create_nodes(self) -> None:
        for name in NODES:
            self.request("POST", "/api/v1/nodes", self._node(name))
        self.beat()
        self._heartbeat = threading.Thread(target=self._beat_forever, name="node-heartbeat", daemon=True)
        self._heartbeat.start()
        # New nodes carry the not-ready taint until the node-lifecycle controller sees them Ready.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            nodes = json.loads(self.get("/api/v1/nodes"))["items"]
            if all(not n["spec"].get("taints") for n in nodes):
                return
            time.sleep(0.5)
        raise ProcessFailed("nodes still tainted after 60s:\n" + self.log_tail("kube-controller-manager"))

    def beat(self) -> None:
        for name in NODES:
            self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": self._conditions()}},
                         "application/strategic-merge-patch+json")

    def _beat_forever(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.beat()
            except OSError:
                pass
