"""The links between the machine's network namespace, where the control plane runs, and the
cluster network of the local stack (localcp/network.py): one small process that holds sockets on
both sides and relays bytes between them, as a control plane's machine does by being on the
node network. It connects only to the machine's loopback and to node and pod addresses dialled
inside the fabric namespace (or, for a door, to a Service's address inside a node's namespace,
where kube-proxy resolves it); any other destination is refused. Nothing is added to the machine's
own network namespace: no interface, address or route.

- The API server on the node network: a listener on 10.240.0.1:<port> in the fabric namespace,
  relaying to the API server's loopback port. The kubelets and kube-proxies are configured with
  this address, and the kubernetes Service's endpoint is it (kube-proxy DNATs 10.96.0.1:443 there).
- The API server's egress (kube-apiserver --egress-selector-config-file, egress `cluster`,
  HTTPConnect over a Unix socket): the API server sends `CONNECT host:port`; a node or pod
  address is dialled in the fabric, a loopback one on the machine. With
  --enable-aggregator-routing the API server resolves a webhook's Service to a ready endpoint
  itself, so mutate is reached through its Service. What a konnectivity server and agent do.
- Doors (a second process, `doors` in its configuration): a loopback port of the machine relaying
  each connection to a Service's ClusterIP, dialled inside a node's namespace: the way in for what
  runs on the machine and sends to a Service in the cluster (the receive adapter's tap, to bind),
  as `kubectl port-forward` is for a user. kube-proxy picks the endpoint.

    python -m localcp.podnet CONFIG.json     (localcp/network.py and LocalStack write it and start it)
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import socket
import sys
import threading
from pathlib import Path

from localcp import network

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
# The node network and the pod ranges: what the egress dials in the fabric.
CLUSTER_NETWORKS = tuple(ipaddress.ip_network(n) for n in (network.NODE_NETWORK, network.CLUSTER_CIDR))


def log(message: str) -> None:
    print(message, flush=True)


def socket_in(netns: str | None, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A TCP socket of the network namespace at `netns` (None: this process's). setns moves only
    the calling thread, which moves straight back: a socket stays in the namespace it was made in."""
    if netns is None:
        return socket.socket(socket.AF_INET, kind)
    with open("/proc/thread-self/ns/net") as own, open(netns) as target:
        if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
        try:
            return socket.socket(socket.AF_INET, kind)
        finally:
            if _libc.setns(own.fileno(), CLONE_NEWNET) != 0:
                os._exit(70)  # this thread would go on in a namespace it must not use


def relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until both sides have finished; then both sockets are closed."""
    def one_way(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    other = threading.Thread(target=one_way, args=(b, a), daemon=True)
    other.start()
    one_way(a, b)
    other.join()
    a.close()
    b.close()


def serve(listener: socket.socket, handle, name: str) -> None:
    def loop() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_guarded, args=(handle, conn, name), daemon=True).start()
    threading.Thread(target=loop, name=name, daemon=True).start()


def _guarded(handle, conn: socket.socket, name: str) -> None:
    try:
        handle(conn)
    except OSError as error:
        log(f"{name}: {error}")
        conn.close()


class PodNetwork:
    def __init__(self, config: dict):
        self.config = config
        self.apiserver = ("127.0.0.1", config.get("apiserver_port", 0))
        self.fabric = config.get("fabric", "")

    def dial(self, host: str, port: int, netns: str | None = None) -> socket.socket:
        """A connection to a node or pod address (in the fabric) or the machine's loopback;
        PermissionError for anything else. netns: dial there instead (a door's node)."""
        address = ipaddress.ip_address(host)
        if netns is None:
            if address.is_loopback:
                netns = None
            elif any(address in net for net in CLUSTER_NETWORKS) and self.fabric:
                netns = self.fabric
            else:
                raise PermissionError(f"{host} is neither on the node network, in a pod range nor loopback: refused")
        conn = socket_in(netns)
        conn.settimeout(5)
        conn.connect((str(address), port))
        conn.settimeout(None)
        return conn

    # -- the API server on the node network -------------------------------------------------------
    def apiserver_link(self, conn: socket.socket) -> None:
        relay(conn, self.dial(*self.apiserver))

    # -- the API server's egress -----------------------------------------------------------------
    def egress(self, conn: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request and len(request) < 8192:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            request += chunk
        line = request.split(b"\r\n", 1)[0].decode("latin-1")
        method, target, *_ = line.split() + ["", ""]
        host, _, port = target.rpartition(":")
        try:
            if method != "CONNECT" or not port.isdigit():
                raise PermissionError(f"not a CONNECT: {line!r}")
            upstream = self.dial(host.strip("[]"), int(port))
        except (OSError, ValueError) as error:
            log(f"egress {target}: {error}")
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            conn.close()
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        relay(conn, upstream)

    # -- doors: a Service's address, from the machine ----------------------------------------------
    def door(self, service: dict):
        """Each connection relayed to the Service's ClusterIP and port, dialled in a node's
        namespace (kube-proxy there chooses the endpoint)."""
        ipaddress.ip_address(service["cluster_ip"])  # a ClusterIP, never a name to resolve

        def handle(conn: socket.socket) -> None:
            relay(conn, self.dial(service["cluster_ip"], service["service_port"], netns=service["netns"]))
        return handle

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.fabric:
            listener = socket_in(self.fabric)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(tuple(self.config["listen"]))
            listener.listen(128)
            serve(listener, self.apiserver_link, "apiserver-link")
        if self.config.get("egress_socket"):
            egress = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            egress.bind(self.config["egress_socket"])
            egress.listen(128)
            serve(egress, self.egress, "egress")
        for service in self.config.get("doors", ()):
            listener = socket.socket()
            listener.bind(("127.0.0.1", service["port"]))
            listener.listen(64)
            serve(listener, self.door(service), f"door-{service['name']}")
        log("pod network links ready")


def main(path: str) -> None:
    config = json.loads(Path(path).read_text())
    PodNetwork(config).start()
    Path(config["ready"]).touch()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
