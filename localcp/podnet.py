"""The pod network's links to the machine, for the in-cluster stack (LocalStack(in_cluster=True)):
what kube-proxy, the nodes' routes and an API server network proxy (konnectivity) do in a cluster,
as one small process that holds sockets both in the machine's network namespace and in the node
network namespaces the stack created (localcp/nodes.py), and relays bytes between them.

It connects only to loopback addresses of the machine and to pod addresses inside those node
namespaces; any other destination is refused. Nothing is added to the machine's own network
namespace: no interface, address or route.

- The kubernetes Service, per node: a listener on 10.96.0.1:443 inside the node's namespace (the
  address is on that namespace's loopback, and the pods route the Service range to their gateway
  there), relaying to the API server's loopback port. Pods read the API as in any cluster, from
  KUBERNETES_SERVICE_HOST/PORT with their ServiceAccount token.
- The API server's egress to the cluster (kube-apiserver --egress-selector-config-file, egress
  `cluster`, HTTPConnect over a Unix socket): the API server sends `CONNECT host:port`; a pod
  address is dialled inside the namespace of the node whose pod range holds it, a node's name at
  that kubelet's loopback address. With --enable-aggregator-routing the API server resolves a
  webhook's Service to one of its ready endpoints itself, so mutate is reached through its Service.
- Services for the machine: a loopback port relaying each connection to a ready endpoint of a
  Service, read from its EndpointSlices at that moment (the event source's and ping's way to bind).

    python -m localcp.podnet CONFIG.json     (LocalStack writes the file and starts it)
"""
from __future__ import annotations

import ctypes
import functools
import ipaddress
import json
import os
import socket
import ssl
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

CLONE_NEWNET = 0x40000000
KUBERNETES_SERVICE = ("10.96.0.1", 443)  # the first address of --service-cluster-ip-range
SERVICE_RANGE = "10.96.0.0/16"
_libc = ctypes.CDLL(None, use_errno=True)


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
        self.apiserver = ("127.0.0.1", config["apiserver_port"])
        self.nodes = config["nodes"]  # name -> {"address", "netns", "pods"}
        self.ranges = [(ipaddress.ip_network(n["pods"]), n["netns"]) for n in self.nodes.values()]

    @functools.cached_property
    def tls(self) -> ssl.SSLContext:
        """The admin's client certificate, for reading EndpointSlices."""
        context = ssl.create_default_context(cafile=self.config["ca"])
        context.load_cert_chain(self.config["cert"], self.config["key"])
        return context

    # -- where an address is -------------------------------------------------------------------
    def dial(self, host: str, port: int) -> socket.socket:
        """A connection to a pod (in its node's namespace), a node's kubelet or the API server
        (the machine's loopback); OSError for anything else."""
        if host in self.nodes:
            host = self.nodes[host]["address"]
        address = ipaddress.ip_address(host)
        if address.is_loopback:
            netns = None
        else:
            netns = next((ns for pods, ns in self.ranges if address in pods), "")
            if not netns:
                raise PermissionError(f"{host} is neither a pod of a node nor loopback: refused")
        conn = socket_in(netns)
        conn.settimeout(5)
        conn.connect((str(address), port))
        conn.settimeout(None)
        return conn

    # -- the kubernetes Service in each node -----------------------------------------------------
    def kubernetes_service(self, conn: socket.socket) -> None:
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

    # -- Services for the machine --------------------------------------------------------------
    def endpoint(self, namespace: str, name: str) -> tuple[str, int]:
        """A ready endpoint of the Service (its first port), as kube-proxy would pick one."""
        query = urllib.parse.urlencode({"labelSelector": f"kubernetes.io/service-name={name}"})
        url = f"{self.config['server']}/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?{query}"
        with urllib.request.urlopen(url, context=self.tls, timeout=5) as response:
            slices = json.load(response)["items"]
        for piece in slices:
            ports = [p["port"] for p in piece.get("ports") or [] if p.get("port")]
            for endpoint in piece.get("endpoints") or []:
                if ports and endpoint.get("conditions", {}).get("ready"):
                    return endpoint["addresses"][0], ports[0]
        raise ConnectionRefusedError(f"Service {namespace}/{name} has no ready endpoint")

    def service(self, namespace: str, name: str):
        def handle(conn: socket.socket) -> None:
            relay(conn, self.dial(*self.endpoint(namespace, name)))
        return handle

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        for node, spec in self.nodes.items():
            listener = socket_in(spec["netns"])
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(KUBERNETES_SERVICE)
            listener.listen(64)
            serve(listener, self.kubernetes_service, f"kubernetes-service-{node}")
        egress = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        egress.bind(self.config["egress_socket"])
        egress.listen(64)
        serve(egress, self.egress, "egress")
        for service in self.config["services"]:
            listener = socket.socket()
            listener.bind(("127.0.0.1", service["port"]))
            listener.listen(64)
            serve(listener, self.service(service["namespace"], service["name"]), f"service-{service['name']}")
        log("pod network links ready")


def main(path: str) -> None:
    config = json.loads(Path(path).read_text())
    PodNetwork(config).start()
    Path(config["ready"]).touch()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
