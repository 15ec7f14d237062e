"""localcp/podnet.py connects only to the machine's loopback and to node and pod addresses inside
the stack's fabric namespace (a door: to its Service's address inside its node's namespace): any
other destination, and anything but a CONNECT, is refused without a connection being tried. (What
it relays is shown by tests/test_cluster_network.py and tests/test_in_cluster.py.)"""
from __future__ import annotations

import socket

import pytest

from localcp.podnet import PodNetwork

FABRIC = "/nonexistent/fabric/ns/net"


@pytest.fixture
def podnet() -> PodNetwork:
    return PodNetwork({"apiserver_port": 1, "fabric": FABRIC})


@pytest.mark.parametrize("host", ["10.96.0.5", "10.0.0.1", "10.241.0.1", "192.168.1.1", "172.17.0.1", "8.8.8.8",
                                  "node9", "example.org"])
def test_destinations_outside_loopback_the_nodes_and_the_pods_are_refused(podnet, host):
    with pytest.raises((PermissionError, ValueError)):
        podnet.dial(host, 443)


@pytest.mark.parametrize("host", ["10.244.1.5", "10.244.4.9", "10.240.0.11"])
def test_a_pod_or_a_node_is_dialled_inside_the_fabric(podnet, host):
    """The fabric's namespace is not there here: the dial fails opening it, not on the machine's network."""
    with pytest.raises(FileNotFoundError, match=FABRIC):
        podnet.dial(host, 8080)


def test_without_a_fabric_only_loopback_is_dialled():
    with pytest.raises(PermissionError):
        PodNetwork({"doors": []}).dial("10.244.1.5", 8080)


def test_a_door_dials_its_service_inside_its_node():
    door = PodNetwork({}).door({"name": "bind", "port": 1, "cluster_ip": "10.96.7.7", "service_port": 80,
                                "netns": "/nonexistent/node1/ns/net"})
    ours, theirs = socket.socketpair()
    with pytest.raises(FileNotFoundError, match="node1"):
        door(theirs)


def test_a_door_takes_an_address_never_a_name():
    with pytest.raises(ValueError):
        PodNetwork({}).door({"name": "x", "port": 1, "cluster_ip": "bind.gpu-scheduler.svc", "service_port": 80,
                             "netns": "/x"})


@pytest.mark.parametrize("request_line", [b"CONNECT 8.8.8.8:443 HTTP/1.1", b"GET http://10.244.1.5/ HTTP/1.1",
                                          b"CONNECT 10.244.1.5:http HTTP/1.1"])
def test_the_egress_refuses_with_502(podnet, request_line):
    ours, theirs = socket.socketpair()
    ours.sendall(request_line + b"\r\nHost: 127.0.0.1\r\n\r\n")
    podnet.egress(theirs)
    assert ours.recv(100).startswith(b"HTTP/1.1 502 ")
    assert ours.recv(100) == b""  # closed
