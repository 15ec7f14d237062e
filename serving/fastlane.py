"""The functions' fast handler (serving/fastpath.py) reached from the socket, under the images'
gunicorn (serving/gunicorn_config.py), without gunicorn's request and response objects.

Why: with the fast path, bind's own handling of an ApiServerSource event is a quarter of that
event's CPU; gunicorn's parser, WSGI environ, response object and headers are most of the rest.
In a cluster the adapter sends bind every change of every pod it places (two per placement at
least), and on the local stack those events were 1.6 of bind's 3.7 ms of CPU per placement
(docs/performance.md, issue 62). This lane reads one plain HTTP/1.1 request of the one shape the
event sources send (POST, a Content-Length, no Transfer-Encoding, Expect or Upgrade, headers
each once), and gives the fast handler the environ keys it reads. Anything else, and anything
the handler leaves to Flask, is given back, bytes and all, to gunicorn's own parser, which
serves it as if the lane were not there (tests/test_fastlane.py compares the two).

Like fastpath, a helper of the shells, not of the pure core.
"""
from __future__ import annotations

import select
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Callable, Optional

from serving import draining, fastpath

# The fast handler installed by fastpath.install (None: no lane, every request to gunicorn).
handler: Optional[Callable[[dict], Optional[tuple]]] = None

