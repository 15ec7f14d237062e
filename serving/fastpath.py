"""The functions' own WSGI path in front of functions-framework's Flask app, for the one kind of
request each function gets thousands of (bind: a binary-mode CloudEvent; mutate: an
AdmissionReview). Everything else (health, metrics, wrong methods, anything unusual) still goes
through Flask and the function's Flask handler, unchanged.

Why: per request, Flask, werkzeug and functions-framework's wrappers cost more of bind's CPU than
bind's own decision (bench/profiles/, docs/performance.md). Users still run
`functions-framework --target bind`: the function's module is executed by functions-framework
inside its Flask app's context, and installs this there, in front of that app's WSGI callable.
GPU_SCHEDULER_FAST_PATH=off leaves every request to Flask (tests/test_fastpath.py compares the two);
GPU_SCHEDULER_FAST_LANE=off keeps this path but leaves the request's parsing to gunicorn.
Like jsonlog, a helper of the shells, not of the pure core.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from http import HTTPStatus
from typing import Callable, Iterable, Optional

# A fast handler: the WSGI environ -> (body, status, headers), or None to leave it to Flask.
Handler = Callable[[dict], Optional[tuple]]

# functions-framework's own routes besides the function: Flask answers them (404).
FRAMEWORK_PATHS = ("/robots.txt", "/favicon.ico")
_REASONS = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


def install(handler: Handler, lane: bool = False) -> bool:
    """Put `handler` in front of the Flask app functions-framework is loading this module into.
    False (and nothing installed) outside functions-framework, or when it is asked to log
    execution ids (LOG_EXECUTION_ID), which only its own wrappers do. With `lane`, the images'
    gunicorn also hands it binary-mode CloudEvents straight from the socket (serving/fastlane.py)."""
    try:
        import flask
    except ImportError:  # pragma: no cover
        return False
    if not flask.has_app_context() or os.environ.get("LOG_EXECUTION_ID", "").lower() in ("true", "1"):
        return False
    if os.environ.get("GPU_SCHEDULER_FAST_PATH", "on").lower() in ("off", "0", "false", "no"):
        return False
    app = flask.current_app._get_current_object()
    flask_app = app.wsgi_app

    def wsgi_app(environ: dict, start_response) -> Iterable[bytes]:
        answer = handler(environ)
        if answer is None:
            return flask_app(environ, start_response)
        body, status, headers = answer
        if isinstance(body, str):
            body = body.encode()
        start_response(_REASONS.get(status) or f"{status} Unknown",
                       [*headers.items(), ("Content-Length", str(len(body)))])
        return [body]

    app.wsgi_app = wsgi_app
    if lane and os.environ.get("GPU_SCHEDULER_FAST_LANE", "on").lower() not in ("off", "0", "false", "no"):
        from serving import fastlane
        fastlane.handler = handler
    return True


def read_body(environ: dict, limit: int) -> bytes | None:
    """The request body when it declares a length of at most `limit` bytes, else None (the
    caller leaves the request to Flask, which answers as before)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or -1)
    except ValueError:
        return None
    if not 0 <= length <= limit:
        return None
    return environ["wsgi.input"].read(length)


def replay(environ: dict, body: bytes) -> None:
    """Give Flask the body read by read_body, when the fast handler leaves the request to it."""
    import io
    environ["wsgi.input"] = io.BytesIO(body)


# -- a deadline for the body, on every path ---------------------------------------------------
# The environ key of a body reader that keeps `read_within`'s deadline itself (serving/fastlane.py
# sets it): read_within(environ, read, seconds) calls environ[READ_WITHIN](read, seconds).
READ_WITHIN = "gpu_scheduler.read_within"


class SlowBody(Exception):
    """The body did not arrive within its deadline."""


class _Overdue:
    """Shuts the reading side of a socket whose body is overdue, so that a read blocked on it
    ends (gunicorn reads a body until it has all of it, so a socket timeout alone never fires on
    a client that sends a byte now and then). One thread, started when needed (functions-framework
    forks after import: a thread made at import would not exist in the worker), gone when idle."""

    def __init__(self):
        self._lock = threading.Lock()
        self._due: dict[int, list] = {}
        self._running = False

    def watch(self, sock, deadline: float) -> list:
        ticket = [deadline, sock, False]  # the last item: whether it was cut off
        with self._lock:
            self._due[id(ticket)] = ticket
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="body-deadlines", daemon=True).start()
        return ticket

    def unwatch(self, ticket: list) -> None:
        with self._lock:
            self._due.pop(id(ticket), None)

    def _run(self) -> None:
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            with self._lock:
                overdue = [t for t in self._due.values() if t[0] <= now]
                for ticket in overdue:
                    del self._due[id(ticket)]
                    ticket[2] = True
                if not self._due and not overdue:
                    self._running = False
                    return
            for _, sock, _ in overdue:
                try:
                    sock.shutdown(socket.SHUT_RD)
                except OSError:
                    pass


_overdue = _Overdue()


def read_within(environ: dict, read: Callable[[], Optional[bytes]], seconds: float) -> Optional[bytes]:
    """`read()` (the body, or what the caller reads of it), all within `seconds` (SlowBody
    otherwise). Under gunicorn, a client that stalls or trickles has its socket's reading side
    shut at the deadline; the answer can still be written. Flask's path and the fast one both
    read through it."""
    lane = environ.get(READ_WITHIN)  # serving/fastlane's body reader keeps the deadline itself
    if lane is not None:
        return lane(read, seconds)
    sock = environ.get("gunicorn.socket")
    ticket = _overdue.watch(sock, time.monotonic() + seconds) if sock is not None else None
    try:
        raw = read()
    except Exception:  # gunicorn's NoMoreData and the like, once the socket is shut
        if ticket is not None and ticket[2]:
            raise SlowBody() from None
        raise
    finally:
        if ticket is not None:
            _overdue.unwatch(ticket)
    if ticket is not None and ticket[2]:
        raise SlowBody()
    return raw
