"""localcp/podnet.py connects only to the machine's loopback and to pods inside the nodes'
network namespaces: any other destination, and anything but a CONNECT, is refused without a
connection being tried. (What it relays is shown by tests/test_in_cluster.py.)"""
from __future__ import annotations

import socket

import pytest

from localcp.podnet import PodNetwork

NODES = {"node1": {"address": "127.0.0.11", "netns": "/nonexistent/ns/net", "pods": "10.244.1.0/24"}}


@pytest.fixture
def podnet() -> PodNetwork:
    return PodNetwork({"apiserver_port": 1, "nodes": NODES})


@pytest.mark.parametrize("host", ["10.96.0.5", "10.244.2.7", "10.0.0.1", "192.168.1.1", "172.17.0.1", "8.8.8.8",
                                  "node9", "example.org"])
def test_destinations_outside_loopback_and_the_pods_are_refused(podnet, host):
    with pytest.raises((PermissionError, ValueError)):
        podnet.dial(host, 443)


def test_a_pod_is_dialled_inside_its_nodes_namespace(podnet):
    """node1's namespace is not there here: the dial fails opening it, not on the machine's network."""
    with pytest.raises(FileNotFoundError, match="/nonexistent/ns/net"):
        podnet.dial("10.244.1.5", 8080)


@pytest.mark.parametrize("request_line", [b"CONNECT 8.8.8.8:443 HTTP/1.1", b"GET http://10.244.1.5/ HTTP/1.1",
                                          b"CONNECT 10.244.1.5:http HTTP/1.1"])
def test_the_egress_refuses_with_502(podnet, request_line):
    ours, theirs = socket.socketpair()
    ours.sendall(request_line + b"\r\nHost: 127.0.0.1\r\n\r\n")
    podnet.egress(theirs)
    assert ours.recv(100).startswith(b"HTTP/1.1 502 ")
    assert ours.recv(100) == b""  # closed
