"""Real nodes for the local stack: per node a kubelet (the control plane's version) and its own
containerd (Debian trixie's 1.7, with bookworm's runc and CNI plugins; localcp/build-node.sh),
which run the pods that bind places. A kubelet removes sandboxes it does not know, so nodes share
nothing.

Each node also runs Kubernetes' own DRA test driver (localcp/build-dra.sh, at the control plane's
version) as its DRA kubelet plugin where resource.k8s.io/v1 is served (1.34 and later,
cluster.DRA_SERVED; before, the nodes run no driver and there is no ResourceSlice), with the
kubelet's credentials (the Node authorizer lets a node manage its own ResourceSlices and read the
claims of its pods): it publishes one ResourceSlice for the node, pool
<node>, devices device-00..device-03 (as many as the node's nvidia.com/gpu; no attributes), and
prepares a claim allocated on them by writing a CDI spec into the node's CDI directory, which
containerd (enable_cdi) applies to the container: env claim_<claim>_<request>=true. One
DeviceClass, DRA_DRIVER, selects its devices.

Each node keeps everything it changes to itself, and nothing outlives the stack:
- A mount namespace per node (a holder process; containerd and the kubelet enter it). It has
  private tmpfs over /run, /var/log and /var/lib (shim sockets, runc state, pod network
  namespaces, the kubelet's /var/log/containers links, the CNI result cache in /var/lib/cni) and, bind-mounted over the kernel tunables the kubelet
  would otherwise set machine-wide (vm.overcommit_memory, kernel.panic, ...), files holding the
  values it wants. Every mount dies with the namespace.
- A network namespace per node (the holder's), the node's own, as on a real node: the kubelet,
  containerd, the DRA driver, kube-proxy and the host ends of the pods' ptp veth pairs (their
  gateway, and the IP forwarding) share it. localcp/network.py joins it to the stack's fabric
  (eth0, with the node's address 10.240.0.(10+N)) and routes the other nodes' pod ranges. The
  kubelet probes pods from there, directly; kube-proxy (nftables mode) gives the pods and the node
  the Service addresses; CoreDNS (a Deployment of kube-system, localcp/coredns.py) answers the
  kubelet's --cluster-dns.
- Its own directory under the stack's run directory: containerd root, state, socket, config,
  CNI configuration and IPAM state, CDI specs, the kubelet's root (with the DRA driver's sockets),
  pod logs and certificates.
- Its own cgroup root (/gpu-scheduler-<run>-<node> in each v1 hierarchy), created before the
  kubelet starts and removed after everything stopped.
- Its address on the node network: the kubelet listens there (port 10250, the usual one: each
  node has its own namespace), and registers it as the Node's InternalIP, which the API server
  dials through its egress (localcp/podnet.py) for logs, exec and port-forward.

Stopping: pods are deleted through the API first (workload controllers first, so nothing comes
back), then each kubelet, its DRA driver, its kube-proxy, what containerd still runs, containerd itself, any shim of ours,
the holder (mounts, network namespaces, veths), and the cgroups. leftovers() lists what would
remain; the tests require it to be empty.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path

from . import coredns, images, network, pki
from .cluster import BIN, CACHE, DRA_SERVED, KUBERNETES_VERSION, NODES, ControlPlane, ProcessFailed

NODE_BIN = images.NODE_DIR / "bin"  # runc
CNI_BIN = images.NODE_DIR / "cni"
CONTAINERD_BIN = CACHE / "containerd-trixie" / "bin"  # containerd, its shim, ctr: localcp/build-node.sh
GPUS = "4"
DRA_DRIVER = "test-driver.cdi.k8s.io"  # the test driver's default name; also its DeviceClass's
DRA_DRIVER_BIN = CACHE / f"dra-test-driver-{KUBERNETES_VERSION}" / "bin" / "dra-test-driver"  # localcp/build-dra.sh
KUBE_PROXY = BIN / "kube-proxy"  # the control plane's build: localcp/build-network.sh
NFT_BIN = CACHE / "nftables-bookworm" / "bin"  # nft, a wrapper that finds Debian's libraries: localcp/build-network.sh
# The values the kubelet wants (pkg/kubelet/cm: setupKernelTunables); it sets them machine-wide
# unless they already read so.
KERNEL_TUNABLES = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
PRIVATE_TMPFS = ("/run", "/var/log", "/var/lib")
WORKLOADS = "statefulsets,deployments,replicasets,daemonsets,jobs"


def device_class(name: str = DRA_DRIVER) -> dict:
    """The DeviceClass of the DRA test driver's devices."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]}}


