"""bind: places pods from ApiServerSource and PingSource CloudEvents. HTTP/CloudEvents/Kubernetes
<-> gpu_scheduler.binding, nothing else.

Run locally:  functions-framework --source functions/bind/main.py --target bind
Knative retries only on connection errors and 404/413/425/429/502/503/504, so: transient API
failures answer 503, permanent ones 200 with the reason in the body, malformed events 400.
"""
import json
import logging

import functions_framework
from cloudevents.http import from_http
from cloudevents.exceptions import GenericException as CloudEventError
from flask import Request

from gpu_scheduler.binding import PING, POD_EVENTS, EventError, bind_decision, check_pod
from placer import Placer

MAX_BODY = 3 * 1024 * 1024
log = logging.getLogger("bind")
placer = Placer.from_environment()  # config read once, at start; the client is reused


def _reply(status, **body):
    return json.dumps(body), status, {"Content-Type": "application/json"}


@functions_framework.http
def bind(request: Request):
    if request.path == "/health/liveness":
        return "ok\n", 200
    if request.path == "/health/readiness":
        return ("ok\n", 200) if placer.ready() else ("no Kubernetes API configuration\n", 503)
    if request.method != "POST":
        return _reply(405, error=f"{request.method} {request.path}: POST a CloudEvent")
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
            return _reply(400, error=f"malformed {kind} event {event['id']}: {error}")
        outcome = placer.place(bind_decision(pod))
    else:
        log.debug("ignored event %s of type %s", event["id"], kind)
        return _reply(200, result="ignored", why=f"event type {kind!r} is not handled")
    return _reply(503 if outcome.get("retry") else 200, **outcome)
