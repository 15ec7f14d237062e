"""The local stack's cluster network (localcp/network.py) on the four real nodes: each kubelet in
its node's own network namespace, routes between the nodes, Service addresses by the real
kube-proxy, cluster DNS by the real CoreDNS; and the guard that no packet to the node, pod or
Service ranges can leave the machine (nothing routes them out of the namespaces the stack's
processes live in, and nothing of them is in the machine's own namespace).

Each server and client pod runs the check image's python (http.server, urllib, socket): no other
image is loaded into the nodes.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localcp import images, network
from localcp.cluster import NODES

_names = iter(range(10**6))
PORT = 8080
# The ranges that must never leave the machine: the node network, the pods', the Services'.
CLUSTER_RANGES = [ipaddress.ip_network(n) for n in (network.NODE_NETWORK, network.CLUSTER_CIDR, network.SERVICE_RANGE)]


def pod(namespace: str, name: str, node: str, command: list[str], labels: dict | None = None,
        readiness: dict | None = None) -> dict:
    container = {"name": "c", "image": images.image_name_in_manifest(), "imagePullPolicy": "Never",
                 "command": command, "ports": [{"containerPort": PORT}],
                 "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    if readiness:
        container["readinessProbe"] = readiness
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 1,
                     "securityContext": {"runAsUser": 65532, "runAsGroup": 65532}}}


def server(namespace: str, node: str) -> dict:
    """An HTTP server on PORT answering with its node's name, Ready by an httpGet probe."""
    script = ("import http.server, os\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        body = os.environ['NODE'].encode()\n"
              "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
              "        self.wfile.write(body)\n"
              f"http.server.ThreadingHTTPServer(('', {PORT}), H).serve_forever()\n")
    manifest = pod(namespace, f"server-{node}", node, ["python", "-c", script], {"app": f"server-{node}"},
                   {"httpGet": {"path": "/", "port": PORT}, "periodSeconds": 1, "failureThreshold": 1})
    manifest["spec"]["containers"][0]["env"] = [{"name": "NODE", "value": node}]
    return manifest


def client(namespace: str, node: str) -> dict:
    return pod(namespace, f"client-{node}", node, ["python", "-c", "import time; time.sleep(10**6)"])


def service(namespace: str, name: str, selector: dict, kind: str = "ClusterIP") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"type": kind, "selector": selector, "ports": [{"port": 80, "targetPort": PORT}]}}


