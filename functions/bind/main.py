"""bind: places pods from ApiServerSource and PingSource CloudEvents. HTTP/CloudEvents <->
gpu_scheduler.binding; the Kubernetes calls live in placer.py.

Run locally:  functions-framework --source functions/bind/main.py --target bind
Knative retries only on connection errors and 404/413/425/429/502/503/504, so: transient API
failures answer 503, permanent ones 200 with the reason in the body, malformed events 400 (an
oversized body too: 413 would be redelivered five times, and no larger body ever becomes a pod
event).
"""
import json
import logging
import os
import socket
import threading
import time

import functions_framework
import prometheus_client as prom
from cloudevents.exceptions import GenericException as CloudEventError
from cloudevents.http import from_http
from flask import Request

from gpu_scheduler import jsonlog
from gpu_scheduler.binding import PING, POD_EVENTS, EventError, check_pod, event_type_label
from gpu_scheduler.schedmap import shown
from placer import Placer

MAX_BODY = 3 * 1024 * 1024  # the API server's request limit: no pod, so no pod event, is larger
# The adapters send a whole body at once; one still arriving after this is not theirs.
BODY_SECONDS = float(os.environ.get("BODY_TIMEOUT_SECONDS", "2"))

logging.basicConfig(level=jsonlog.level(), handlers=[jsonlog.handler()], force=True)
log = logging.getLogger("bind")
EVENTS = prom.Counter("gpu_scheduler_bind_events_total", "Events received", ["type", "status"])
placer = Placer.from_environment()  # configuration read once, at start; the client is reused


def _reply(status, kind="", **body):
    # The label comes from a fixed set: a sender choosing types cannot grow the metrics.
    EVENTS.labels(event_type_label(kind) if kind else "none", str(status)).inc()
    if status >= 400:
        log.info("answered %s", status, extra={"status": status, "event_type": kind, "reply": body})
    return json.dumps(body), status, {"Content-Type": "application/json"}


class SlowBody(Exception):
    pass


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


def read_body(request: Request, limit: int, seconds: float) -> bytes:
    """At most `limit` + 1 bytes of the body, all within `seconds` (SlowBody otherwise). Under
    gunicorn, a client that stalls or trickles has its socket's reading side shut at the deadline;
    the answer can still be written."""
    sock = request.environ.get("gunicorn.socket")
    ticket = _overdue.watch(sock, time.monotonic() + seconds) if sock is not None else None
    try:
        raw = request.stream.read(limit + 1)
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


@functions_framework.http
def bind(request: Request):
    try:
        return _handle(request)
    except Exception:  # a bug must not become a 500 that Knative drops: log it, ask for redelivery
        log.exception("unexpected error")
        return _reply(503, error="internal error in bind; the event will be redelivered")


def _handle(request: Request):
    if request.path == "/health/liveness":
        return "ok\n", 200
    if request.path == "/health/readiness":
        return ("ok\n", 200) if placer.ready() else ("no Kubernetes API configuration\n", 503)
    if request.path == "/metrics":
        return prom.generate_latest(), 200, {"Content-Type": prom.CONTENT_TYPE_LATEST}
    if request.method != "POST":
        return _reply(405, error=f"{request.method} {request.path}: POST a CloudEvent")
    # 400, not 413: the adapter redelivers a 413 five times, and the answer cannot change.
    if (request.content_length or 0) > MAX_BODY:
        return _reply(400, error=f"body: larger than {MAX_BODY} bytes; no pod event is")
    try:
        raw = read_body(request, MAX_BODY, BODY_SECONDS)
    except SlowBody:
        return _reply(400, error=f"body: not received within {BODY_SECONDS:g} s")
    if len(raw) > MAX_BODY:
        return _reply(400, error=f"body: larger than {MAX_BODY} bytes; no pod event is")
    structured = (request.headers.get("Content-Type") or "").lower().startswith("application/cloudevents")
    if structured and not raw.lstrip()[:1] == b"{":
        return _reply(400, error="malformed CloudEvent: body: a structured-mode event must be a JSON object")
    try:
        event = from_http(dict(request.headers), raw)
    except (AttributeError, TypeError) as error:  # the SDK's own, on shapes it does not expect
        return _reply(400, error=f"malformed CloudEvent: {type(error).__name__}: {str(error)[:200]}")
    except RecursionError:  # structured mode's or the data's JSON nested past Python's limit
        return _reply(400, error="malformed CloudEvent: JSON nested too deeply")
    except (CloudEventError, ValueError) as error:
        if "RecursionError" in str(error):  # the SDK wraps the data's RecursionError in its own
            return _reply(400, error="malformed CloudEvent: data: JSON nested too deeply")
        return _reply(400, error=f"malformed CloudEvent: {str(error)[:500]}")
    kind = event["type"]
    if kind == PING:
        outcome = placer.resync()
    elif kind in POD_EVENTS:
        try:
            pod = check_pod(event.data)
        except EventError as error:
            return _reply(400, kind, error=f"malformed {kind} event {shown(event['id'])}: {error}")
        outcome = placer.place(pod)
    else:
        log.debug("ignored event", extra={"event_id": event["id"], "event_type": kind})
        return _reply(200, kind, result="ignored", why=f"event type {shown(kind)} is not handled")
    return _reply(503 if outcome.get("retry") else 200, kind, **outcome)