def node_addresses(names=NODES) -> dict[str, str]:
    """node1 -> 10.240.0.11, ...: each node's address on the node network (localcp/network.py)."""
    return {name: network.node_address(i + 1) for i, name in enumerate(names)}


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (the kubelet needs its root in each); on cgroup v2 the
    unified one."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(fields[4]))
    return found


@dataclass
class Leftovers:
    processes: list[str]
    mounts: list[str]
    cgroups: list[str]
    interfaces: list[str]
    namespaces: list[str]

    def __bool__(self) -> bool:
        return any((self.processes, self.mounts, self.cgroups, self.interfaces, self.namespaces))


class Node:
    def __init__(self, cp: ControlPlane, name: str, address: str, index: int, pause: images.Image):
        self.cp, self.name, self.address, self.index, self.pause = cp, name, address, index, pause
        self.dir = cp.workdir / "nodes" / name
        self.socket = self.dir / "containerd.sock"
        self.cgroup_root = f"/gpu-scheduler-{cp.workdir.name}-{name}"
        self.kubelet_port = 10250
        self.holder: subprocess.Popen | None = None

    # -- names of its processes in cp.processes ------------------------------------------------
    @property
    def kubelet(self) -> str:
        return f"kubelet-{self.name}"

    @property
    def containerd(self) -> str:
        return f"containerd-{self.name}"

    @property
    def dra(self) -> str:
        return f"dra-{self.name}"

    @property
    def proxy(self) -> str:
        return f"kube-proxy-{self.name}"

    def kubelet_running(self) -> bool:
        process = self.cp.processes.get(self.kubelet)
        return process is not None and process.poll() is None

    # -- start -----------------------------------------------------------------------------------
    def start_runtime(self, loaded: list[images.Image]) -> None:
        for sub in ("sysctl", "cni-bin", "cni-conf", "cni-ipam", "cdi", "kubelet", "pod-logs", "volume-plugins"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._start_holder()
        self._make_cgroups()
        self._write_cni()
        self._start_containerd()
        for archive, unpack in dict.fromkeys((image.archive, image.unpack) for image in loaded):  # an archive may hold several
            self.ctr("images", "import", "--snapshotter", "overlayfs", *(() if unpack else ("--no-unpack",)), str(archive))

    def _start_holder(self) -> None:
        mounts = [f"mount -t tmpfs -o mode=755 gpu-scheduler-{self.name} {p}" for p in PRIVATE_TMPFS]
        for tunable, value in KERNEL_TUNABLES.items():
            fake = self.dir / "sysctl" / tunable.replace("/", ".")
            fake.write_text(value + "\n")
            mounts.append(f"mount --bind {fake} /proc/sys/{tunable}")
        ready = self.dir / "holder.ready"
        script = " && ".join(["set -e", *mounts, "ip link set lo up", f"touch {ready}", "exec sleep infinity"])
        self.holder = self.cp._spawn(f"node-{self.name}", [
            "unshare", "--mount", "--propagation", "slave", "--net", "--", "sh", "-c", script])
        self.cp._wait(f"node-{self.name}", ready.exists, "mount and network namespace", timeout=10)
        self.cp.fabric.attach(self.name, self.index, self.netns)

    def _in_namespace(self, argv: list[str]) -> list[str]:
        """argv run in the node's mount and network namespaces."""
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", f"--net={self.netns}", "--", *argv]

    def _make_cgroups(self) -> None:
        for hierarchy in cgroup_hierarchies():
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            for inherited in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset children start empty
                if (path / inherited).exists():
                    (path / inherited).write_text((hierarchy / inherited).read_text())

    def _write_cni(self) -> None:
        cni_bin = self.dir / "cni-bin"
        for plugin in ("ptp", "host-local", "loopback"):
            target = cni_bin / plugin
            if not target.exists():
                target.symlink_to(CNI_BIN / plugin)
        # containerd runs in the node's namespace, so ptp puts the host ends of its veth pairs,
        # their gateway addresses and forwarding there. A pod's default route is its gateway, as
        # with any CNI; the node has no default route, so nothing goes past the cluster network.
        (self.dir / "cni-conf" / "10-ptp.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": f"gpu-scheduler-{self.name}",
            "plugins": [{"type": "ptp", "ipMasq": False, "ipam": {
                "type": "host-local", "dataDir": str(self.dir / "cni-ipam"),
                "ranges": [[{"subnet": self.pod_range}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}))

    @property
    def pod_range(self) -> str:
        return network.pod_range(self.index)

    @property
    def netns(self) -> str:
        """The node's network namespace (its holder's), while the node runs."""
        return f"/proc/{self.holder.pid}/ns/net"

    def _start_containerd(self) -> None:
        d = self.dir
        config = d / "containerd.toml"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config.write_text(f"""version = 2
root = "{d / 'containerd-root'}"
state = "{d / 'containerd-state'}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{self.pause.name}"
  # This machine forbids lowering oom_score_adj (the pause container asks for -998).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # The DRA driver's CDI specs (claim env), written into the node's own directory.
  enable_cdi = true
  cdi_spec_dirs = ["{d / 'cdi'}"]
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{NODE_BIN / 'runc'}"
        Root = "{d / 'runc'}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{d / 'cni-bin'}"
    conf_dir = "{d / 'cni-conf'}"
""")
        env = {**os.environ, "PATH": f"{CONTAINERD_BIN}:{NODE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.cp._spawn(self.containerd, self._in_namespace([str(CONTAINERD_BIN / "containerd"), "--config", str(config)]),
                       env=env)
        self.cp._wait(self.containerd, lambda: self.ctr("version", check=False).returncode == 0, "its socket", 30)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(CONTAINERD_BIN / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, check=check)

    def _cluster_kubeconfig(self, name: str, subject: str) -> Path:
        """A kubeconfig for what runs on this node: a client certificate for `subject`, and the API
        server's address on the node network."""
        key, crt = pki.make_cert(self.dir, f"{name}-client", self.cp.ca, subject, client=True)
        kubeconfig = self.dir / f"{name}.kubeconfig"
        kubeconfig.write_text(self.cp.kubeconfig_text(user={"client-certificate": str(crt), "client-key": str(key)},
                                                      server=self.cp.cluster_server))
        return kubeconfig

    def _kubelet_files(self) -> tuple[Path, Path]:
        d = self.dir
        kubeconfig = self._cluster_kubeconfig("kubelet", f"/O=system:nodes/CN=system:node:{self.name}")
        config = d / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.address, "port": self.kubelet_port, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.ca[1])}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root, "failCgroupV1": False,
            "failSwapOn": False, "oomScoreAdj": 0, "resolvConf": "",
            # CoreDNS's kube-dns Service, as kubeadm configures every kubelet.
            "clusterDNS": [network.CLUSTER_DNS], "clusterDomain": network.CLUSTER_DOMAIN,
            "podLogsDir": str(d / "pod-logs"), "volumePluginDir": str(d / "volume-plugins"),
            # Fast enough for tests: status every 4 s, lease renewed every 5 s (20 s / 4).
            "nodeStatusUpdateFrequency": "4s", "nodeLeaseDurationSeconds": 20, "syncFrequency": "10s",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "serializeImagePulls": False,
        }, indent=1))
        return kubeconfig, config

    def start_kubelet(self) -> None:
        kubeconfig, config = self.dir / "kubelet.kubeconfig", self.dir / "kubelet.yaml"
        if not config.exists():
            kubeconfig, config = self._kubelet_files()
        self.cp._spawn(self.kubelet, self._in_namespace([
            str(BIN / "kubelet"), "--config", str(config), "--kubeconfig", str(kubeconfig),
            "--root-dir", str(self.dir / "kubelet"), "--hostname-override", self.name,
            "--node-ip", self.address, "--v=1"]))

    def stop_kubelet(self) -> None:
        self.cp._terminate(self.kubelet)

    # -- kube-proxy ------------------------------------------------------------------------------
    def start_proxy(self) -> None:
        """The real kube-proxy (the control plane's build) in the node's namespace, nftables mode
        with Debian's nft, as the user kubeadm gives it (system:kube-proxy, bound by default to
        system:node-proxier). It leaves the conntrack settings as they are (maxPerCore 0, no
        timeouts), which are the machine's, and keeps its OOM score (the machine forbids lowering
        it)."""
        kubeconfig = self._cluster_kubeconfig("kube-proxy", "/CN=system:kube-proxy")
        config = self.dir / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "nftables", "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name, "clusterCIDR": network.CLUSTER_CIDR,
            "bindAddress": self.address, "healthzBindAddress": f"{self.address}:10256",
            "metricsBindAddress": "127.0.0.1:10249", "oomScoreAdj": 0,
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }, indent=1))
        env = {**os.environ, "PATH": f"{NFT_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.cp._spawn(self.proxy, self._in_namespace([str(KUBE_PROXY), "--config", str(config),
                                                       "--v=1"]), env=env)

    def proxy_ready(self) -> bool:
        """kube-proxy has written the kubernetes Service's address into its nftables map."""
        done = subprocess.run(network.in_netns(self.netns, [str(NFT_BIN / "nft"), "list", "map", "ip",
                                                            "kube-proxy", "service-ips"]),
                              capture_output=True, text=True)
        return done.returncode == 0 and network.KUBERNETES_SERVICE[0] in done.stdout

    def proxy_running(self) -> bool:
        process = self.cp.processes.get(self.proxy)
        return process is not None and process.poll() is None

    def start_dra(self, devices: int = int(GPUS)) -> None:
        """The DRA test driver as this node's kubelet plugin: its registration socket in the
        kubelet's plugins_registry, its DRA socket in plugins/<driver>, CDI specs in cdi/. It
        talks to the API server as the node (the kubelet's kubeconfig)."""
        kubelet_root = self.dir / "kubelet"
        for sub in ("plugins_registry", f"plugins/{DRA_DRIVER}"):
            (kubelet_root / sub).mkdir(parents=True, exist_ok=True)
        self.cp._spawn(self.dra, self._in_namespace([
            str(DRA_DRIVER_BIN), "--kubeconfig", str(self.dir / "kubelet.kubeconfig"), "--v=3",
            "kubelet-plugin", "--node-name", self.name, "--num-devices", str(devices),
            "--cdi-dir", str(self.dir / "cdi"), "--datadir", str(kubelet_root / "plugins"),
            "--plugin-registration-path", str(kubelet_root / "plugins_registry")]))

    def dra_running(self) -> bool:
        process = self.cp.processes.get(self.dra)
        return process is not None and process.poll() is None

    # -- stop ------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stop_kubelet()
        self.cp._terminate(self.proxy)
        self.cp._terminate(self.dra)  # after the kubelet: it unprepares claims of pods it stops
        if self.holder is None:
            return
        if self.cp.processes.get(self.containerd) and self.cp.processes[self.containerd].poll() is None:
            self._remove_containers()
        self.cp._terminate(self.containerd)
        for pid in self._shims():
            os.kill(pid, signal.SIGKILL)
        self.cp._terminate(f"node-{self.name}")
        self._remove_cgroups()

    def _remove_containers(self) -> None:
        """What the kubelet left running (it was stopped before its pods were gone): kill and
        remove, so no shim outlives containerd."""
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 10
        for task in tasks:
            while self.ctr("tasks", "delete", task, check=False).returncode != 0 and time.monotonic() < deadline:
                time.sleep(0.2)
        containers = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        if containers:
            self.ctr("containers", "rm", *containers, check=False)

    def _shims(self) -> list[int]:
        return [pid for pid, argv in processes() if "containerd-shim" in argv and str(self.socket) in argv]

    def _remove_cgroups(self) -> None:
        for hierarchy in cgroup_hierarchies():
            root = hierarchy / self.cgroup_root.lstrip("/")
            if not root.exists():
                continue
            for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                _rmdir_cgroup(path)
            _rmdir_cgroup(root)