def ready(stack, namespace: str, name: str) -> bool:
    status = json.loads(stack.cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")).get("status", {})
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def in_pod(stack, namespace: str, name: str, code: str) -> subprocess.CompletedProcess:
    """python -c CODE in the pod, through the API server, its egress and the pod's kubelet."""
    return stack.cp.kubectl("exec", "-n", namespace, name, "--", "python", "-c", code, check=False)


def fetch(url: str) -> str:
    return f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"


@pytest.fixture(scope="module")
def net(real_stack):
    """A server (httpGet readiness probe) and a client on every node, all Ready or Running."""
    namespace = real_stack.create_namespace(f"net{next(_names)}")
    for node in NODES:
        real_stack.apply(server(namespace, node))
        real_stack.apply(client(namespace, node))

    def everything_up():
        pods = real_stack.pods(namespace)
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        servers = all(ready(real_stack, namespace, f"server-{n}") for n in NODES)
        return len(pods) == 2 * len(NODES) and len(running) == len(pods) and servers
    real_stack.wait_for(everything_up, 120, "a server Ready (httpGet probe) and a client Running on every node",
                        interval=0.5)
    return namespace


def test_an_httpget_readiness_probe_makes_a_pod_ready_on_each_node(real_stack, net):
    """The kubelet probes from its node's namespace, where the pod is one hop away: the server
    logged the probe's GET, answered 200, from its gateway (the node's end of its veth pair)."""
    for i, node in enumerate(NODES, 1):
        assert ready(real_stack, net, f"server-{node}")
        gateway = str(next(ipaddress.ip_network(network.pod_range(i)).hosts()))
        logs = real_stack.cp.kubectl("logs", "-n", net, f"server-{node}").stdout
        assert re.search(rf'^{re.escape(gateway)} .*"GET / HTTP/1.1" 200', logs, re.M), logs[-500:]


def test_cluster_dns_resolves_the_kubernetes_service_and_a_service_by_name(real_stack, net):
    real_stack.apply(service(net, "echo", {"app": "server-node3"}))
    code = ("import socket; print(socket.gethostbyname('kubernetes.default.svc.cluster.local'));"
            f" print(socket.gethostbyname('echo.{net}.svc.cluster.local')); print(socket.gethostbyname('echo'))")
    cluster_ip = json.loads(real_stack.cp.get(f"/api/v1/namespaces/{net}/services/echo"))["spec"]["clusterIP"]

    def resolved():
        done = in_pod(real_stack, net, "client-node1", code)
        return done.stdout.split() if done.returncode == 0 else None
    assert real_stack.wait_for(resolved, 30, "names resolved from node1") == [
        network.KUBERNETES_SERVICE[0], cluster_ip, cluster_ip]
    resolv = in_pod(real_stack, net, "client-node1", "print(open('/etc/resolv.conf').read())").stdout
    assert f"nameserver {network.CLUSTER_DNS}" in resolv and f"search {net}.svc.cluster.local" in resolv


def test_a_clusterip_service_on_node3_answers_a_pod_on_node1(real_stack, net):
    real_stack.apply(service(net, "echo3", {"app": "server-node3"}))
    cluster_ip = json.loads(real_stack.cp.get(f"/api/v1/namespaces/{net}/services/echo3"))["spec"]["clusterIP"]

    def answered(url):
        def attempt():
            done = in_pod(real_stack, net, "client-node1", fetch(url))
            return done.stdout.strip() if done.returncode == 0 else None
        return attempt
    # kube-proxy follows the new EndpointSlice within its sync period: wait on the answer.
    assert real_stack.wait_for(answered(f"http://{cluster_ip}/"), 30, "the ClusterIP answers") == "node3"
    assert real_stack.wait_for(answered(f"http://echo3.{net}.svc.cluster.local/"), 30, "by name") == "node3"


def test_a_nodeport_service_answers_on_every_node(real_stack, net):
    real_stack.apply(service(net, "echo4", {"app": "server-node4"}, kind="NodePort"))
    node_port = json.loads(real_stack.cp.get(f"/api/v1/namespaces/{net}/services/echo4"))["spec"]["ports"][0]["nodePort"]
    for i, node in enumerate(NODES, 1):
        def attempt():
            done = in_pod(real_stack, net, "client-node2", fetch(f"http://{network.node_address(i)}:{node_port}/"))
            return done.stdout.strip() if done.returncode == 0 else None
        assert real_stack.wait_for(attempt, 30, f"NodePort {node_port} on {node}") == "node4"


def test_a_pod_on_node2_reaches_a_pod_on_node4_by_its_address(real_stack, net):
    address = json.loads(real_stack.cp.get(f"/api/v1/namespaces/{net}/pods/server-node4"))["status"]["podIP"]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(network.pod_range(4))
    done = in_pod(real_stack, net, "client-node2", fetch(f"http://{address}:{PORT}/"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "node4"


def test_pods_read_the_api_through_the_kubernetes_service(real_stack, net):
    """10.96.0.1:443, kube-proxy's DNAT to the API server's advertised address on the node network."""
    code = ("import ssl, socket; s = socket.create_connection(('10.96.0.1', 443), timeout=5);"
            " t = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')"
            ".wrap_socket(s, server_hostname='kubernetes.default.svc'); print(t.version())")
    done = in_pod(real_stack, net, "client-node3", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("TLS")


def test_kubectl_logs_and_exec_work_on_every_node(real_stack, net):
    for node in NODES:
        done = in_pod(real_stack, net, f"client-{node}", "import socket; print(socket.gethostname())")
        assert done.returncode == 0 and done.stdout.strip() == f"client-{node}", done.stderr
        logs = real_stack.cp.kubectl("logs", "-n", net, f"server-{node}", check=False)
        assert logs.returncode == 0, logs.stderr  # http.server logs each probe to stderr
        assert '"GET / HTTP/1.1" 200' in logs.stdout


def test_coredns_runs_as_kubeadm_installs_it(real_stack):
    deployment = json.loads(real_stack.cp.get("/apis/apps/v1/namespaces/kube-system/deployments/coredns"))
    assert deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"]
    dns = json.loads(real_stack.cp.get("/api/v1/namespaces/kube-system/services/kube-dns"))
    assert dns["spec"]["clusterIP"] == network.CLUSTER_DNS
    events = json.loads(real_stack.cp.get("/api/v1/events?fieldSelector=reason%3DMissingClusterDNS"))["items"]
    assert not events, [e["message"] for e in events]


def test_a_nodes_own_process_reaches_a_clusterip(real_stack, net):
    """A process in a node's own namespace (a host-network pod does the same, and so do the stack's
    doors) reaches a ClusterIP through kube-proxy, as on any node: the namespace routes the Service
    range toward the fabric and kube-proxy's DNAT rewrites it. Without that route, connect() fails
    with "Network is unreachable" before kube-proxy sees the packet."""
    kubelet = real_stack.cp.processes[real_stack.nodes["node2"].kubelet].pid
    code = ("import socket; s = socket.create_connection(('%s', %d), timeout=5); print('connected'); s.close()"
            % network.KUBERNETES_SERVICE)
    done = subprocess.run(["nsenter", f"--net=/proc/{kubelet}/ns/net", "--", sys.executable, "-c", code],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "connected", done.stderr


# -- the guard -----------------------------------------------------------------------------------
def _netns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _route(pid: int | None, address: str) -> str:
    """`ip route get ADDRESS` as the process `pid` would route it (None: the machine's own)."""
    argv = ["ip", "-o", "route", "get", address]
    if pid is not None:
        argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else f"unreachable: {done.stderr.strip()}"


def _machine_default_device() -> str | None:
    match = re.search(r"\bdev (\S+)", subprocess.run(["ip", "route", "show", "default"], capture_output=True,
                                                      text=True).stdout)
    return match.group(1) if match else None


def test_no_packet_to_the_cluster_ranges_can_leave_the_machine(real_stack, net):
    """While pods with httpGet probes run (the net fixture's servers): every kubelet, containerd,
    kube-proxy and DRA driver lives in its node's namespace, not the machine's; from there each
    pod address, the node network and the Service range route to the node's own links or nowhere,
    never out of the machine's default route; and the machine's own namespace has no interface,
    address or route of the stack."""
    machine = _netns("self")
    default_device = _machine_default_device()
    pods = real_stack.pods(net)
    targets = [p["status"]["podIP"] for p in pods] + [network.KUBERNETES_SERVICE[0], network.CLUSTER_DNS,
                                                      network.FABRIC_ADDRESS, "10.244.99.1", "10.96.200.200"]
    for node in real_stack.nodes.nodes.values():
        names = [node.kubelet, node.containerd, node.proxy] + ([node.dra] if node.dra_running() else [])
        for name in names:
            process = real_stack.cp.processes[name]
            assert process.poll() is None, f"{name} is not running"
            # nsenter execs the program: the process is the component itself.
            assert _netns(process.pid) != machine, f"{name} runs in the machine's network namespace"
        kubelet = real_stack.cp.processes[node.kubelet].pid
        for address in targets:
            route = _route(kubelet, address)
            machine_route = _route(None, address)
            assert route != machine_route, f"{node.name}: {address} routed as on the machine: {route}"
            device = re.search(r"\bdev (\S+)", route)
            assert route.startswith("unreachable") or (device and device.group(1) in ("eth0", "lo")
                                                       or device.group(1).startswith("veth")), route
    # Nothing of the stack in the machine's own namespace.
    routes = subprocess.run(["ip", "-o", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    addresses = subprocess.run(["ip", "-o", "address"], capture_output=True, text=True).stdout
    for line in (routes + addresses).splitlines():
        for word in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?\b", line):
            net_ = ipaddress.ip_network(word, strict=False)
            assert not any(net_.overlaps(r) for r in CLUSTER_RANGES), f"the machine's namespace has {line!r}"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not re.search(r"\b(veth|br0)", links), links
    assert default_device is None or default_device not in ("br0",)


def test_the_machine_holds_no_socket_to_the_cluster_ranges(real_stack, net):
    """What is connected in the machine's namespace goes to loopback only: a kubelet probing pods
    from there would show here as connections to the pod range."""
    sockets = []
    for table in ("tcp", "udp"):
        for line in Path(f"/proc/{os.getpid()}/net/{table}").read_text().splitlines()[1:]:
            remote = line.split()[2]
            host = ipaddress.ip_address(int(remote.split(":")[0], 16).to_bytes(4, "little"))
            if any(host in r for r in CLUSTER_RANGES):
                sockets.append(f"{table} {host}")
    assert not sockets, sockets
