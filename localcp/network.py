"""The local stack's cluster network: the network a node of a real cluster has, with nothing added
to the machine's own network namespace (no interface, address or route there), so that no packet
to the node, pod or Service ranges can leave the machine.

    node network  10.240.0.0/24   the fabric 10.240.0.1 (the control plane's address), nodeN 10.240.0.(10+N)
    pod ranges    10.244.N.0/24   nodeN's pods (the ptp CNI plugin, host-local IPAM)
    Services      10.96.0.0/16    kube-proxy on every node; kubernetes 10.96.0.1, kube-dns 10.96.0.10

- The fabric: a network namespace of the stack's own (a holder process, `unshare --net`) with a
  bridge, br0, holding 10.240.0.1/24 and a route to each node's pod range via that node. It stands
  for the switch a cluster's machines hang on, and for the control plane's machine on it.
- Each node (localcp/nodes.py) has its own network namespace, where its kubelet, containerd, DRA
  driver, kube-proxy and its pods' gateway (the host ends of the ptp veth pairs) live, as on a real
  node. attach() joins it to the fabric with a veth pair: eth0 in the node with the node's address,
  the other end on br0; the node routes every other node's pod range via that node, the Service
  range to the fabric (for kube-proxy's DNAT of its own connections), and forwards. It has no
  default route: a packet for anywhere else is unreachable there.
- The control plane stays in the machine's namespace (the tests and kubectl reach it on loopback);
  localcp/podnet.py joins the two sides, the one process that holds sockets on both:
  - the API server's address on the node network: a listener on 10.240.0.1:<its port> in the
    fabric, relaying to its loopback port. The API server advertises 10.240.0.1 (its lease
    endpoint reconciler writes it into the kubernetes Service's endpoints), so kube-proxy sends
    10.96.0.1:443 there, and the kubelets and kube-proxies are configured with it;
  - the API server's egress (kube-apiserver --egress-selector-config-file: HTTP CONNECT over a
    Unix socket), dialled from the fabric: kubelets (logs, exec, port-forward) and webhooks in pods;
    a konnectivity server and agent do this in many clusters, but none is served at an exact
    version that builds here with the control plane's, and the CONNECT proxy is what the egress
    selector speaks to them too.

The real components: kube-proxy (k8s.io/kubernetes/cmd/kube-proxy, the control plane's build, in
nftables mode with Debian's nft; localcp/build-network.sh) on every node, and CoreDNS
(localcp/coredns.py) as a Deployment in kube-system behind the kube-dns Service, as kubeadm
installs it; every kubelet has --cluster-dns 10.96.0.10 and the domain cluster.local.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path


NODE_NETWORK = "10.240.0.0/24"
FABRIC_ADDRESS = "10.240.0.1"  # the control plane's address on the node network
CLUSTER_CIDR = "10.244.0.0/16"  # every node's pod range
SERVICE_RANGE = "10.96.0.0/16"  # kube-apiserver --service-cluster-ip-range
KUBERNETES_SERVICE = ("10.96.0.1", 443)  # the first address of the Service range
CLUSTER_DNS = "10.96.0.10"  # kubeadm's choice: the tenth address of the Service range
CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "br0"


def node_address(index: int) -> str:
    """nodeN's address on the node network (N from 1)."""
    return f"10.240.0.{10 + index}"


def pod_range(index: int) -> str:
    return f"10.244.{index}.0/24"


def in_netns(netns: str, argv: list[str]) -> list[str]:
    return ["nsenter", f"--net={netns}", "--", *argv]


def ip(netns: str, *args: str) -> None:
    done = subprocess.run(in_netns(netns, ["ip", *args]), capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)} in {netns}: {done.stderr.strip()}")


class Fabric:
    """The fabric namespace and the links of the nodes to it (see the module's docstring)."""

    def __init__(self, cp):
        self.cp = cp
        self.dir = cp.workdir / "network"
        self.holder = None
        self.nodes: dict[str, tuple[int, str]] = {}  # name -> (index, network namespace), attached
        self._attaching = threading.Lock()  # nodes start in parallel; each adds routes to the others

    @property
    def netns(self) -> str:
        return f"/proc/{self.holder.pid}/ns/net"

    def start(self) -> "Fabric":
        self.dir.mkdir(parents=True, exist_ok=True)
        ready = self.dir / "fabric.ready"
        script = " && ".join([
            "set -e", "ip link set lo up", f"ip link add name {BRIDGE} type bridge",
            f"ip address add {FABRIC_ADDRESS}/24 dev {BRIDGE}", f"ip link set {BRIDGE} up",
            f"touch {ready}", "exec sleep infinity"])
        self.holder = self.cp._spawn("fabric", ["unshare", "--net", "--", "sh", "-c", script])
        self.cp._wait("fabric", ready.exists, "its namespace and bridge", timeout=10)
        return self

    def attach(self, name: str, index: int, node_netns: str) -> None:
        """nodeN's namespace joined to the fabric: eth0 there with the node's address, its peer on
        the bridge; routes both ways for every node's pod range."""
        with self._attaching:
            self._attach(name, index, node_netns)

    def _attach(self, name: str, index: int, node_netns: str) -> None:
        host_end = f"veth-{name}"[:15]
        ip(self.netns, "link", "add", "name", host_end, "type", "veth", "peer", "name", "eth0",
           "netns", node_netns.split("/")[2])
        ip(self.netns, "link", "set", host_end, "master", BRIDGE, "up")
        ip(self.netns, "route", "add", pod_range(index), "via", node_address(index))
        ip(node_netns, "address", "add", f"{node_address(index)}/24", "dev", "eth0")
        ip(node_netns, "link", "set", "eth0", "up")
        # /proc/sys/net is the opener's namespace's: this is the node's forwarding, not the machine's.
        subprocess.run(in_netns(node_netns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]), check=True,
                       capture_output=True)
        # The Service range toward the fabric, as a real node's default route takes it: a node's own
        # process (a host-network pod, the stack's doors) then reaches a ClusterIP, kube-proxy's
        # DNAT rewriting it after this route is chosen. Without one, connect() fails at once
        # (Network is unreachable). An address no Service has goes on to the fabric, which routes
        # it nowhere: nothing leaves the machine.
        ip(node_netns, "route", "add", SERVICE_RANGE, "via", FABRIC_ADDRESS)
        for other_index, other_netns in self.nodes.values():
            ip(node_netns, "route", "add", pod_range(other_index), "via", node_address(other_index))
            ip(other_netns, "route", "add", pod_range(index), "via", node_address(index))
        self.nodes[name] = (index, node_netns)

    def stop(self) -> None:
        self.cp._terminate("fabric")


def start_podnet(cp, fabric: Fabric) -> None:
    """localcp/podnet.py's control-plane links: the API server on the node network, and its egress."""
    config, ready = fabric.dir / "podnet.json", fabric.dir / "podnet.ready"
    config.write_text(json.dumps({
        "apiserver_port": cp.api_port, "fabric": fabric.netns, "listen": [FABRIC_ADDRESS, cp.api_port],
        "egress_socket": str(cp.egress_socket), "ready": str(ready)}))
    cp._spawn("podnet", [sys.executable, "-m", "localcp.podnet", str(config)],
              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    cp._wait("podnet", ready.exists, "its listeners", timeout=20)


def egress_configuration(socket: Path) -> str:
    """kube-apiserver's --egress-selector-config-file: its connections to the cluster (kubelets,
    webhook Services) as HTTP CONNECTs over localcp/podnet.py's Unix socket."""
    return json.dumps({
        "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
        "egressSelections": [{"name": "cluster", "connection": {
            "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(socket)}}}}]})
