"""HTTP/1.1 to the API server over kept-alive TLS connections, with nothing else in the way.

Why not urllib3: bind makes two small calls per pod (the binding and its Event), and under
load the urllib3 pool and http.client's response parsing (the `email` package) were half of
bind's own CPU per call (bench/profiles/bind-c1-before.txt: Kube._call 50 %). The API server
needs none of it: one host, JSON in and out, Content-Length or chunked bodies, no redirects, no
proxies (a configuration with a proxy goes through urllib3's ProxyManager: kubeapi/client.py).

Failures are urllib3.exceptions.HTTPError, as before, so callers' outage handling (503, retry)
is unchanged. A request is sent again once, on a new connection, only when a kept-alive connection
turns out to be closed before any byte of the answer came back (the server closed it while idle).
"""
from __future__ import annotations

import socket
import ssl
import threading
from urllib.parse import urlsplit

import urllib3

from kubeapi.kubeconfig import ClusterConfig, KubeconfigError

try:  # the CAs a cluster without its own is checked against, as the kubernetes package did
    import certifi
except ImportError:  # the system's store (the images carry no certifi)
    certifi = None


# What writing to or reading from a kept-alive connection the server has closed raises.
STALE = (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


class TransportError(urllib3.exceptions.ProtocolError):
    """The API server could not be reached, or broke the exchange off."""


def tls_context(configuration: ClusterConfig) -> tuple[ssl.SSLContext, str | None]:
    """The TLS settings of a configuration, as an SSLContext, and the name the server's certificate
    is checked against and sent (SNI)."""
    cafile, cadata = configuration.ca_file, configuration.ca_data
    if not cafile and not cadata and certifi is not None:
        cafile = certifi.where()
    try:
        context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    except (OSError, ssl.SSLError) as error:
        raise KubeconfigError(f"the cluster's certificate authority ({cafile or 'certificate-authority-data'})"
                              f" cannot be read as PEM: {error}") from None
    certificate = configuration.client_certificate()
    if certificate:
        try:
            context.load_cert_chain(*certificate)
        except (OSError, ssl.SSLError) as error:
            raise KubeconfigError(f"the client certificate {certificate[0]} and key {certificate[1]} cannot be"
                                  f" used: {error}") from None
    name = configuration.tls_server_name or urlsplit(configuration.host).hostname
    if not configuration.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the name is still sent (SNI), not checked
    return context, name


class _Connection:
    __slots__ = ("sock", "reader")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = sock.makefile("rb")

    def close(self) -> None:
        for closing in (self.reader, self.sock):
            try:
                closing.close()
            except OSError:
                pass


class Transport:
    def __init__(self, configuration: ClusterConfig, connect_timeout: float, read_timeout: float, keep: int = 16,
                 tls: tuple[ssl.SSLContext, str | None] | None = None):
        """`tls`: the context and server name, when the caller has them already (tls_context)."""
        url = urlsplit(configuration.host)
        self.tls = url.scheme == "https"
        self.address = (url.hostname, url.port or (443 if self.tls else 80))
        self.host_header = url.netloc.encode("idna")
        self.context, self.server_name = (tls or tls_context(configuration)) if self.tls else (None, None)
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._idle: list[_Connection] = []
        self._keep = keep
        self._lock = threading.Lock()

    def _connect(self) -> _Connection:
        sock = socket.create_connection(self.address, timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.server_name)
            sock.settimeout(self.read_timeout)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, str, bytes]:
        """(status, reason, body) of one exchange."""
        head = [f"{method} {path} HTTP/1.1\r\n".encode(), b"Host: ", self.host_header, b"\r\n"]
        head += [f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()]
        head.append(b"Content-Length: %d\r\n\r\n" % len(body) if body is not None else b"\r\n")
        message = b"".join(head) + (body or b"")
        for attempt in (0, 1):
            # The second attempt on a new connection: when the server has closed one idle
            # connection it has usually closed the others too (its idle timeout).
            with self._lock:
                connection = self._idle.pop() if self._idle and attempt == 0 else None
            reused, answered = connection is not None, False
            try:
                if connection is None:
                    connection = self._connect()
                connection.sock.sendall(message)
                status_line = connection.reader.readline(65537)
                if not status_line:
                    raise ConnectionResetError("the connection was closed before an answer")
                answered = True
                status, reason, data, keep = self._response(connection.reader, status_line, method)
            except (OSError, ValueError) as error:  # timeouts, refused connections, TLS, bad framing
                if connection is not None:
                    connection.close()
                if reused and not answered and attempt == 0 and isinstance(error, STALE):
                    continue  # a kept-alive connection the server had closed: nothing was processed
                raise TransportError(f"{method} {path}: {error!r}") from error
            if keep:
                with self._lock:
                    if len(self._idle) < self._keep:
                        self._idle.append(connection)
                        connection = None
            if connection is not None:
                connection.close()
            return status, reason, data
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _response(reader, status_line: bytes, method: str) -> tuple[int, str, bytes, bool]:
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
        length, chunked, keep = None, False, parts[0] == "HTTP/1.1"
        while True:
            line = reader.readline(65537)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ConnectionAbortedError("closed within the response headers")
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = b"close" not in value.lower()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status, reason, b"", keep
        if chunked:
            data = bytearray()
            while True:
                size = int(reader.readline(1024).split(b";", 1)[0], 16)
                if size == 0:
                    while reader.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                data += reader.read(size)
                reader.read(2)
            return status, reason, bytes(data), keep
        if length is None:  # the body ends when the connection does
            return status, reason, reader.read(), False
        data = reader.read(length)
        if len(data) != length:
            raise ConnectionAbortedError("closed within the response body")
        return status, reason, data, keep
