"""bind: places pods from ApiServerSource and PingSource CloudEvents. HTTP/CloudEvents <->
gpu_scheduler.binding; the Kubernetes calls live in placer.py.

Run locally:  functions-framework --source functions/bind/main.py --target bind
Knative retries only on connection errors and 404/413/425/429/502/503/504, so: transient API
failures answer 503, permanent ones 200 with the reason in the body, malformed events 400.
"""
import json
import logging

import functions_framework
import prometheus_client as prom
from cloudevents.exceptions import GenericException as CloudEventError
from cloudevents.http import from_http
from flask import Request

from gpu_scheduler import jsonlog
from gpu_scheduler.binding import PING, POD_EVENTS, EventError, check_pod
from authn import SinkAuthenticator, Unavailable
from gpu_scheduler.sinkauth import Unauthenticated
from placer import Placer

MAX_BODY = 3 * 1024 * 1024

logging.basicConfig(level=jsonlog.level(), handlers=[jsonlog.handler()], force=True)
log = logging.getLogger("bind")
EVENTS = prom.Counter("gpu_scheduler_bind_events_total", "Events received", ["type", "status"])
placer = Placer.from_environment()  # configuration read once, at start; the client is reused
# Knative's sink authentication, where it is on (SINK_AUDIENCE, SINK_SENDERS): see authn.py.
sink_auth = SinkAuthenticator.from_environment(placer.api)


def _reply(status, kind="", **body):
    EVENTS.labels(kind or "none", str(status)).inc()
    if status >= 400:
        log.info("answered %s", status, extra={"status": status, "event_type": kind, "reply": body})
    return json.dumps(body), status, {"Content-Type": "application/json"}


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
    if sink_auth is not None:
        try:
            sink_auth.check(request.headers.get("Authorization"))
        except Unauthenticated as refusal:  # 401: Knative does not redeliver it
            return _reply(401, error=f"unauthenticated: {refusal}")
        except Unavailable as error:
            return _reply(503, error=f"cannot authenticate the sender now: {error}")
    raw = request.stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        return _reply(413, error=f"body is larger than {MAX_BODY} bytes")
    try:
        event = from_http(dict(request.headers), raw)
    except (CloudEventError, ValueError) as error:
        return _reply(400, error=f"malformed CloudEvent: {error}")
    kind = event["type"]
    if kind == PING:
        outcome = placer.resync()
    elif kind in POD_EVENTS:
        try:
            pod = check_pod(event.data)
        except EventError as error:
            return _reply(400, kind, error=f"malformed {kind} event {event['id']}: {error}")
        outcome = placer.place_event(pod)
    else:
        log.debug("ignored event", extra={"event_id": event["id"], "event_type": kind})
        return _reply(200, kind, result="ignored", why=f"event type {kind!r} is not handled")
    return _reply(503 if outcome.get("retry") else 200, kind, **outcome)
