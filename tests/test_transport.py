"""kubeapi/transport.py against a scripted HTTP/1.1 server: framing, kept-alive connections, a
connection the server closed while idle, and failures surfacing as urllib3 HTTPErrors (which bind
turns into 503)."""
from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest
import urllib3

from kubeapi.transport import Transport, TransportError


class ScriptedServer:
    """Accepts connections; answers each request with the next scripted reply (bytes, or None to
    close the connection without answering)."""

    def __init__(self, replies: list[bytes | None]):
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0
        self.accepted: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.accepted.append(conn)
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + reader.read(length))
                reply = self.replies.pop(0) if self.replies else None
                if reply is None:
                    return
                conn.sendall(reply)

    def drop_idle(self) -> None:
        """Close every connection so far, as a server's idle timeout does."""
        for conn in self.accepted:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def transport(port: int) -> Transport:
    configuration = SimpleNamespace(host=f"http://127.0.0.1:{port}")
    return Transport(configuration, connect_timeout=2, read_timeout=2)


OK = b'HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": true}'
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"4\r\n{\"a\"\r\n7;ext=1\r\n: [1,2]\r\n1\r\n}\r\n0\r\n\r\n")


def test_content_length_and_chunked_bodies_on_one_kept_alive_connection():
    server = ScriptedServer([OK, CHUNKED, b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"])
    t = transport(server.port)
    assert t.request("POST", "/x", b'{"b": 1}', {"Content-Type": "application/json"}) == (201, "Created", b'{"a": true}')
    assert t.request("GET", "/y", None, {}) == (200, "OK", b'{"a": [1,2]}')
    assert t.request("GET", "/z", None, {}) == (404, "Not Found", b"{}")
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % server.port)
    assert b"Content-Length: 8\r\n" in first and first.endswith(b'\r\n\r\n{"b": 1}')
    server.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_once():
    server = ScriptedServer([OK])
    t = transport(server.port)
    assert t.request("GET", "/a", None, {})[0] == 201
    server.replies = [None, OK]  # the kept connection is closed at the next request; a new one answers
    assert t.request("GET", "/b", None, {})[0] == 201
    assert server.connections == 2
    server.close()


def test_when_the_server_closed_every_idle_connection_the_retry_takes_a_new_one():
    server = ScriptedServer([OK])
    t = transport(server.port)
    t._idle = [t._connect(), t._connect()]  # kept from a burst, then idle past the server's timeout
    deadline = time.monotonic() + 5
    while len(server.accepted) < 2:  # both accepted, so that both are closed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.drop_idle()
    time.sleep(0.05)
    assert t.request("GET", "/a", None, {})[0] == 201
    assert server.connections == 3
    server.close()


def test_connection_close_is_honoured():
    server = ScriptedServer([OK.replace(b"Content-Type", b"Connection: close\r\nContent-Type"), OK])
    t = transport(server.port)
    t.request("GET", "/a", None, {})
    t.request("GET", "/b", None, {})
    assert server.connections == 2
    server.close()


def test_failures_are_urllib3_http_errors():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(urllib3.exceptions.HTTPError):
        transport(port).request("GET", "/", None, {})
    server = ScriptedServer([None])  # a new connection closed without an answer: not sent again
    with pytest.raises(TransportError):
        transport(server.port).request("POST", "/binding", b"{}", {})
    assert server.connections == 1
    server.close()
    server = ScriptedServer([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"])
    with pytest.raises(TransportError):
        transport(server.port).request("GET", "/", None, {})
    server.close()