HEAD_LIMIT = 16384  # a request head longer than this is gunicorn's to parse (and to refuse)
_REASONS = {status.value: f"{status.value} {status.phrase}".encode() for status in HTTPStatus}
# Headers that make a request one this lane does not serve: gunicorn knows what to do with them.
_NOT_MINE = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"http2-settings", b"te", b"trailer"))
_TOKEN = frozenset(b"!#$%&'*+-.^`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


# A header's name as sent -> its WSGI environ key: the same few names come in every event.
_KEYS: dict[bytes, str] = {}
_KEYS_KEPT = 256  # names remembered at most (anyone may send any names)


def _environ_key(name: bytes) -> str | None:
    """The environ key of a header the lane reads (remembered), or None for a name gunicorn must
    judge: empty, not a token (an underscore, a space: folding), or one of _NOT_MINE."""
    if not name or not _TOKEN.issuperset(name):
        return None
    lower = name.lower()
    if lower in _NOT_MINE:
        return None
    key = {b"content-length": "CONTENT_LENGTH", b"content-type": "CONTENT_TYPE"}.get(lower)
    key = key or "HTTP_" + lower.decode("latin-1").upper().replace("-", "_")
    if len(_KEYS) < _KEYS_KEPT:
        _KEYS[name] = key
    return key


class NotMine(Exception):
    """The request is gunicorn's: `data` is every byte read from the socket, in order."""

    def __init__(self, data: bytes):
        self.data = data


class _Body:
    """wsgi.input for the lane: the bytes already read, then the socket, never past the body."""

    def __init__(self, sock, buffered: bytes, length: int):
        self._sock, self.buffered, self.left = sock, buffered, length
        self.read_bytes: list[bytes] = []
        self._deadline: float | None = None

    def within(self, read: Callable[[], Optional[bytes]], seconds: float) -> Optional[bytes]:
        """`read()`, its reads of the socket all done within `seconds` (else fastpath.SlowBody).
        The lane reads the body itself, so a socket timeout bounds it: gunicorn's parser needs
        fastpath's watcher thread, which a body that came after its head started for every event."""
        self._deadline = time.monotonic() + seconds
        try:
            return read()
        finally:
            self._deadline = None
            self._sock.settimeout(None)

    def _recv(self, size: int) -> bytes:
        if self._deadline is None:
            return self._sock.recv(size)
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise fastpath.SlowBody()
        self._sock.settimeout(left)
        try:
            return self._sock.recv(size)
        except TimeoutError:
            raise fastpath.SlowBody() from None

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.left:
            size = self.left
        chunks = []
        while size > 0:
            if self.buffered:
                chunk, self.buffered = self.buffered[:size], self.buffered[size:]
            else:
                chunk = self._recv(min(size, 65536))
                if not chunk:
                    raise ConnectionResetError("the client closed the connection within the body")
            chunks.append(chunk)
            size -= len(chunk)
            self.left -= len(chunk)
        data = b"".join(chunks)
        self.read_bytes.append(data)
        return data

    def unread(self) -> bytes:
        """What was read of the body, then what is buffered beyond it."""
        return b"".join(self.read_bytes) + self.buffered


def next_request_within(sock, seconds: float) -> bool:
    """Whether `sock` has bytes to read (a next request, or the client closing) within `seconds`."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


_date = [0, b""]


def _http_date() -> bytes:
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, formatdate(now, usegmt=True).encode()
    return _date[1]


def serve(sock, keep_alive: bool, unread: Callable[[bytes], None]) -> bool:
    """Read one request from `sock` (blocking, data waiting) and answer it with the fast handler.
    True when the connection stays open for the next request; bytes read past this request
    (a pipelined one) go to `unread`. Raises NotMine with the bytes read when the request is
    gunicorn's to serve, and OSError when the client is gone."""
    data = sock.recv(65536)
    if not data:
        return False
    end = data.find(b"\r\n\r\n")
    while end < 0:
        if len(data) > HEAD_LIMIT:
            raise NotMine(data)
        more = sock.recv(65536)
        if not more:
            raise NotMine(data)  # gunicorn says what is wrong with a head cut short
        data += more
        end = data.find(b"\r\n\r\n", max(0, len(data) - len(more) - 3))
    lines = data[:end].split(b"\r\n")
    request_line = lines[0].split(b" ")
    if len(request_line) != 3 or request_line[0] != b"POST" or request_line[2] != b"HTTP/1.1":
        raise NotMine(data)
    target = request_line[1]
    if not target.startswith(b"/") or b"%" in target or b"#" in target:
        raise NotMine(data)
    path, _, query = target.partition(b"?")
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path.decode("latin-1"),
               "QUERY_STRING": query.decode("latin-1"), "SERVER_PROTOCOL": "HTTP/1.1", "gunicorn.socket": sock}
    length = -1
    close = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        key = _KEYS.get(name)
        if key is None:
            key = _environ_key(name) if colon else None
            if key is None:
                raise NotMine(data)  # folded, malformed, an underscore, or a header gunicorn handles
        value = value.strip(b" \t")
        if key == "CONTENT_LENGTH":
            if length >= 0 or not value.isdigit():
                raise NotMine(data)
            length = int(value)
        elif key == "HTTP_CONNECTION" and b"close" in value.lower():
            close = True
        if key in environ:
            raise NotMine(data)  # a header twice: gunicorn joins or refuses it
        environ[key] = value.decode("latin-1")
    if length < 0 or "HTTP_CE_SPECVERSION" not in environ:
        raise NotMine(data)
    head = data[:end + 4]
    body = _Body(sock, data[end + 4:], length)
    environ["wsgi.input"] = body
    environ[fastpath.READ_WITHIN] = body.within
    answer = handler(environ)
    if answer is None:
        raise NotMine(head + body.unread())
    content, status, headers = answer
    if isinstance(content, str):
        content = content.encode()
    keep_alive = keep_alive and not close and not draining.draining()
    if body.left > len(body.buffered):
        keep_alive = False  # a body the handler did not read (a refused sender): not waited for
    elif keep_alive:
        body.read()  # the rest of it, already here: the next request starts after it
    out = [b"HTTP/1.1 ", _REASONS.get(status) or b"%d Unknown" % status, b"\r\nDate: ", _http_date(),
           b"\r\nConnection: ", b"keep-alive" if keep_alive else b"close"]
    for key, value in headers.items():
        out += (b"\r\n", key.encode("latin-1"), b": ", str(value).encode("latin-1"))
    out += (b"\r\nContent-Length: ", str(len(content)).encode(), b"\r\n\r\n", content)
    sock.sendall(b"".join(out))
    if keep_alive and body.buffered:  # a pipelined request: gunicorn's parser takes it next
        unread(body.buffered)
    return keep_alive