def _rmdir_cgroup(path: Path) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # a process that just exited is still being removed from it


def processes() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                pass
    return found


def _cgroup(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


class Nodes:
    """node1..node4 as real nodes of one control plane."""

    def __init__(self, cp: ControlPlane, names=NODES, extra_images: tuple[images.Image, ...] = ()):
        self.cp = cp
        self.pause = images.pause_image()
        self.check = images.check_image()
        self.coredns = coredns.coredns_image()
        self.extra_images = list(extra_images)
        self.nodes = {name: Node(cp, name, address, i + 1, self.pause)
                      for i, (name, address) in enumerate(node_addresses(names).items())}

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def start(self, timeout: float = 90, wait_dns: bool = True) -> "Nodes":
        """wait_dns=False: CoreDNS is applied but not waited for; the caller calls wait_dns() once
        it has started what it starts next (its readiness probe runs every 10 s, kubeadm's)."""
        began = time.monotonic()
        try:
            errors: list[BaseException] = []

            def runtime(node: Node) -> None:
                try:
                    node.start_runtime([self.pause, self.check, self.coredns, *self.extra_images])
                except BaseException as error:  # reported below, after the others finished
                    errors.append(error)
            threads = [threading.Thread(target=runtime, args=(n,)) for n in self.nodes.values()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            if not KUBE_PROXY.exists():
                raise FileNotFoundError(f"kube-proxy for {KUBERNETES_VERSION} is not built ({KUBE_PROXY}):"
                                        " run bash localcp/build-network.sh")
            for node in self.nodes.values():
                node.start_kubelet()
                node.start_proxy()
            self.wait_ready(timeout)
            self.apply_dns()  # its pods start while kube-proxy syncs: they retry the API until it has
            self.wait_proxies(timeout)
            if DRA_SERVED:
                self.start_dra()
            if wait_dns:
                self.wait_dns(timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - began  # containerds up, images loaded, kubelets Ready, slices out (DNS)
        return self

    # -- the cluster network ---------------------------------------------------------------------
    def wait_proxies(self, timeout: float = 60) -> None:
        """Every node's kube-proxy has synced the Services (the kubernetes one in its map)."""
        deadline = time.monotonic() + timeout
        while not all(node.proxy_ready() for node in self.nodes.values()):
            for node in self.nodes.values():
                if not node.proxy_running():
                    raise ProcessFailed(f"{node.proxy} exited:\n{self.cp.log_tail(node.proxy)}")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"kube-proxy not synced after {timeout}s:\n" +
                                    "\n".join(self.cp.log_tail(n.proxy, 10) for n in self.nodes.values()))
            time.sleep(0.3)

    def apply_dns(self) -> None:
        """CoreDNS as kubeadm installs it (localcp/coredns.py)."""
        manifests = coredns.manifests(self.coredns.name, network.CLUSTER_DNS, network.CLUSTER_DOMAIN)
        self.cp.kubectl("apply", "-f", "-", input="\n".join(json.dumps(m) for m in manifests))

    def wait_dns(self, timeout: float = 90) -> None:
        """CoreDNS Ready: kube-dns has a ready endpoint for each replica."""
        deadline = time.monotonic() + timeout
        while len(self.dns_endpoints()) < coredns.REPLICAS:
            if time.monotonic() > deadline:
                pods = self.cp.kubectl("get", "pods", "-n", "kube-system", "-o", "wide", check=False).stdout
                events = self.cp.kubectl("get", "events", "-n", "kube-system", check=False).stdout
                raise ProcessFailed(f"CoreDNS not ready after {timeout}s:\n{pods}\n{events[-3000:]}")
            time.sleep(0.5)

    def dns_endpoints(self) -> list[str]:
        slices = json.loads(self.cp.get("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"
                                        "?labelSelector=kubernetes.io/service-name=kube-dns"))["items"]
        return sorted({e["addresses"][0] for s in slices for e in s.get("endpoints") or []
                       if e.get("conditions", {}).get("ready")})

    # -- DRA -----------------------------------------------------------------------------------
    def start_dra(self, timeout: float = 30) -> None:
        """The DRA test driver on every node, its DeviceClass, and each node's ResourceSlice
        published (the drivers start once the nodes exist: a slice's owner is its Node)."""
        if not DRA_DRIVER_BIN.exists():
            raise FileNotFoundError(f"the DRA test driver for {KUBERNETES_VERSION} is not built ({DRA_DRIVER_BIN}):"
                                    " run bash localcp/build-dra.sh")
        for node in self.nodes.values():
            node.start_dra()
        try:
            self.cp.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class())
        except urllib.error.HTTPError as error:
            if error.code != 409:
                raise
        deadline = time.monotonic() + timeout
        while set(self.resource_slices()) != set(self.nodes):
            for node in self.nodes.values():
                if not node.dra_running():
                    raise ProcessFailed(f"{node.dra} exited:\n{self.cp.log_tail(node.dra)}")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"ResourceSlices of {DRA_DRIVER}: only {sorted(self.resource_slices())} after "
                                    f"{timeout}s:\n" + "\n".join(self.cp.log_tail(n.dra, 10) for n in self.nodes.values()))
            time.sleep(0.3)

    def resource_slices(self) -> dict[str, list[str]]:
        """node -> the names of the devices the DRA driver publishes for it."""
        slices = json.loads(self.cp.get("/apis/resource.k8s.io/v1/resourceslices"))["items"]
        found: dict[str, list[str]] = {}
        for item in slices:
            spec = item["spec"]
            if spec["driver"] == DRA_DRIVER and spec.get("nodeName") in self.nodes:
                found.setdefault(spec["nodeName"], []).extend(d["name"] for d in spec.get("devices") or [])
        return found

    def node(self, name: str) -> dict:
        return json.loads(self.cp.get(f"/api/v1/nodes/{name}"))

    def ready(self, name: str) -> bool:
        try:
            node = self.node(name)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
        conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
        return conditions.get("Ready") == "True" and not node["spec"].get("taints")

    def wait_ready(self, timeout: float = 90, names=None) -> None:
        """Registered, Ready by the kubelet's own report, untainted by the node-lifecycle
        controller, and advertising its GPUs."""
        names = list(names or self.nodes)
        deadline = time.monotonic() + timeout
        advertised: set[str] = set()
        while time.monotonic() < deadline:
            for name in names:
                node = self.nodes[name]
                if not node.kubelet_running():
                    raise ProcessFailed(f"{node.kubelet} exited:\n{self.cp.log_tail(node.kubelet)}")
                if name not in advertised and self._registered(name):
                    self.advertise_gpus(name)
                    advertised.add(name)
            if len(advertised) == len(names) and all(self.ready(n) for n in names):
                return
            time.sleep(0.3)
        raise ProcessFailed(f"nodes {names} not Ready after {timeout}s:\n" +
                            "\n".join(self.cp.log_tail(self.nodes[n].kubelet, 10) for n in names))

    def _registered(self, name: str) -> bool:
        try:
            self.node(name)
            return True
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise

    def advertise_gpus(self, name: str, count: str = GPUS) -> None:
        """The documented way to advertise an extended resource: a PATCH of the node's status
        capacity (the kubelet derives allocatable). A real GPU node's device plugin does this."""
        self.cp.request("PATCH", f"/api/v1/nodes/{name}/status",
                        [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": count}],
                        "application/json-patch+json")

    def restart_kubelet(self, name: str, timeout: float = 60) -> None:
        node = self.nodes[name]
        node.start_kubelet()
        self.wait_ready(timeout, names=[name])

    # -- stop --------------------------------------------------------------------------------------
    def delete_pods(self, timeout: float = 60) -> None:
        """Every workload and pod, through the API, while the kubelets still run: they stop the
        containers and tear their networks down. Pods of a node whose kubelet is stopped are
        removed by force (no kubelet will confirm them)."""
        self.cp.kubectl("delete", WORKLOADS, "--all", "--all-namespaces", "--wait=false", check=False)
        self.cp.kubectl("delete", "pods", "--all", "--all-namespaces", "--wait=false", check=False)
        deadline = time.monotonic() + timeout
        while True:
            pods = json.loads(self.cp.get("/api/v1/pods"))["items"]
            if not pods:
                return
            for pod in pods:
                node = self.nodes.get(pod["spec"].get("nodeName", ""))
                if node is None or not node.kubelet_running() or time.monotonic() > deadline:
                    self.cp.kubectl("delete", "pod", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"],
                                    "--grace-period=0", "--force", "--wait=false", check=False)
            if time.monotonic() > deadline + 10:
                return
            time.sleep(0.3)

    def stop(self) -> None:
        if "kube-apiserver" in self.cp.processes and self.cp.processes["kube-apiserver"].poll() is None:
            try:
                self.delete_pods()
            except OSError:
                pass
        for node in self.nodes.values():
            node.stop_kubelet()
        for node in self.nodes.values():
            node.stop()

    def leftovers(self) -> Leftovers:
        """What of these nodes is still on the machine: processes, mounts, cgroups, network
        interfaces and namespaces (pods' and the nodes' own)."""
        run = str(self.cp.workdir / "nodes")
        roots = [n.cgroup_root for n in self.nodes.values()]
        mine = [f"{pid} {argv}" for pid, argv in processes() if run in argv or any(r in _cgroup(pid) for r in roots)]
        mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if run in line or "gpu-scheduler-node" in line]
        cgroups = [str(h / n.cgroup_root.lstrip("/")) for h in cgroup_hierarchies() for n in self.nodes.values()
                   if (h / n.cgroup_root.lstrip("/")).exists()]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout if shutil.which("ip") else ""
        interfaces = [line for line in links.splitlines() if "veth" in line]
        holders = [n.holder.pid for n in self.nodes.values() if n.holder]
        namespaces = [f"node holder {pid}" for pid in holders if Path(f"/proc/{pid}").exists()]
        fabric = self.cp.fabric.holder if self.cp.fabric else None
        if fabric is not None and Path(f"/proc/{fabric.pid}").exists() and fabric.poll() is None:
            namespaces.append(f"fabric holder {fabric.pid}")
        return Leftovers(mine, mounts, cgroups, interfaces, namespaces)
